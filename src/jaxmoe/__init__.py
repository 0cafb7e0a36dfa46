"""jaxmoe: Mixture-of-Experts layers for JAX."""

from jaxmoe.ops.grouped_matmul import grouped_matmul

__version__ = "0.1.0"
__all__ = ["grouped_matmul"]

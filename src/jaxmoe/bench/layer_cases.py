"""The layer benchmark's cases: for one (implementation, pass) the callable that runs it once,
its sync and the outputs checked against the reference (:mod:`jaxmoe.bench.layer` times them).

Each case returns ``(call, sync, outputs)``: ``call()`` runs it once, ``sync(out)`` waits for a
result of ``call`` and ``outputs()`` gives what is checked. An implementation that cannot run
here raises :class:`SkipImpl` with the reason, which goes into its row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxmoe.bench import timing


def forward_backward(layer_fn: Callable, *, cotangent_from_output: bool = False) -> Callable:
    """The timed fwd+bwd pass of ``layer_fn(params, x, *constants) -> y``: ``(params, x, dy,
    *constants) -> (y, grad_params, grad_x)``, the forward and its VJP against the cotangent
    ``dy`` (``constants``, e.g. FP8 weights made once per step, are not differentiated).

    ``cotangent_from_output``: the cotangent is ``dy + y`` instead, so the backward waits for
    the forward's output, as where later layers read it (with ``dy`` alone XLA may run parts of
    the backward before the forward's last ops and fuse passes across the two)."""

    def fwd_bwd(params, x, dy, *constants):
        y, vjp = jax.vjp(lambda p, x: layer_fn(p, x, *constants), params, x)
        grad_params, grad_x = vjp(dy + y if cotangent_from_output else dy)
        return y, grad_params, grad_x

    return fwd_bwd


def jax_case(layer_fn: Callable, params, x, dy, pass_: str, constants: tuple = ()):
    """A JAX implementation's case: ``layer_fn(params, x, *constants)`` jitted, its forward or
    :func:`forward_backward` (``pass_`` ``"fwd"`` or ``"fwd+bwd"``)."""
    if pass_ == "fwd":
        fn = jax.jit(layer_fn)
        args = (params, x, *constants)

        def outputs():
            return {"y": fn(*args)}
    else:
        fn = jax.jit(forward_backward(layer_fn))
        args = (params, x, dy, *constants)

        def outputs():
            y, _, grad_x = fn(*args)
            return {"y": y, "dx": grad_x}

    def call():
        return fn(*args)

    return call, timing.jax_sync, outputs


def torch_case(params, x, dy, top_k: int, dtype, pass_: str, impl: str = "torch"):
    """A PyTorch peer's case: ``impl`` ``"torch"`` (the plain layer) or ``"torchtitan"``."""
    # Optional and slow to import: only when torch is benchmarked (torch_layer needs torch).
    import torch

    from jaxmoe.bench.torch_layer import TorchMoELayer, grouped_mm_available, to_torch_input

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch_dtype = torch.bfloat16 if jnp.dtype(dtype) == jnp.bfloat16 else torch.float32
    if impl == "torchtitan":
        from jaxmoe.bench import torchtitan_layer

        if torch_dtype != torch.bfloat16:
            raise SkipImpl(
                "torchtitan's GroupedExperts computes in bf16 whatever the dtype: no fp32"
            )
        why = torchtitan_layer.unavailable_reason(device)
        if why:
            raise SkipImpl(why)
        layer = torchtitan_layer.TorchTitanMoELayer(jax.device_get(params), top_k, device)
    else:
        ok, why = grouped_mm_available(device)
        if not ok:
            raise SkipImpl(why)
        layer = TorchMoELayer(jax.device_get(params), top_k, torch_dtype, device)
    tx = to_torch_input(jax.device_get(x), torch_dtype, device)
    tdy = to_torch_input(jax.device_get(dy), torch_dtype, device)
    weights = list(layer.parameters())
    if pass_ == "fwd":

        def fn():
            with torch.no_grad():
                return layer(tx)

        def outputs():
            return {"y": fn().float().cpu().numpy()}
    else:
        tx.requires_grad_(True)

        def fn():
            y = layer(tx)
            grads = torch.autograd.grad(y, [tx, *weights], tdy)
            return y, grads

        def outputs():
            y, grads = fn()
            return {"y": y.detach().float().cpu().numpy(), "dx": grads[0].float().cpu().numpy()}

    return fn, timing.torch_sync if device == "cuda" else _torch_cpu_sync, outputs


def _torch_cpu_sync(_: Any) -> None:
    """torch on CPU runs synchronously: a call's result is ready when it returns."""


class SkipImpl(Exception):
    """An implementation that cannot run here (the reason goes into the row)."""


def measure_dense_peak(dtype, size: int | None = None) -> dict[str, float]:
    """TFLOP/s of one square ``jnp.dot`` (8192 on accelerators, 1024 on CPU) in ``dtype``."""
    if size is None:
        size = 1024 if jax.default_backend() == "cpu" else 8192
    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (size, size), jnp.float32).astype(dtype)
    b = jax.random.normal(kb, (size, size), jnp.float32).astype(dtype)
    ms = timing.time_jax(jax.jit(jnp.dot), a, b).median_ms
    return {"size": size, "ms": ms, "tflops": 2 * size**3 / ms / 1e9}

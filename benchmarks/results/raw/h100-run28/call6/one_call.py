import sys

import jax.numpy as jnp

from jaxmoe.bench.gemm import group_sizes_for
from jaxmoe.bench.gemm_cases import jax_case, torch_case
from jaxmoe.bench.presets import GEMM_SHAPES

shape = GEMM_SHAPES["mixtral-down"]
sizes = group_sizes_for(shape, "balanced")
if sys.argv[1] == "torch":
    fn, args, _, sync = torch_case(shape, sizes, "fwd", "bfloat16", 0)
else:
    fn, args, _, sync = jax_case("jaxmoe", None, shape, sizes, "fwd", jnp.bfloat16, 0)
for _ in range(3):
    sync(fn(*args))

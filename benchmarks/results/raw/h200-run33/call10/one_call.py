import jax, jax.numpy as jnp
from jaxmoe.ops.grouped_matmul import pallas_mosaic
m, h, f = 8704, 4096, 14336
sizes = jnp.asarray([1088, 960, 1088, 1088, 1024, 1024, 1088, 1088], jnp.int32)
k = jax.random.split(jax.random.key(0), 2)
dy = jax.random.normal(k[0], (m, h), jnp.bfloat16)
w = (jax.random.normal(k[1], (8, f, h)) / 64).astype(jnp.bfloat16)
fn = jax.jit(lambda *a: pallas_mosaic.gmm(*a, transpose_rhs=True))
for _ in range(3):
    jax.block_until_ready(fn(dy, w, sizes))
print("ok")

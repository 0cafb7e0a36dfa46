import jax, jax.numpy as jnp
from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as gated
m, h, f = 8704, 4096, 14336
sizes = jnp.asarray([1088, 960, 1088, 1088, 1024, 1024, 1088, 1088], jnp.int32)
k = jax.random.split(jax.random.key(0), 3)
x = jax.random.normal(k[0], (m, h), jnp.bfloat16)
wg = (jax.random.normal(k[1], (8, h, f)) / 64).astype(jnp.bfloat16)
wu = (jax.random.normal(k[2], (8, h, f)) / 64).astype(jnp.bfloat16)
fn = jax.jit(lambda *a: gated.fused_gmm(*a, activation="swiglu", residuals=True))
for _ in range(3):
    jax.block_until_ready(fn(x, wg, wu, sizes))
print("ok")

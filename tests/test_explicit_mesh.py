"""The sharded layer accepts jax.make_mesh's default mesh (Explicit axes on recent jax)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

import jaxmoe

RTOL = 1e-5


def test_explicit_axes_mesh_matches_single_device():
    cfg = jaxmoe.MoEConfig(8, 2, 16, 32, aux_loss_coef=1e-2)
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (8, 4, 16))
    mesh = jax.make_mesh((2, 4), ("fsdp", "ep"))
    sharded_cfg = dataclasses.replace(cfg, ep_axis="ep", data_axes=("fsdp",))

    def loss(params, x, cfg, mesh):
        y, stats = jaxmoe.moe(params, x, cfg, mesh=mesh)
        return jnp.sum(y**2) + stats.aux_loss

    grad = jax.jit(jax.value_and_grad(loss, (0, 1)), static_argnums=(2, 3))
    want = grad(params, x, cfg, None)
    got = grad(params, x, sharded_cfg, mesh)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        assert np.linalg.norm(a - b) <= RTOL * np.linalg.norm(b)

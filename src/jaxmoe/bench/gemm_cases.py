"""The grouped-matmul benchmark's cases: inputs, the float32 per-group reference, and one
checked, timeable call per implementation (jaxmoe's backends and jax's Mosaic GPU kernels through
``grouped_matmul``; ``torch._grouped_mm``).

Each case returns ``(fn, args, check, sync)``: ``check()`` runs ``fn`` once and returns the
largest relative error of its outputs (and gradients) against the reference; ``sync(out)`` waits
for a result of ``fn`` (:mod:`jaxmoe.bench.timing` times with it).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxmoe.bench.harness import relative_error
from jaxmoe.bench.presets import GemmShape
from jaxmoe.bench.timing import jax_sync, torch_sync
from jaxmoe.ops.grouped_matmul import api
from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend


def jax_inputs(shape: GemmShape, dtype, seed: int):
    """``x [M, K]``, ``w [G, K, N]`` (scaled by 1/sqrt(K)) and a cotangent ``dy [M, N]``."""
    kx, kw, kd = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, (shape.m, shape.k), jnp.float32).astype(dtype)
    w = (jax.random.normal(kw, (shape.groups, shape.k, shape.n)) / math.sqrt(shape.k)).astype(dtype)
    dy = jax.random.normal(kd, (shape.m, shape.n), jnp.float32).astype(dtype)
    return x, w, dy


def jax_reference(x, w, dy, sizes: np.ndarray):
    """Per-group dense products in float32 (group sizes static), plus zero rows past the end."""
    return _jax_reference_fn(tuple(int(s) for s in sizes))(x, w, dy)


@functools.lru_cache(maxsize=8)
def _jax_reference_fn(sizes: tuple[int, ...]):
    """Float32 per-group products as one batched einsum over groups padded to the largest.

    Group sizes are static here, so the padding is numpy index arithmetic; padded rows are zeros
    and add nothing to ``dw``. (One small dot per group compiled for minutes with 128 groups.)
    """
    sizes_np = np.asarray(sizes, dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(sizes_np)])
    num_groups, longest = len(sizes), max(1, int(sizes_np.max(initial=0)))
    position = np.arange(longest)
    padded_row = bounds[:-1, None] + position[None, :]  # [G, longest] source row
    padded_valid = position[None, :] < sizes_np[:, None]
    padded_row = np.where(padded_valid, padded_row, 0)

    @jax.jit
    def ref(x, w, dy):
        f32 = jnp.float32
        total = x.shape[0]
        # Each real row's (group, position) in the padded layout; tail rows read a zero.
        row_group = np.searchsorted(bounds[1:], np.arange(total), side="right")
        real = row_group < num_groups
        row_group = np.minimum(row_group, num_groups - 1)
        row_position = np.where(real, np.arange(total) - bounds[row_group], 0)

        def pad(a):
            return jnp.where(padded_valid[..., None], a[padded_row].astype(f32), 0.0)

        x_pad, dy_pad, w32 = pad(x), pad(dy), w.astype(f32)
        hi = jax.lax.Precision.HIGHEST
        out = jnp.einsum("gmk,gkn->gmn", x_pad, w32, precision=hi)
        dx = jnp.einsum("gmn,gkn->gmk", dy_pad, w32, precision=hi)
        dw = jnp.einsum("gmk,gmn->gkn", x_pad, dy_pad, precision=hi)

        def unpad(a):
            return jnp.where(real[:, None], a[row_group, row_position], 0.0)

        return unpad(out), unpad(dx), dw

    return ref


@functools.cache
def jax_fn(backend, pass_: str):
    """One jitted function per (backend, pass): group sizes are traced, so routings share it."""
    if pass_ == "fwd":
        return jax.jit(lambda x, w, gs: api.grouped_matmul(x, w, gs, backend=backend))

    def fwd_bwd(x, w, gs, dy):
        out, vjp = jax.vjp(lambda a, b: api.grouped_matmul(a, b, gs, backend=backend), x, w)
        dx, dw = vjp(dy)
        return out, dx, dw

    return jax.jit(fwd_bwd)


def jax_case(impl: str, backend, shape: GemmShape, sizes: np.ndarray, pass_: str, dtype, seed):
    """The case of a JAX impl (``backend`` overrides the one ``jaxmoe`` uses)."""
    if impl == "jaxmoe":
        backend = backend or "auto"
    elif impl == "jaxmoe_pallas":
        backend = "pallas"
    elif impl == "jaxmoe_triton":
        backend = "pallas_triton"
    elif impl == "xla_ragged_dot":
        backend = "xla"
    elif impl == "jax_mosaic":
        backend = jax_mosaic_peer()
    else:
        raise ValueError(f"not a jax impl: {impl}")

    x, w, dy = jax_inputs(shape, dtype, seed)
    gs = jnp.asarray(sizes)
    fn = jax_fn(backend, pass_)
    args = (x, w, gs) if pass_ == "fwd" else (x, w, gs, dy)

    def check() -> float:
        got = fn(*args)
        ref = jax_reference(x, w, dy, sizes)
        if pass_ == "fwd":
            return relative_error(got.astype(jnp.float32), ref[0])
        return max(relative_error(a.astype(jnp.float32), b) for a, b in zip(got, ref, strict=True))

    return fn, args, check, jax_sync


def jax_mosaic_peer():
    """A peer, not a jaxmoe backend: the Hopper Mosaic GPU kernels that ship with jax
    (``jax.experimental.pallas.ops.gpu.ragged_dot_mgpu`` / ``transposed_ragged_dot_mgpu``),
    wrapped in jaxmoe's backend interface so that the same primitives' rules drive them. Fixed tiles
    (128x128x64, 4 stages); measured to see what Mosaic GPU reaches on these shapes."""
    # Imported here, not at the top: these modules are GPU-only (Mosaic GPU).
    from jax.experimental.pallas.ops.gpu import ragged_dot_mgpu, transposed_ragged_dot_mgpu

    def grid_block_n(n, block_n):
        tiles = n // block_n
        return 2 if tiles % 2 == 0 else 1

    @dataclasses.dataclass(frozen=True)
    class JaxMosaicPeer(GroupedMatmulBackend):
        name: str = dataclasses.field(default="jax_mosaic", init=False)

        def gmm(self, lhs, rhs, group_sizes, *, transpose_rhs, out_dtype):
            n = rhs.shape[1] if transpose_rhs else rhs.shape[2]
            out = ragged_dot_mgpu.ragged_dot(
                lhs,
                rhs,
                group_sizes=group_sizes,
                block_m=128,
                block_n=128,
                block_k=64,
                max_concurrent_steps=4,
                grid_block_n=grid_block_n(n, 128),
                transpose_rhs=transpose_rhs,
            )
            return out.astype(out_dtype)

        def tgmm(self, lhs, rhs, group_sizes, *, out_dtype):
            out = transposed_ragged_dot_mgpu.transposed_ragged_dot(
                lhs,
                rhs,
                group_sizes=group_sizes,
                block_m=128,
                block_n=128,
                block_k=64,
                max_concurrent_steps=4,
                grid_block_n=grid_block_n(rhs.shape[1], 128),
            )
            return out.astype(out_dtype)

    return JaxMosaicPeer()


# --------------------------------------------------------------------------------------------------
# torch case.
# --------------------------------------------------------------------------------------------------


def torch_case(shape: GemmShape, sizes: np.ndarray, pass_: str, dtype_name: str, seed: int):
    """The ``torch._grouped_mm`` case on CUDA."""
    import torch  # optional and slow to import: only when torch is benchmarked

    torch.manual_seed(seed)
    dtype = getattr(torch, dtype_name)
    dev = "cuda"
    x = torch.randn(shape.m, shape.k, device=dev, dtype=dtype)
    # w laid out [G, K, N] as the transpose of a [G, N, K] tensor (torch's fast layout).
    w_nk = (torch.randn(shape.groups, shape.n, shape.k, device=dev) / math.sqrt(shape.k)).to(dtype)
    dy = torch.randn(shape.m, shape.n, device=dev, dtype=dtype)
    offs = torch.as_tensor(np.cumsum(sizes), dtype=torch.int32, device=dev)

    if pass_ == "fwd":

        def fn():
            return torch._grouped_mm(x, w_nk.transpose(-2, -1), offs=offs)
    else:
        x.requires_grad_(True)
        w_nk.requires_grad_(True)

        def fn():
            out = torch._grouped_mm(x, w_nk.transpose(-2, -1), offs=offs)
            dx, dw_nk = torch.autograd.grad(out, (x, w_nk), dy)
            return out, dx, dw_nk

    def check() -> float:
        got = fn()
        bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
        with torch.no_grad():
            xf, wf, dyf = x.float(), w_nk.float().transpose(-2, -1), dy.float()
            ref_out = torch.cat(
                [
                    xf[s:e] @ wf[g]
                    for g, (s, e) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
                ]
            )

            def err(a, b):
                return relative_error(a.float().cpu().numpy(), b.cpu().numpy())

            if pass_ == "fwd":
                return err(got, ref_out)
            out, dx, dw_nk = got
            ref_dx = torch.cat(
                [
                    dyf[s:e] @ wf[g].T
                    for g, (s, e) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
                ]
            )
            ref_dw = torch.stack(
                [(xf[s:e].T @ dyf[s:e]).T for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
            )  # [G, N, K] like dw_nk
            return max(err(out, ref_out), err(dx, ref_dx), err(dw_nk, ref_dw))

    return fn, (), check, torch_sync


def torch_unavailable() -> str | None:
    """Why torch cannot be benchmarked here (None when it can)."""
    try:
        import torch  # optional and slow to import: only when torch is asked for
    except ImportError as error:
        return f"torch is not installed ({error})"
    if not torch.cuda.is_available():
        return "torch has no CUDA device here"
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    return None

"""The fused Mosaic GPU gated kernel against the float64 NumPy reference, forward and VJP.

On a CPU the kernel runs in Mosaic GPU's interpreter (seconds a call), so shapes are the
smallest with two M tiles, two N tiles and two K steps per tile; the derivative's grouped
matmuls run on the reference backend (only the forward is the kernel's). On a Hopper GPU the
layer runs it by default: ``tests/gpu/test_layer_edge_cases.py`` checks it there on odd shapes
and routings, and ``jaxmoe bench layer`` at the benchmark shapes (every row checked first).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from op_test_base import Backend
from test_gated_grouped_matmul import GatedGroupedMatmulOp, _np_act
from test_grouped_matmul import np_gmm, random_inputs

from jaxmoe.ops.gated_grouped_matmul import gated_grouped_matmul
from jaxmoe.ops.gated_grouped_matmul import pallas_mosaic as fused_mosaic
from jaxmoe.ops.gated_grouped_matmul.pallas_mosaic import PallasMosaicGatedGroupedMatmul
from jaxmoe.ops.grouped_matmul import ReferenceGroupedMatmul
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig, check_tiles

M, K, F = 128, 128, 256
SMALL = MosaicTileConfig(block_m=64, block_n=128, block_k=64, stages=2, group_swizzle=2)
# One pipeline across a CTA's tiles (K / block_k = 2 steps, a multiple of the 2 stages) with
# the swizzled epilogue: two chunks per slab, three results stored in turn, the slots
# alternating across them.
CHAINED_SWIZZLED = MosaicTileConfig(
    64, 256, 64, stages=2, group_swizzle=2, pipelined_tiles=True, swizzled_epilogue=True
)
# Two weights per step on the hand-written ring (three TMA copies per slot).
RING = MosaicTileConfig(64, 128, 64, stages=3, group_swizzle=2, ring=True)
SPLIT_ROWS = MosaicTileConfig(
    128, 128, 64, stages=3, group_swizzle=2, epilogue_rows=64, ring=True, split_rows=True
)
KERNEL = PallasMosaicGatedGroupedMatmul(grouped=ReferenceGroupedMatmul(), tiles=SMALL)
TOL = {"bfloat16": 1.6e-2, "float16": 2e-3}


def _inputs(group_sizes, dtype="bfloat16", seed=0):
    lhs, gate_w, _ = random_inputs(M, K, F, len(group_sizes), dtype, seed)
    _, up_w, cotangent = random_inputs(M, K, F, len(group_sizes), dtype, seed + 1)
    return lhs, gate_w, up_w, cotangent


def _relative(got, want):
    got = np.asarray(jnp.asarray(got, jnp.float32), np.float64)
    return float(np.max(np.abs(got - want))) / max(float(np.max(np.abs(want))), 1e-6)


# Removed cases and what covers them now: SMALL (jax's pipeline per tile) in bf16: the VJP
# tests' kernel (KERNEL), on an empty group, a cut tile and tail; float16 (was on SMALL) and
# the chained pipeline (was CHAINED, unswizzled): CHAINED_SWIZZLED; SWIZZLED (the same
# epilogue on jax's pipeline per tile): CHAINED_SWIZZLED; SPLIT_ROWS alone (geglu) and with
# group_start_tiles: the multicast case, which is both in clusters.
@pytest.mark.parametrize(
    "activation, dtype, cfg",
    [
        # The activations' approx_math forms here (sigmoid from exp2 and rsqrt; exact on a CPU),
        # the exact ones in the multicast case.
        ("geglu", "float16", dataclasses.replace(CHAINED_SWIZZLED, approx_math=True)),
        # The ring with 64-row tiles (the ring's unswizzled store: SPLIT_ROWS below).
        ("swiglu", "bfloat16", dataclasses.replace(RING, swizzled_epilogue=True, approx_math=True)),
        # The default's layout: the compute warpgroups split 128-row tiles (a boundary in
        # each warpgroup's half), tiles from each group's first row (rows off the grid, the last
        # tiles moved back), in clusters of two CTAs, both weights' blocks multicast where a
        # pair shares a group.
        (
            "swiglu",
            "bfloat16",
            dataclasses.replace(SPLIT_ROWS, group_start_tiles=True, multicast_weights=True),
        ),
    ],
)
def test_forward_empty_groups_straddling_tiles_and_tail(activation, dtype, cfg):
    # Groups end at rows 50, 50, 53, 100: an empty group, a 3-row group inside a tile, a boundary
    # inside each tile, and 28 tail rows that must be zero in all three outputs.
    sizes = [50, 0, 3, 47]
    lhs, gate_w, up_w, _ = _inputs(sizes, dtype)
    hidden, gate, up = fused_mosaic.fused_gmm(
        lhs,
        gate_w,
        up_w,
        jnp.array(sizes, jnp.int32),
        activation=activation,
        residuals=True,
        tiles=cfg,
    )
    want_gate, want_up = np_gmm(lhs, gate_w, sizes), np_gmm(lhs, up_w, sizes)
    assert _relative(gate, want_gate) <= TOL[dtype] and _relative(up, want_up) <= TOL[dtype]
    assert _relative(hidden, _np_act(want_gate, activation) * want_up) <= TOL[dtype]
    for out in (hidden, gate, up):
        assert out.dtype == jnp.dtype(dtype) and np.all(np.asarray(out[100:]) == 0)


class TestGatedMosaicBackends(GatedGroupedMatmulOp):
    """The fused kernel (jax's pipeline per tile, SMALL) through the op's VJP against float64:
    with the residuals written by the kernel (one group holding every row too) and recomputed.
    The derivative's grouped matmuls run on the reference backend (only the forward is the
    kernel's); geglu's forward in the kernel: test_forward_empty_groups_straddling_tiles_and_tail.
    """

    BACKENDS = {
        # Eager: a jitted trace would cache the kernel's launch, which a test below patches.
        "residuals_from_kernel": Backend(
            (KERNEL, "swiglu"), (M, K, F), ("bfloat16",), cases=("single_group",), jit=False
        ),
        "recomputed_residuals": Backend(
            (dataclasses.replace(KERNEL, residuals_from_kernel=False), "swiglu"),
            (M, K, F),
            ("bfloat16",),
            cases=(),
            jit=False,
        ),
    }

    def group_sizes(self, case, m):
        return {"empty_and_tail": [70, 0, 30], "single_group": [0, M, 0]}[case]


def test_by_default_the_kernel_writes_the_residuals_under_differentiation(monkeypatch):
    # Measured on an H100 (docs/kernels.md, 'Fused gated kernel'): under differentiation the
    # fused kernel writes h, gate and up (no separate projections); undifferentiated, h alone.
    # Traced, not run: the kernel's arguments are fixed when the program is built (its results:
    # the VJP test above).
    assert PallasMosaicGatedGroupedMatmul().residuals_from_kernel
    sizes = [70, 0, 30]
    lhs, gate_w, up_w, _ = _inputs(sizes, seed=6)
    gs = jnp.array(sizes, jnp.int32)
    asked = []
    kernel_fn = fused_mosaic.launch_fused_gmm
    monkeypatch.setattr(
        fused_mosaic,
        "launch_fused_gmm",
        lambda *a, **k: asked.append(k["residuals"]) or kernel_fn(*a, **k),
    )
    fused = functools.partial(gated_grouped_matmul, activation="swiglu", backend=KERNEL)
    jax.make_jaxpr(lambda *w: jax.vjp(lambda *w: fused(*w, gs), *w)[0])(lhs, gate_w, up_w)
    assert asked and all(asked), asked
    asked.clear()
    jax.make_jaxpr(lambda *w: fused(*w, gs))(lhs, gate_w, up_w)
    assert asked and not any(asked), asked


# The exact math changes only the activation's instructions, the same in every layout and
# with or without the residuals: one lowering (each costs about a second), not four.
@pytest.mark.parametrize(
    "k, residuals, changes",
    [
        pytest.param(k, residuals, changes, id=f"{k_id}-{residuals}-{name}")
        for k, k_id in ((2048, "plain"), (512, "chained"))
        for residuals in (False, True)
        for name, changes in (
            ("default", {}),
            ("swizzled", {"swizzled_epilogue": True}),
            ("exact", {"approx_math": False}),
        )
        if name != "exact" or (k, residuals) == (2048, True)
    ],
)
def test_default_tiles_lower_for_cuda(residuals, k, changes):
    # No GPU needed: the two-accumulator kernel passes Mosaic GPU's lowering with the default
    # tiles (a 4-deep ring; at K = 512 one pipeline across a CTA's tiles). Their activation is
    # on PTX's approximate instructions (approx_math), the exact math's is not.
    fn = jax.jit(
        functools.partial(
            fused_mosaic.fused_gmm,
            activation="geglu",
            residuals=residuals,
            interpret=False,
            tiles=dataclasses.replace(fused_mosaic.default_gated_tiles(256, k, 512), **changes),
        )
    )
    text = (
        fn.trace(
            jax.ShapeDtypeStruct((256, k), jnp.bfloat16),
            jax.ShapeDtypeStruct((4, k, 512), jnp.bfloat16),
            jax.ShapeDtypeStruct((4, k, 512), jnp.bfloat16),
            jax.ShapeDtypeStruct((4,), jnp.int32),
        )
        .lower(lowering_platforms=("cuda",))
        .as_text()
    )
    assert "mosaic_gpu" in text
    approx = changes.get("approx_math", True)
    assert ("ex2.approx" in text and "rsqrt.approx" in text) == approx


def test_default_tiles_take_block_n_128_and_fit():
    cfg = fused_mosaic.default_gated_tiles(16384, 4096, 14336)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.stages) == (128, 128, 64, 4)
    assert cfg.ring and cfg.split_rows  # measured the fastest (run 16)
    assert cfg.group_start_tiles  # as the plain gmm's default (run 18)
    assert cfg.approx_math  # the activation on approximate instructions (run 30)
    check_tiles(cfg, num_rhs=2)


@pytest.mark.parametrize(
    "shape, dtype, why",
    [((128, 64, 128), "float32", "bf16/fp16"), ((128, 64, 96), "bfloat16", "block_n")],
)
def test_unsupported_operands_raise_not_implemented(shape, dtype, why):
    m, k, n = shape
    lhs, rhs, _ = random_inputs(m, k, n, 2, dtype)
    with pytest.raises(NotImplementedError, match=why):
        fused_mosaic.fused_gmm(
            lhs, rhs, rhs, jnp.array([64, 64], jnp.int32), activation="swiglu", tiles=SMALL
        )


def test_ring_with_swizzled_epilogue_is_accepted_for_two_weights():
    # Once refused (wrong rows on an H100 with skewed groups): the cause was the aliased
    # epilogue buffers' layout at block_n 128 (test_grouped_matmul_mosaic's
    # test_each_warpgroup_slab_lies_on_its_own_swizzled_slots), now padded.
    both = dataclasses.replace(RING, swizzled_epilogue=True)
    PallasMosaicGatedGroupedMatmul(tiles=both)
    check_tiles(both, num_rhs=2)


def test_the_backend_plans_each_signature_once(monkeypatch):
    # The op asks the backend whether it runs the operands, then the backend runs them: one
    # plan serves both (traced only: eval_shape runs no kernel).
    calls = []

    def counting_plan(*args, **kwargs):
        calls.append(args)
        return plan_fused_gmm(*args, **kwargs)

    plan_fused_gmm = fused_mosaic.plan_fused_gmm
    monkeypatch.setattr(fused_mosaic, "plan_fused_gmm", counting_plan)
    lhs, gate_w, up_w, _ = _inputs([40, 0, 60, 28])
    sizes = jnp.array([40, 0, 60, 28], jnp.int32)
    kernel = PallasMosaicGatedGroupedMatmul(grouped=ReferenceGroupedMatmul(), tiles=RING)
    op = functools.partial(gated_grouped_matmul, activation="swiglu", backend=kernel)
    for _ in range(2):
        jax.eval_shape(op, lhs, gate_w, up_w, sizes)
    assert len(calls) == 1

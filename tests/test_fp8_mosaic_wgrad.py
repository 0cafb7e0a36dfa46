"""The FP8 Mosaic GPU wgrad (``jaxmoe.ops.fp8.pallas_mosaic_wgrad.scaled_tgmm``) on CPU.

On a CPU the kernel runs in Mosaic GPU's interpreter, which multiplies float8 operands (as
float32 products, exactly) but has no transposed ``wgmma`` operand: there the output gradient
goes in ``[Mp, N]`` (transposed back before the kernel) and the same body (tile order, ring,
empty-group path, scale epilogue) runs. The K-major B operand FP8 ``wgmma`` needs on the GPU is
proven by lowering for CUDA here.

Bound: the kernel's float32 result (FP8 products are exact in float32; the sum and the two scale
multiplies round, far below bf16's precision at these sizes) is cast to bf16, so each element is
within one bf16 ulp (``2**-8`` relative) of the float64 computation of the contract.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxmoe.cli.main import main as jaxmoe_main
from jaxmoe.ops.fp8 import pallas_mosaic_wgrad as wgrad
from jaxmoe.ops.mosaic import tgmm_ring
from jaxmoe.ops.mosaic import tiles as pallas_mosaic_tiles

K, N = 256, 256
# Two K tiles, two N tiles (warpgroups of 64 columns), several steps per group, more tiles than
# the two simulated SMs; and 64-row K tiles.
SMALL = wgrad.Fp8TgmmTileConfig(block_k=128, block_n=128, stages=2, group_swizzle=2)
BK64 = wgrad.Fp8TgmmTileConfig(block_k=64, block_n=128, stages=2, group_swizzle=2)
A = wgrad.ALIGN


def padded_operands(sizes, k=K, n=N, seed=0, extra_blocks=0):
    """The caller's layout: group ``g`` at a 128-aligned column ``start_g``, zeros after its
    tokens up to the next multiple of 128 (and in ``extra_blocks`` unused blocks at the end)."""
    rng = np.random.default_rng(seed)
    blocks = [-(-size // A) for size in sizes]
    starts = (np.cumsum([0] + blocks)[:-1] * A).astype(np.int64)
    mp = max((sum(blocks) + extra_blocks) * A, A)
    lhs_t, rhs_t = np.zeros((k, mp), np.float32), np.zeros((n, mp), np.float32)
    for start, size in zip(starts, sizes, strict=True):
        lhs_t[:, start : start + size] = rng.standard_normal((k, size)) * 4
        rhs_t[:, start : start + size] = rng.standard_normal((n, size)) * 4
    g = len(sizes)
    return (
        jnp.asarray(lhs_t).astype(jnp.float8_e4m3fn),
        jnp.asarray(np.exp(rng.uniform(-3, 3, (g, k))), jnp.float32),
        jnp.asarray(rhs_t).astype(jnp.float8_e4m3fn),
        jnp.asarray(np.exp(rng.uniform(-3, 3, (g, n))), jnp.float32),
        jnp.asarray(starts, jnp.int32),
        jnp.asarray(sizes, jnp.int32),
    )


def reference64(lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, starts, sizes, absolute=False):
    """The contract in float64 (``absolute``: of the operands' magnitudes)."""
    lhs_t, rhs_t = (np.asarray(x.astype(jnp.float32), np.float64) for x in (lhs_t_q, rhs_t_q))
    if absolute:
        lhs_t, rhs_t = np.abs(lhs_t), np.abs(rhs_t)
    lhs_scale, rhs_scale = (np.asarray(x, np.float64) for x in (lhs_scale, rhs_scale))
    out = np.zeros((len(sizes), lhs_t.shape[0], rhs_t.shape[0]))
    for g, (start, size) in enumerate(zip(np.asarray(starts), np.asarray(sizes), strict=True)):
        cols = slice(start, start + size)
        out[g] = (lhs_t[:, cols] @ rhs_t[:, cols].T) * lhs_scale[g][:, None] * rhs_scale[g][None]
    return out


def check_within_one_bf16_ulp(got, want, slack=1e-30):
    """``slack``: an absolute allowance (fp16's subnormal spacing for an fp16 result)."""
    got = np.asarray(jnp.asarray(got).astype(jnp.float32), np.float64)
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= 2.0**-8 * np.abs(want) + slack), (
        f"max relative error {np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30)):.3g}"
    )


def run_and_check(sizes, tiles=SMALL, **kwargs):
    operands = padded_operands(sizes, **kwargs)
    got = wgrad.scaled_tgmm(*operands, tiles=tiles)
    assert got.dtype == jnp.bfloat16
    # One bf16 rounding, plus float32 rounding of the sum where it cancels far below its terms
    # (sizes [259, 0, 0] once gave 4.2e-3 against 2**-8 on an element near zero).
    magnitude = reference64(*operands, absolute=True)
    check_within_one_bf16_ulp(got, reference64(*operands), slack=2.0**-20 * magnitude)
    for g, size in enumerate(sizes):
        if size == 0:
            assert np.all(np.asarray(got[g]) == 0)
    return got


# Each interpreted kernel call costs ~5-10 s on CPU, so one call covers every edge of the group
# sizes: empty groups first, in the middle and last (the former "all_tokens_in_one" and
# test_random_group_sizes' [259, 0, 0]), one token, 127 / 256 / 259 tokens (under, on and past
# a 128-column block), skewed; unused zero blocks past the last group; and the empty groups'
# Inf and NaN scales, which must stay out (the former test_empty_group_is_zero_whatever_its_
# scales). Balanced groups: test_random_group_sizes and test_fp16_result_and_groups_in_any_
# column_order (SMALL, 128-wide N tiles).
EDGE_SIZES = [0, 259, 0, 1, 256, 127, 0]


@pytest.mark.parametrize(
    "tiles",
    [BK64, dataclasses.replace(SMALL, block_n=256, stages=3)],
    ids=["bk64", "bn256_stages3"],
)
def test_matches_the_contract_with_empty_groups_of_any_scale(tiles):
    # 64-row K tiles (four per group, a whole-slab epilogue); 256-wide N tiles (one per group,
    # 128 columns a warpgroup) with a 3-deep ring and a half-slab epilogue.
    sizes = EDGE_SIZES
    lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, starts, group_sizes = padded_operands(
        sizes, extra_blocks=2
    )
    # An empty group takes no step and is stored unscaled: an Inf or NaN scale stays out.
    lhs_scale = lhs_scale.at[0].set(jnp.inf).at[6].set(jnp.nan)
    rhs_scale = rhs_scale.at[2].set(jnp.nan).at[6].set(jnp.inf)
    operands = (lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, starts, group_sizes)
    got = wgrad.scaled_tgmm(*operands, tiles=tiles)
    assert got.dtype == jnp.bfloat16
    got = np.asarray(got.astype(jnp.float32))
    empty = [g for g, size in enumerate(sizes) if size == 0]
    assert np.all(got[empty] == 0)
    live = [g for g, size in enumerate(sizes) if size]
    with np.errstate(invalid="ignore"):  # the reference's 0 * Inf of the empty groups: not used
        want, magnitude = reference64(*operands), reference64(*operands, absolute=True)
    # One bf16 rounding, plus float32 rounding of the sum where it cancels far below its terms
    # (sizes [259, 0, 0] once gave 4.2e-3 against 2**-8 on an element near zero).
    check_within_one_bf16_ulp(got[live], want[live], slack=2.0**-20 * magnitude[live])


def test_all_groups_empty_and_no_groups():
    run_and_check([0, 0, 0])
    got = wgrad.scaled_tgmm(*padded_operands([]), tiles=SMALL)
    assert got.shape == (0, K, N)


def test_fp16_result_and_groups_in_any_column_order():
    # The caller may place the groups in any column order: here group 1's block first.
    lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, _, sizes = padded_operands([200, 100, 60])
    # Columns [g0: 0-256, g1: 256-384, g2: 384-512] become [g1: 0-128, g0: 128-384, g2: 384-512].
    order = np.r_[256:384, 0:256, 384:512]
    lhs_t_q, rhs_t_q = lhs_t_q[:, order], rhs_t_q[:, order]
    lhs_scale = lhs_scale * 2.0**-8  # within fp16's range
    operands = (
        lhs_t_q,
        lhs_scale,
        rhs_t_q,
        rhs_scale,
        jnp.asarray([128, 0, 384], jnp.int32),
        sizes,
    )
    got = wgrad.scaled_tgmm(*operands, tiles=SMALL, out_dtype=jnp.float16)
    assert got.dtype == jnp.float16
    check_within_one_bf16_ulp(got, reference64(*operands), slack=2.0**-24)


# [259, 0, 0], once an explicit example here: in EDGE_SIZES.
@settings(max_examples=2, deadline=None, derandomize=True)
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=5))
def test_random_group_sizes(sizes):
    run_and_check(sizes, seed=len(sizes))


HALF_SLAB = wgrad.Fp8TgmmTileConfig(stages=4, epilogue_rows=64)  # result stored in two halves


@pytest.mark.parametrize("tiles", [None, BK64, HALF_SLAB], ids=["default", "bk64", "half_slab"])
def test_lowers_for_cuda_with_k_major_operands(tiles):
    # No GPU needed: Mosaic GPU's lowering (run at .lower()) accepts both FP8 operands K-major
    # (the output gradient's block transposed in place), the ring, the empty-group path and the
    # scale loads of the epilogue. Mixtral up's wgrad: K = 4096, N = 14336, G = 8.
    k, n, g = 4096, 14336, 8
    mp = 16384 + g * A  # room for each group's padding
    fn = jax.jit(functools.partial(wgrad.scaled_tgmm, interpret=False, tiles=tiles))
    fp8 = jnp.float8_e4m3fn
    lowered = fn.trace(
        jax.ShapeDtypeStruct((k, mp), fp8),
        jax.ShapeDtypeStruct((g, k), jnp.float32),
        jax.ShapeDtypeStruct((n, mp), fp8),
        jax.ShapeDtypeStruct((g, n), jnp.float32),
        jax.ShapeDtypeStruct((g,), jnp.int32),
        jax.ShapeDtypeStruct((g,), jnp.int32),
    ).lower(lowering_platforms=("cuda",))
    assert "mosaic_gpu" in lowered.as_text()


def test_default_tiles_fit_shared_memory_with_the_deepest_ring():
    cfg = wgrad.default_fp8_tgmm_tiles(4096, 14336)
    assert (cfg.block_m, cfg.block_k, cfg.block_n, cfg.stages) == (128, 128, 256, 4)
    assert cfg == HALF_SLAB  # measured 1.07-1.19x the 3-slot whole slab (docs/kernels.md)
    # 4 * 128 * (128 + 256) bytes of FP8 ring + 64 * 256 * 2 bytes of epilogue stage.
    wgrad.check_fp8_tgmm_tiles(cfg)
    assert tgmm_ring.smem_bytes(cfg, operand_bytes=1) == 224 * 1024
    # A whole 128-row slab leaves room for three slots only.
    whole = dataclasses.replace(cfg, epilogue_rows=None)
    with pytest.raises(ValueError, match="shared memory"):
        wgrad.check_fp8_tgmm_tiles(whole)
    three = dataclasses.replace(whole, stages=3)
    wgrad.check_fp8_tgmm_tiles(three)
    assert tgmm_ring.smem_bytes(three, operand_bytes=1) == 208 * 1024


@pytest.mark.parametrize(
    "change, why",
    [
        ({"block_m": 64}, "block_m=64 must be 128"),
        ({"block_k": 256}, "block_k=256 must be 64 or 128"),
        ({"block_n": 64}, "block_n=64 must be 128 or 256"),
        ({"stages": 1}, "stages=1 must be >= 2"),
        ({"group_swizzle": 0}, "group_swizzle=0 must be >= 1"),
    ],
)
def test_check_refuses_tiles(change, why):
    with pytest.raises(ValueError, match=f"Fp8TgmmTileConfig: .*{why}"):
        wgrad.check_fp8_tgmm_tiles(dataclasses.replace(SMALL, **change))
    with pytest.raises(ValueError, match=why):
        wgrad.scaled_tgmm(*padded_operands([128]), tiles=dataclasses.replace(SMALL, **change))


FP8 = jnp.float8_e4m3fn
# (what to change, the words of the reason)
REFUSED = {
    "e5m2 lhs": ({"lhs_dtype": jnp.float8_e5m2}, "lhs_t_q is float8_e5m2, not float8_e4m3fn"),
    "bf16 rhs": ({"rhs_dtype": jnp.bfloat16}, "rhs_t_q is bfloat16, not float8_e4m3fn"),
    "f32 out": ({"out_dtype": jnp.float32}, "not a 2-byte type"),
    "mp": ({"mp": 200}, "M=200 is not a positive multiple of block_m=128"),
    "mp zero": ({"mp": 0}, "M=0 is not a positive multiple"),
    "k": ({"k": 192}, "K=192 is not a multiple of block_k=128"),
    "n": ({"n": 192}, "N=192 is not a multiple of block_n=128"),
}


def _reason(k=K, n=N, mp=512, lhs_dtype=FP8, rhs_dtype=FP8, out_dtype=jnp.bfloat16, **kw):
    return wgrad.unsupported_reason((k, mp), (n, mp), lhs_dtype, rhs_dtype, out_dtype, SMALL, **kw)


@pytest.mark.parametrize("change, why", list(REFUSED.values()), ids=list(REFUSED))
def test_unsupported_reason(change, why):
    assert _reason(interpret=True) is None
    assert why in _reason(interpret=True, **change)


def test_scaled_tgmm_raises_for_refused_operands_and_bad_shapes():
    lhs_t_q, lhs_scale, rhs_t_q, rhs_scale, starts, sizes = padded_operands([100, 20])
    with pytest.raises(NotImplementedError, match="not float8_e4m3fn"):
        wgrad.scaled_tgmm(
            lhs_t_q.astype(jnp.bfloat16), lhs_scale, rhs_t_q, rhs_scale, starts, sizes, tiles=SMALL
        )
    with pytest.raises(NotImplementedError, match="not a 2-byte type"):
        wgrad.scaled_tgmm(*padded_operands([100]), tiles=SMALL, out_dtype=jnp.float32)
    with pytest.raises(ValueError, match=r"lhs_scale \(2, 128\) is not \[G, K\]"):
        wgrad.scaled_tgmm(lhs_t_q, lhs_scale[:, :128], rhs_t_q, rhs_scale, starts, sizes)
    with pytest.raises(ValueError, match="differ in Mp"):
        wgrad.scaled_tgmm(lhs_t_q, lhs_scale, rhs_t_q[:, :128], rhs_scale, starts, sizes)


def test_a_gpu_other_than_hopper_is_refused(monkeypatch):
    monkeypatch.setattr(pallas_mosaic_tiles, "_compute_capability", lambda: "8.0")
    assert "compute capability 8.0" in _reason(interpret=False)


def test_probe_smoke_runs_in_the_interpreter(tmp_path):
    # `jaxmoe bench fp8-wgrad --smoke` (for an H100) on a tiny skewed problem with an empty group:
    # its padded layout, quantization and float32 reference agree with the kernel.
    probe = types.SimpleNamespace(main=fp8_wgrad_bench_with_out_dir)
    assert probe.main(["--smoke", "--routings", "skewed", "--out-dir", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "fp8-wgrad-probe.json").read_text())["rows"]
    assert [(r["impl"], r["ok"], r["empty_groups"]) for r in rows] == [("fp8_mosaic", True, 1)]
    assert rows[0]["rel_err"] < 3e-3
    assert (tmp_path / "fp8-wgrad-probe.md").exists()


def fp8_wgrad_bench_with_out_dir(argv):
    """``jaxmoe bench fp8-wgrad ARGV``, with ``--out-dir DIR`` standing for ``--out
    DIR/fp8-wgrad-probe.json`` (the flag the bench had as a script)."""
    argv = list(argv)
    at = argv.index("--out-dir")
    argv[at : at + 2] = ["--out", str(pathlib.Path(argv[at + 1]) / "fp8-wgrad-probe.json")]
    return jaxmoe_main(["bench", "fp8-wgrad", *argv])

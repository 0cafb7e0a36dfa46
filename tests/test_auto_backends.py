"""``auto`` picks only kernels that can run the shape, on every op it routes.

JAX's default backend is faked to be a GPU (the one decision every ``auto`` rule and every
kernel's interpret default reads), so each op takes the GPU's choices on this CPU host; the
program is then lowered for CUDA, which runs the real Triton and Mosaic GPU lowerings (the
shape rules of Pallas' Triton backend, e.g. power-of-two arrays, are checked there, not only
against our own predicates). Odd sizes (1, 7, 96, 200, 1000, 1500, 2880) sit beside aligned
ones, so both sides of each rule are lowered. The lowered text says which kernel ran: Triton
custom calls carry the ``pallas_call`` name, Mosaic GPU kernels a ``mosaic_gpu`` call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import jaxmoe
from jaxmoe.ops import row_gather
from jaxmoe.ops.fp8 import Fp8Recipe, fp8_grouped_matmul
from jaxmoe.ops.fp8.pallas_mosaic import PallasMosaicScaledGroupedMatmul
from jaxmoe.ops.gated_grouped_matmul import gated_ffn
from jaxmoe.ops.gated_grouped_matmul.api import AUTO_FUSED_MAX_K
from jaxmoe.ops.gated_grouped_matmul.pallas_mosaic import PallasMosaicGatedGroupedMatmul
from jaxmoe.ops.grouped_matmul import grouped_matmul
from jaxmoe.ops.grouped_matmul import pallas_triton as triton_gmm
from jaxmoe.ops.grouped_matmul.pallas_triton import PallasTritonGroupedMatmul
from jaxmoe.ops.mosaic import tiles as pallas_mosaic_tiles
from jaxmoe.ops.row_gather import pallas_triton as triton_gather


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")


def cuda_text(fn, *shapes) -> str:
    """``fn`` traced at ``shapes`` (``(shape, dtype)`` pairs) and lowered for CUDA."""
    args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def forward_and_grads(op):
    """``op``'s output and its gradients in every float argument (forward, dgrad, wgrad)."""

    def loss(*args):
        return jnp.sum(op(*args).astype(jnp.float32) ** 2)

    def run(*args):
        floats = tuple(i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))
        return op(*args), jax.grad(loss, argnums=floats)(*args)

    return run


ODD = (1, 7, 96, 200, 1000, 1500, 2880)


# ------------------------------------------------------------------------------------------------
# Row gather (the permutation's dispatch and the combine's backward).
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_columns", (*ODD, 16, 512, 2048))
@pytest.mark.parametrize("num_entries", [7, 96, 200])
def test_row_gather_auto_lowers_for_a_gpu(fake_gpu, num_columns, num_entries):
    values = ((40, num_columns), jnp.bfloat16)
    index = ((num_entries,), jnp.int32)
    text = cuda_text(row_gather.gather_rows, values, index)
    operands = [jax.ShapeDtypeStruct(*values), jax.ShapeDtypeStruct(*index)]
    kernel_applies = triton_gather.unsupported_reason(*operands) is None
    assert ("jaxmoe_row_gather" in text) == kernel_applies
    # Where the block is a power of two the kernel takes the shape (96 columns: XLA).
    block = min(num_columns, triton_gather.COLUMNS)
    assert kernel_applies == (
        block & (block - 1) == 0 and num_columns % block == 0 and num_entries % 16 == 0
    )


def test_row_gather_named_kernel_refuses_a_block_triton_cannot_lower():
    values, index = jnp.zeros((40, 96), jnp.bfloat16), jnp.zeros((32,), jnp.int32)
    with pytest.raises(NotImplementedError, match=r"block \[16, 96\].*power of two"):
        row_gather.gather_rows(values, index, backend="pallas_triton", interpret=True)


# ------------------------------------------------------------------------------------------------
# Grouped matmul: Mosaic GPU where it applies, Triton elsewhere, XLA for dtypes neither takes.
# ------------------------------------------------------------------------------------------------

GMM_SHAPES = [  # (M, K, N, G)
    (1, 7, 96, 1),
    (7, 96, 200, 4),
    (200, 1000, 1, 16),
    (1000, 1500, 2880, 4),
    (2880, 200, 7, 16),
    (256, 128, 256, 4),  # Mosaic-aligned
    (1536, 2880, 1536, 8),  # Mosaic-aligned, K = 45 x 64
]


@pytest.mark.parametrize(("m", "k", "n", "groups"), GMM_SHAPES)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_grouped_matmul_auto_lowers_for_a_gpu(fake_gpu, m, k, n, groups, dtype):
    text = cuda_text(
        forward_and_grads(grouped_matmul),
        ((m, k), dtype),
        ((groups, k, n), dtype),
        ((groups,), jnp.int32),
    )
    cfg = pallas_mosaic_tiles.default_mosaic_gmm_tiles(m, k, n)
    mosaic_forward = (
        pallas_mosaic_tiles.unsupported_reason((m, k), (groups, k, n), dtype, dtype, False, cfg)
        is None
    )
    # The forward, dgrad and wgrad: each on Mosaic where its rule says so, Triton elsewhere.
    assert ("mosaic_gpu" in text) >= mosaic_forward
    if not mosaic_forward:
        assert "jaxmoe_gmm" in text  # the Triton forward (or dgrad)
    assert "ragged_dot" not in text


@pytest.mark.parametrize("backend", [None, "pallas_triton"])
def test_grouped_matmul_dtype_no_kernel_takes(fake_gpu, backend):
    """float64 (under ``jax_enable_x64``): no Pallas kernel lowers it; ``auto`` takes XLA, the
    named Triton backend refuses."""
    with jax.enable_x64(True):
        lhs, rhs = jnp.ones((8, 16), jnp.float64), jnp.ones((2, 16, 16), jnp.float64)
        group_sizes = jnp.array([3, 5], jnp.int32)
        if backend is None:
            text = cuda_text(
                grouped_matmul,
                ((8, 16), jnp.float64),
                ((2, 16, 16), jnp.float64),
                ((2,), jnp.int32),
            )
            assert "jaxmoe_gmm" not in text and "mosaic_gpu" not in text
        else:
            with pytest.raises(NotImplementedError, match="pallas_triton.*float64"):
                grouped_matmul(lhs, rhs, group_sizes, backend=backend)


def test_triton_kernels_take_every_shape_in_their_dtypes():
    """The rule behind the fallback: the Triton kernels' only refusal is a dtype."""
    for dtype in (jnp.bfloat16, jnp.float16, jnp.float32):
        assert triton_gmm.unsupported_reason(dtype) is None
    assert "float8_e4m3fn" in triton_gmm.unsupported_reason(jnp.float8_e4m3fn)
    assert PallasTritonGroupedMatmul().name == "pallas_triton"


# ------------------------------------------------------------------------------------------------
# Gated FFN: the fused Mosaic kernel where it applies, the unfused composition elsewhere.
# ------------------------------------------------------------------------------------------------

GATED_SHAPES = [  # (M, H, F, G)
    (7, 96, 200, 4),
    (200, 7, 1, 16),
    (1000, 2880, 1500, 4),
]
# The aligned side of these rules (the fused kernel, the FP8 kernel) lowers in their own suites
# (test_gated_ffn.py, test_fp8_mosaic.py): 10-25 s each, too slow to repeat here.


@pytest.mark.parametrize(("m", "h", "f", "groups"), GATED_SHAPES)
def test_gated_ffn_auto_lowers_for_a_gpu(fake_gpu, m, h, f, groups):
    def op(lhs, gate, up, down, group_sizes):
        return gated_ffn(lhs, gate, up, down, group_sizes, activation="swiglu")

    dtype = jnp.bfloat16
    text = cuda_text(
        forward_and_grads(op),
        ((m, h), dtype),
        ((groups, h, f), dtype),
        ((groups, h, f), dtype),
        ((groups, f, h), dtype),
        ((groups,), jnp.int32),
    )
    lhs, weight = jax.ShapeDtypeStruct((m, h), dtype), jax.ShapeDtypeStruct((groups, h, f), dtype)
    group_sizes = jax.ShapeDtypeStruct((groups,), jnp.int32)
    kernel = PallasMosaicGatedGroupedMatmul()  # interpret=None: not interpreted on the "GPU"
    fused = h <= AUTO_FUSED_MAX_K and kernel.unsupported_reason(lhs, weight, group_sizes) is None
    assert not fused
    assert "mosaic_gpu" not in text and "jaxmoe_gmm" in text  # unfused, on Triton
    assert "ragged_dot" not in text


# ------------------------------------------------------------------------------------------------
# FP8: the Mosaic FP8 kernel where it applies, XLA elsewhere; its Triton quantization passes.
# ------------------------------------------------------------------------------------------------

FP8_SHAPES = [  # (M, K, N, G)
    (7, 96, 200, 4),
    (200, 2880, 1000, 16),
    (1000, 1500, 7, 4),
    (1, 200, 96, 1),
]


@pytest.mark.parametrize(("m", "k", "n", "groups"), FP8_SHAPES)
@pytest.mark.parametrize(
    "recipe", [Fp8Recipe("rowwise"), Fp8Recipe("rowwise", wgrad="fp8"), Fp8Recipe("blockwise")]
)
def test_fp8_auto_lowers_for_a_gpu(fake_gpu, m, k, n, groups, recipe):
    def op(lhs, rhs, group_sizes):
        return fp8_grouped_matmul(lhs, rhs, group_sizes, recipe=recipe)

    dtype = jnp.bfloat16
    text = cuda_text(
        forward_and_grads(op), ((m, k), dtype), ((groups, k, n), dtype), ((groups,), jnp.int32)
    )
    backend = PallasMosaicScaledGroupedMatmul()  # interpret=None: not interpreted on the "GPU"
    lhs_q = jax.ShapeDtypeStruct((m, k), recipe.dtype)
    rhs_q = jax.ShapeDtypeStruct((groups, k, n), recipe.dtype)
    kernel = backend.unsupported_reason(lhs_q, rhs_q, recipe, dtype) is None
    assert backend.k_major_weights
    assert not kernel and "mosaic_gpu" not in text  # XLA's scaled matmul


# ------------------------------------------------------------------------------------------------
# The layer: the shape that crashed on an H200 (hidden 96, ffn 200, 16 experts, top-4).
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hidden", "ffn", "fp8_recipe"),
    [(96, 200, None), (96, 200, "rowwise"), (7, 1, None), (2880, 1500, None)],
)
def test_layer_auto_lowers_for_a_gpu(fake_gpu, hidden, ffn, fp8_recipe):
    cfg = jaxmoe.MoEConfig(
        num_experts=16,
        top_k=4,
        hidden_size=hidden,
        ffn_size=ffn,
        dtype=jnp.bfloat16,
        fp8_recipe=fp8_recipe,
    )
    params = jax.eval_shape(lambda: jaxmoe.init_params(jax.random.key(0), cfg))

    def loss(params, x):
        y, stats = jaxmoe.moe(params, x, cfg)
        return jnp.sum(y.astype(jnp.float32) ** 2) + stats.aux_loss

    x = jax.ShapeDtypeStruct((64, hidden), jnp.bfloat16)
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).trace(params, x)
    text = text.lower(lowering_platforms=("cuda",)).as_text()
    if fp8_recipe is None:  # unaligned FP8 takes XLA's scaled matmul
        assert "jaxmoe_gmm" in text or "mosaic_gpu" in text  # the GPU's kernels, not XLA's

"""The fused gated grouped matmul on Hopper: one Mosaic GPU kernel writes ``act(x Wg) * (x Wu)``.

It is the persistent, warp-specialized ``gmm`` of :mod:`jaxmoe.ops.grouped_matmul.pallas_mosaic`
(same work list, tile schedule, TMA ring and run-by-run epilogue stores) with two weights::

    per K step   the memory warpgroup loads one [bm, bk] block of lhs and two [bk, bn] blocks,
                 rhs_gate[g] and rhs_up[g] at the same columns, into one ring slot
    per tile     each compute warpgroup runs two wgmma chains into two [bm, bn / 2] float32
                 accumulators (gate, up) from the same lhs block in shared memory
    epilogue     act(acc_gate) * acc_up in float32, cast, stored by TMA; with ``residuals`` the
                 cast gate and up are stored too (the derivative's inputs)

Against the unfused path (two ``gmm`` launches and an elementwise pass) this reads ``lhs`` once
instead of twice and never writes or re-reads ``gate`` and ``up`` to compute the product: the
primal writes one ``[M, F]`` array where the unfused path writes two, reads two and writes one.

Register budget: two accumulators per warpgroup, so ``block_n`` is 128 (64 float32 columns per
warpgroup and accumulator, 128 registers a thread for both) where the single ``gmm`` takes 256.
Shared memory: a ring slot is ``bm * bk + 2 * bk * bn`` elements (48 KiB at 128 x 128 x 64 in
bf16): four slots and a 64-row epilogue slab fit in the H100's 227 KiB.

Measured (H100, jax 0.11.2, ``benchmarks/results/raw/h100-fused-glu``): ``h`` within 1.6-2.7e-3
of a float32 reference on the three benchmark shapes, balanced and skewed (the unfused path,
rounding ``gate`` and ``up`` to bf16 before the product: 7.5-8.3e-3); tail rows zero; gradients
bitwise equal to the unfused path's.

Limits: those of the Mosaic ``gmm`` (bf16/fp16, ``M % bm == K % bk == F % bn == 0``, a Hopper
GPU or Mosaic GPU's interpreter on a CPU).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxmoe.ops.gated_grouped_matmul.base import GatedGroupedMatmulBackend
from jaxmoe.ops.grouped_matmul import pallas_mosaic, pallas_mosaic_tiles, pallas_triton
from jaxmoe.ops.grouped_matmul import pallas_mosaic_common as common
from jaxmoe.ops.grouped_matmul.pallas_mosaic_tiles import MosaicTileConfig, check_tiles

Array = jax.Array


def _silu(x):
    return x * lax.logistic(x)


def _gelu_tanh(x):
    # jax.nn.gelu(approximate=True)'s formula, spelled in primitives Mosaic GPU lowers.
    sqrt_2_over_pi = np.sqrt(2 / np.pi).astype(np.float32)
    return x * (0.5 * (1.0 + jnp.tanh(sqrt_2_over_pi * (x + 0.044715 * (x * x * x)))))


# In-kernel (float32 accumulator) forms of base.GATE_ACTIVATIONS.
_KERNEL_ACTIVATIONS = {"swiglu": _silu, "geglu": _gelu_tanh}


def default_gated_tiles(m: int, k: int, n: int) -> MosaicTileConfig:
    """Block sizes of the fused kernel: the Mosaic ``gmm``'s measured default (4-deep ring,
    64-row epilogue slab, one pipeline across a CTA's tiles where ``min(K, N) <= 1024``) with
    ``block_n = 128`` per weight, so that both accumulators fit in registers."""
    del m
    return MosaicTileConfig(
        block_n=128, stages=4, epilogue_rows=64, pipelined_tiles=min(k, n) <= 1024
    )


def unsupported_reason(lhs_shape, rhs_shape, dtype, cfg, interpret: bool) -> str | None:
    """Why the fused kernel cannot take these operands, or ``None`` if it can: the Mosaic
    ``gmm``'s rules for one ``[M, K] x [G, K, F]`` product (each weight is one)."""
    return pallas_mosaic_tiles.unsupported_reason(
        lhs_shape, rhs_shape, dtype, dtype, False, cfg, interpret
    )


def fused_gmm(
    lhs: Array,
    rhs_gate: Array,
    rhs_up: Array,
    group_sizes: Array,
    *,
    activation: str,
    residuals: bool = False,
    tiles: MosaicTileConfig | None = None,
    interpret: bool | None = None,
) -> tuple[Array, ...]:
    """``(h,)`` or ``(h, gate, up)``, ``h = act(lhs @ rhs_gate[g]) * (lhs @ rhs_up[g])`` per
    group, zeros past the groups; all ``[M, F]`` in ``lhs``'s dtype.

    Args:
      lhs: ``[M, K]`` bf16/fp16, rows sorted by group.
      rhs_gate, rhs_up: ``[G, K, F]``, ``lhs``'s dtype.
      group_sizes: ``[G]`` int32, clipped to ``M``.
      activation: ``"swiglu"`` or ``"geglu"``.
      residuals: also return the cast ``gate`` and ``up``.
      tiles: ``None``: :func:`default_gated_tiles`.
      interpret: ``None`` runs Mosaic GPU's interpreter when JAX's default backend is not a GPU.

    Raises:
      NotImplementedError: operands the kernel cannot take (:func:`unsupported_reason`).
    """
    pallas_triton._check(lhs, rhs_gate, group_sizes, False, "fused gated gmm")
    pallas_triton._check(lhs, rhs_up, group_sizes, False, "fused gated gmm")
    m, k = lhs.shape
    cfg = tiles or default_gated_tiles(m, k, rhs_gate.shape[2])
    check_tiles(cfg, num_rhs=2)
    interpret_params = common.interpret_params(interpret)
    reason = unsupported_reason(
        lhs.shape, rhs_gate.shape, lhs.dtype, cfg, interpret_params is not None
    )
    if reason is not None:
        raise NotImplementedError(
            f"fused gated gmm: lhs {lhs.shape} {lhs.dtype}, rhs {rhs_gate.shape}: {reason}."
        )
    act = _KERNEL_ACTIVATIONS[activation]

    def combine(gate, up):
        hidden = act(gate) * up
        return (hidden, gate, up) if residuals else (hidden,)

    outs = pallas_mosaic.launch_gmm(
        lhs,
        rhs_gate,
        group_sizes,
        transpose_rhs=False,
        out_dtype=lhs.dtype,
        cfg=cfg,
        interpret_params=interpret_params,
        more_rhs=(rhs_up,),
        combine=combine,
        num_outputs=3 if residuals else 1,
    )
    return tuple(outs) if residuals else (outs,)


@dataclasses.dataclass(frozen=True)
class PallasMosaicGatedGroupedMatmul(GatedGroupedMatmulBackend):
    """The fused kernel (:func:`fused_gmm`); strict: operands it cannot take raise
    ``NotImplementedError`` (``"auto"`` takes the unfused composition for those instead).

    Attributes:
      tiles: block sizes; ``None``: :func:`default_gated_tiles`.
      interpret: ``None`` runs the interpreter when JAX's default backend is not a GPU.
      residuals_from_kernel: ``False`` by measurement (H100, ``benchmarks/results/raw/
        h100-fused-glu/run1``, ``run2``): the kernel writing ``h``, ``gate`` and ``up`` made
        fwd+bwd 0.94-0.97x the unfused path on the three benchmark shapes in run1, 0.96x
        (Mixtral) and 1.01x (DeepSeek, Qwen3) in run2 (its three epilogue stores share one
        staging slab and run one after another). So under differentiation the forward is the
        unfused composition, and the fused kernel serves the undifferentiated forward
        (inference, evaluation), where it measured 1.04/1.02x (Mixtral), 0.98/0.95x (DeepSeek)
        and 1.19/1.28x (Qwen3) the unfused forward (run1/run2).
    """

    name: str = dataclasses.field(default="pallas", init=False)
    residuals_from_kernel: bool = False
    tiles: MosaicTileConfig | None = None
    interpret: bool | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.tiles is not None:
            check_tiles(self.tiles, num_rhs=2)

    def _tiles(self, lhs_shape, rhs_shape):
        return self.tiles or default_gated_tiles(lhs_shape[0], lhs_shape[1], rhs_shape[2])

    def unsupported_reason(self, lhs, rhs_gate, group_sizes):
        cfg = self._tiles(lhs.shape, rhs_gate.shape)
        interpreted = pallas_triton._use_interpret(self.interpret)
        return unsupported_reason(lhs.shape, rhs_gate.shape, lhs.dtype, cfg, interpreted)

    def fused(self, lhs, rhs_gate, rhs_up, group_sizes, *, activation, residuals):
        return fused_gmm(
            lhs,
            rhs_gate,
            rhs_up,
            group_sizes,
            activation=activation,
            residuals=residuals,
            tiles=self._tiles(lhs.shape, rhs_gate.shape),
            interpret=self.interpret,
        )

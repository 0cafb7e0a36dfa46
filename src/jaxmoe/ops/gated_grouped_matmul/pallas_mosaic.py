"""The fused gated grouped matmul on Hopper: one Mosaic GPU kernel writes ``act(x Wg) * (x Wu)``
(:func:`fused_gmm`), one runs the gated FFN's backward through its down projection
(:func:`fused_down_dgrad`), and the backend class :class:`PallasMosaicGatedGroupedMatmul` that
decides once per call which of them runs (:func:`plan_fused_gmm`, :func:`plan_down_dgrad`).

The forward is the Mosaic ``gmm`` with two weights: per K step one ``lhs`` block and the two
weight blocks at the same columns, two ``wgmma`` chains into a gate and an up accumulator (so
``block_n`` is 128), ``act(gate) * up`` in the epilogue; it reads ``lhs`` once and never writes
``gate`` and ``up`` to compute the product, and rounds ``h`` once from float32. Limits: those of
the Mosaic ``gmm``. How it is built and measured: docs/kernels.md, 'The fused gated kernel and
the fused SwiGLU backward' and 'Fused gated kernel'.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxmoe.ops.gated_grouped_matmul.base import GatedGroupedMatmulBackend
from jaxmoe.ops.mosaic import launch, persistent_loop
from jaxmoe.ops.mosaic import tiles as mosaic_tiles
from jaxmoe.ops.mosaic.ring_operands import ring_operands_unsupported_reason
from jaxmoe.ops.mosaic.tiles import MosaicTileConfig, check_tiles
from jaxmoe.ops.mosaic.variant import GmmVariant
from jaxmoe.ops.pallas_common import check_gmm_operands, use_interpret

Array = jax.Array


_LOG2_E = np.float32(np.log2(np.e))
_SQRT_2_OVER_PI = np.sqrt(2 / np.pi).astype(np.float32)


def _sigmoid(x, approx: bool):
    # approx: 1 / (1 + e^-x) as rsqrt(1 + 2^(-x log2 e))^2, which under the kernel's approx_math
    # is two special-function instructions (ex2.approx, rsqrt.approx); lax.logistic lowers to
    # an exact expf and an IEEE division. Both give 0 for x -> -inf (rsqrt(inf) = 0) and 1 for
    # x -> +inf.
    if not approx:
        return lax.logistic(x)
    root = lax.rsqrt(1.0 + jnp.exp2(x * -_LOG2_E))
    return root * root


def _gelu_tanh_arg(x):
    # y = c (x + a x^3), gelu(x) = x (1 + tanh(y)) / 2 (jax.nn.gelu(approximate=True)).
    return _SQRT_2_OVER_PI * (x + 0.044715 * (x * x * x))


def _gelu_tanh_arg_slope(x):
    return _SQRT_2_OVER_PI * (1.0 + (3 * 0.044715) * (x * x))


def _silu(x, approx: bool = False):
    return x * _sigmoid(x, approx)


def _gelu_tanh(x, approx: bool = False):
    if approx:  # (1 + tanh(y)) / 2 = sigmoid(2 y): approx_math's tanh.approx (~2^-11) is coarse
        return x * _sigmoid(2.0 * _gelu_tanh_arg(x), True)
    return x * (0.5 * (1.0 + jnp.tanh(_gelu_tanh_arg(x))))


def _silu_and_slope(x, approx: bool = False):
    # silu(x) = x s, silu'(x) = s + x s (1 - s), s = sigmoid(x).
    s = _sigmoid(x, approx)
    return x * s, s * (1.0 + x * (1.0 - s))


def _gelu_tanh_and_slope(x, approx: bool = False):
    if approx:
        # gelu(x) = x s, s = sigmoid(2 y): gelu'(x) = s + 2 x s (1 - s) y'. No 1 + tanh(y) to
        # cancel where tanh(y) -> -1.
        s = _sigmoid(2.0 * _gelu_tanh_arg(x), True)
        return x * s, s + 2.0 * x * s * (1.0 - s) * _gelu_tanh_arg_slope(x)
    # gelu(x) = x (1 + t) / 2, t = tanh(y): gelu'(x) = (1 + t) / 2 + x (1 - t^2) y' / 2.
    t = jnp.tanh(_gelu_tanh_arg(x))
    half_x = 0.5 * x
    slope = 0.5 * (1.0 + t) + half_x * (1.0 - t * t) * _gelu_tanh_arg_slope(x)
    return half_x * (1.0 + t), slope


# In-kernel (float32 accumulator) forms of base.GATE_ACTIVATIONS, and of (act, act') for the
# fused backward; each takes ``approx`` (the kernel's ``MosaicTileConfig.approx_math``).
_KERNEL_ACTIVATIONS = {"swiglu": _silu, "geglu": _gelu_tanh}
_KERNEL_ACTIVATION_SLOPES = {"swiglu": _silu_and_slope, "geglu": _gelu_tanh_and_slope}


def default_gated_tiles(m: int, k: int, n: int) -> MosaicTileConfig:
    """Block sizes of the fused kernel: the hand-written 4-deep ring across a CTA's tiles, the
    compute warpgroups splitting the rows (``m64n128`` products), a 64-row epilogue slab, and
    ``block_n = 128`` per weight, so that both accumulators fit in registers.

    Each choice (the ring, split rows, group-start tiles, no weight multicast, the approximate
    activation) measured against its alternative: docs/kernels.md, 'Fused gated kernel'.
    """
    del m, k, n
    return MosaicTileConfig(
        block_n=128,
        stages=4,
        epilogue_rows=64,
        ring=True,
        split_rows=True,
        group_start_tiles=True,
        approx_math=True,
    )


def default_down_dgrad_tiles(m: int, h: int, f: int) -> MosaicTileConfig:
    """Block sizes of :func:`fused_down_dgrad` (``[M, H] x [G, F, H]^T``): the Mosaic ``gmm``'s
    default, with the activation's derivative on approximate instructions (``approx_math``;
    measured: docs/kernels.md, 'Fused gated kernel')."""
    return dataclasses.replace(mosaic_tiles.default_mosaic_gmm_tiles(m, h, f), approx_math=True)


def unsupported_reason(lhs_shape, rhs_shape, dtype, cfg, interpret: bool) -> str | None:
    """Why the fused kernel cannot take these operands, or ``None`` if it can: the Mosaic
    ``gmm``'s rules for one ``[M, K] x [G, K, F]`` product (each weight is one)."""
    return mosaic_tiles.unsupported_reason(
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
    check_gmm_operands(lhs, rhs_gate, group_sizes, False, "fused gated gmm")
    check_gmm_operands(lhs, rhs_up, group_sizes, False, "fused gated gmm")
    plan = plan_fused_gmm(lhs.shape, rhs_gate.shape, lhs.dtype, tiles=tiles, interpret=interpret)
    return launch_fused_gmm(
        lhs, rhs_gate, rhs_up, group_sizes, plan, activation=activation, residuals=residuals
    )


def plan_fused_gmm(lhs_shape, rhs_shape, dtype, *, tiles, interpret) -> launch.GmmPlan:
    """The plan of :func:`fused_gmm` on ``lhs [M, K]`` and weights ``[G, K, F]``: ``tiles`` or
    :func:`default_gated_tiles`, checked for two weights; the interpreter or not; and
    :func:`unsupported_reason`."""
    m, k = lhs_shape
    cfg = tiles or default_gated_tiles(m, k, rhs_shape[2])
    check_tiles(cfg, num_rhs=2)
    interpret_params = persistent_loop.interpret_params(interpret)
    reason = unsupported_reason(lhs_shape, rhs_shape, dtype, cfg, interpret_params is not None)
    return launch.GmmPlan(cfg, False, jnp.dtype(dtype), interpret_params, reason)


def launch_fused_gmm(
    lhs, rhs_gate, rhs_up, group_sizes, plan: launch.GmmPlan, *, activation, residuals
) -> tuple[Array, ...]:
    """The fused kernel on checked operands, as ``plan`` says; ``NotImplementedError`` for a
    plan that says why it cannot run."""
    if plan.unsupported is not None:
        raise NotImplementedError(
            f"fused gated gmm: lhs {lhs.shape} {lhs.dtype}, rhs {rhs_gate.shape}: "
            f"{plan.unsupported}."
        )
    act = functools.partial(_KERNEL_ACTIVATIONS[activation], approx=plan.tiles.approx_math)

    def combine(gate, up):
        hidden = act(gate) * up
        return (hidden, gate, up) if residuals else (hidden,)

    variant = GmmVariant(num_rhs=2, combine=combine, num_outputs=3 if residuals else 1)
    outs = launch.launch_gmm(lhs, rhs_gate, group_sizes, plan, variant, more_rhs=(rhs_up,))
    return tuple(outs) if residuals else (outs,)


def down_dgrad_epilogue(
    hidden_bar, gate, up, *, group, row0, col0, activation: str, approx: bool = False
):
    """``(gate_bar, up_bar) = (h_bar * up * act'(gate), h_bar * act(gate))`` for one column part
    of a compute warpgroup's float32 ``h_bar`` accumulator, ``gate`` and ``up`` its blocks in
    registers (carried to shared memory by the ring: :mod:`jaxmoe.ops.mosaic.ring_operands`);
    ``approx``: the kernel's ``approx_math``."""
    del group, row0, col0
    activated, slope = _KERNEL_ACTIVATION_SLOPES[activation](gate.astype(jnp.float32), approx)
    return hidden_bar * up.astype(jnp.float32) * slope, hidden_bar * activated


def down_dgrad_unsupported_reason(
    out_bar_shape, rhs_down_shape, dtype, cfg, interpret: bool
) -> str | None:
    """Why :func:`fused_down_dgrad` cannot take these operands, or ``None`` if it can: the
    Mosaic ``gmm``'s rules for ``[M, H] x [G, F, H]^T`` (non-transposed in the interpreter,
    which reads a transposed copy)."""
    num_groups, f, h = rhs_down_shape
    rhs_shape = (num_groups, h, f) if interpret else rhs_down_shape
    reasons = [
        mosaic_tiles.unsupported_reason(
            out_bar_shape, rhs_shape, dtype, dtype, not interpret, cfg, interpret
        ),
        ring_operands_unsupported_reason(cfg, 2, jnp.dtype(dtype).itemsize),
    ]
    return "; ".join(reason for reason in reasons if reason) or None


def fused_down_dgrad(
    out_bar: Array,
    gate: Array,
    up: Array,
    rhs_down: Array,
    group_sizes: Array,
    *,
    activation: str,
    tiles: MosaicTileConfig | None = None,
    interpret: bool | None = None,
) -> tuple[Array, Array]:
    """The gated FFN's backward through its down projection and activation, one kernel::

        h_bar = out_bar @ rhs_down[g]^T          (the down projection's dgrad, float32)
        gate_bar = h_bar * up * act'(gate)       up_bar = h_bar * act(gate)

    per group, zeros past the groups. ``h_bar`` never leaves the registers: the activation's
    derivative runs in the dgrad's epilogue (:func:`down_dgrad_epilogue`; ``gate`` and ``up``
    reach it through the kernel's shared-memory ring: :mod:`jaxmoe.ops.mosaic.ring_operands`),
    so the separate elementwise pass (read ``h_bar``, ``gate``, ``up``; write two) and ``h_bar``'s
    store and load are gone. More accurate than the unfused path, which rounds ``h_bar`` and each
    elementwise step to ``out_bar``'s dtype.

    Args:
      out_bar: ``[M, H]`` bf16/fp16, the FFN output's cotangent, rows sorted by group.
      gate, up: ``[M, F]``, the forward's ``lhs @ rhs_gate[g]`` and ``lhs @ rhs_up[g]``.
      rhs_down: ``[G, F, H]`` down weights.
      group_sizes: ``[G]`` int32, clipped to ``M``.
      activation: ``"swiglu"`` or ``"geglu"``.
      tiles: block sizes; ``None``: :func:`default_down_dgrad_tiles`.
      interpret: ``None`` runs Mosaic GPU's interpreter when JAX's default backend is not a GPU.

    Raises:
      NotImplementedError: operands the kernel cannot take (:func:`down_dgrad_unsupported_reason`).
    """
    check_gmm_operands(out_bar, rhs_down, group_sizes, True, "fused down dgrad")
    plan = plan_down_dgrad(
        out_bar.shape,
        rhs_down.shape,
        out_bar.dtype,
        out_dtype=gate.dtype,
        tiles=tiles,
        interpret=interpret,
    )
    return launch_down_dgrad(out_bar, gate, up, rhs_down, group_sizes, plan, activation=activation)


def plan_down_dgrad(
    out_bar_shape, rhs_down_shape, dtype, *, out_dtype, tiles, interpret
) -> launch.GmmPlan:
    """The plan of :func:`fused_down_dgrad` on ``out_bar [M, H]`` and ``rhs_down [G, F, H]``
    (``gate``, ``up`` and the results in ``out_dtype``): ``tiles`` or
    :func:`default_down_dgrad_tiles`, checked; the interpreter or not (the GPU reads
    ``rhs_down`` transposed, the interpreter a transposed copy); and
    :func:`down_dgrad_unsupported_reason`."""
    m, h = out_bar_shape
    f = rhs_down_shape[1]
    cfg = tiles or default_down_dgrad_tiles(m, h, f)
    check_tiles(cfg)
    interpret_params = persistent_loop.interpret_params(interpret)
    interpreted = interpret_params is not None
    reason = down_dgrad_unsupported_reason(out_bar_shape, rhs_down_shape, dtype, cfg, interpreted)
    return launch.GmmPlan(cfg, not interpreted, jnp.dtype(out_dtype), interpret_params, reason)


def launch_down_dgrad(
    out_bar, gate, up, rhs_down, group_sizes, plan: launch.GmmPlan, *, activation
) -> tuple[Array, Array]:
    """The fused down dgrad on checked operands, as ``plan`` says; ``NotImplementedError`` for
    a plan that says why it cannot run."""
    if plan.unsupported is not None:
        raise NotImplementedError(
            f"fused down dgrad: out_bar {out_bar.shape} {out_bar.dtype}, rhs_down "
            f"{rhs_down.shape}: {plan.unsupported}."
        )
    # The interpreter cannot read a transposed wgmma operand: it gets a transposed copy.
    rhs = jnp.swapaxes(rhs_down, 1, 2) if plan.interpreted else rhs_down
    variant = GmmVariant(
        epilogue=functools.partial(
            down_dgrad_epilogue, activation=activation, approx=plan.tiles.approx_math
        ),
        num_outputs=2,
        ring_operands=True,
    )
    outs = launch.launch_gmm(out_bar, rhs, group_sizes, plan, variant, epilogue_operands=(gate, up))
    return tuple(outs)


@functools.lru_cache(maxsize=256)
def _planned(planner, *args, **kwargs) -> launch.GmmPlan:
    """``planner(*args, **kwargs)`` once per signature (shapes, dtypes, tiles, interpreter or
    not): the op asks the backend whether it can run the operands, then the backend runs them,
    and both read one plan."""
    return planner(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class PallasMosaicGatedGroupedMatmul(GatedGroupedMatmulBackend):
    """The fused kernel (:func:`fused_gmm`); strict: operands it cannot take raise
    ``NotImplementedError`` (``"auto"`` takes the unfused composition for those instead).

    Attributes:
      tiles: block sizes; ``None``: :func:`default_gated_tiles`.
      fused_backward: under differentiation inside :func:`~.api.gated_ffn` (the layer's expert
        FFN), run the down projection's dgrad and the activation's derivative as one kernel
        (:func:`fused_down_dgrad`) wherever it applies, the unfused derivative on ``grouped``
        elsewhere. The kernel is closer to a float32 reference (1.7e-3 against the unfused
        path's 3.3-3.7e-3, Mixtral and Qwen3, balanced and skewed) and never writes ``h_bar``;
        its epilogue operands ride the ring
        (:mod:`jaxmoe.ops.mosaic.ring_operands`). On by the layer's
        fwd+bwd (measured: docs/kernels.md, 'Fused gated kernel').
      down_dgrad_tiles: that kernel's block sizes; ``None``: :func:`default_down_dgrad_tiles`.
      fused_input_dgrad: the projections' input gradient ``gate_bar Wg^T + up_bar Wu^T`` as one
        kernel (:func:`jaxmoe.ops.mosaic.launch.gmm_pair`: one K loop over both
        products, one ``[M, K]`` result) where the Mosaic ``gmm`` takes the operands: it saves
        one launch and its last wave, one ``[M, K]`` store and the sum's read of it (measured:
        docs/kernels.md, 'Fused gated kernel').
      interpret: ``None`` runs the interpreter when JAX's default backend is not a GPU.
      residuals_from_kernel: under differentiation the fused kernel writes ``h``, ``gate`` and
        ``up`` (so no XLA pass computes ``h``), and the backward's elementwise pass reads
        ``gate`` and ``up``; ``False``: two plain ``gmm`` calls for the residuals plus XLA's
        ``h``. On because a model's cotangent depends on the layer's output, which keeps XLA
        from folding ``h`` into the backward (measured: docs/kernels.md, 'Fused gated kernel').
    """

    name: str = dataclasses.field(default="pallas", init=False)
    residuals_from_kernel: bool = True
    tiles: MosaicTileConfig | None = None
    fused_backward: bool = True
    down_dgrad_tiles: MosaicTileConfig | None = None
    fused_input_dgrad: bool = True
    interpret: bool | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.tiles is not None:
            check_tiles(self.tiles, num_rhs=2)
        if self.down_dgrad_tiles is not None:
            check_tiles(self.down_dgrad_tiles)

    def _down_dgrad_plan(self, out_bar, gate_dtype, rhs_down) -> launch.GmmPlan:
        return _planned(
            plan_down_dgrad,
            out_bar.shape,
            rhs_down.shape,
            jnp.dtype(out_bar.dtype),
            out_dtype=jnp.dtype(gate_dtype),
            tiles=self.down_dgrad_tiles,
            interpret=use_interpret(self.interpret),
        )

    def down_dgrad_unsupported_reason(self, out_bar, rhs_down, group_sizes):
        if not self.fused_backward:
            return "fused_backward=False"
        return self._down_dgrad_plan(out_bar, out_bar.dtype, rhs_down).unsupported

    def down_dgrad(self, out_bar, gate, up, rhs_down, group_sizes, *, activation):
        plan = self._down_dgrad_plan(out_bar, gate.dtype, rhs_down)
        return launch_down_dgrad(
            out_bar, gate, up, rhs_down, group_sizes, plan, activation=activation
        )

    def _input_dgrad_plan(self, gate_bar, rhs_gate) -> launch.GmmPlan:
        """On a GPU the weights ``[G, K, F]`` are read transposed; Mosaic GPU's interpreter,
        which cannot, gets ``[G, F, K]`` copies (:meth:`input_dgrad`)."""
        num_groups, k, f = rhs_gate.shape
        interpreted = use_interpret(self.interpret)
        return _planned(
            launch.plan_gmm,
            gate_bar.shape,
            (num_groups, f, k) if interpreted else rhs_gate.shape,
            jnp.dtype(rhs_gate.dtype),
            transpose_rhs=not interpreted,
            out_dtype=None,
            tiles=None,
            interpret=interpreted,
        )

    def input_dgrad_unsupported_reason(self, gate_bar, rhs_gate, group_sizes):
        if not self.fused_input_dgrad:
            return "fused_input_dgrad=False"
        return self._input_dgrad_plan(gate_bar, rhs_gate).unsupported

    def input_dgrad(self, gate_bar, up_bar, rhs_gate, rhs_up, group_sizes):
        plan = self._input_dgrad_plan(gate_bar, rhs_gate)
        launch.check_pair_tiles(plan.tiles)
        if plan.interpreted:
            rhs_gate, rhs_up = (jnp.swapaxes(rhs, 1, 2) for rhs in (rhs_gate, rhs_up))
        dtype = rhs_gate.dtype
        return launch.launch_gmm(
            gate_bar.astype(dtype),
            rhs_gate,
            group_sizes,
            plan,
            launch.PAIRED,
            second_pair=(up_bar.astype(dtype), rhs_up),
        )

    def _plan(self, lhs, rhs_gate) -> launch.GmmPlan:
        return _planned(
            plan_fused_gmm,
            lhs.shape,
            rhs_gate.shape,
            jnp.dtype(lhs.dtype),
            tiles=self.tiles,
            interpret=use_interpret(self.interpret),
        )

    def unsupported_reason(self, lhs, rhs_gate, group_sizes):
        return self._plan(lhs, rhs_gate).unsupported

    def fused(self, lhs, rhs_gate, rhs_up, group_sizes, *, activation, residuals):
        return launch_fused_gmm(
            lhs,
            rhs_gate,
            rhs_up,
            group_sizes,
            self._plan(lhs, rhs_gate),
            activation=activation,
            residuals=residuals,
        )

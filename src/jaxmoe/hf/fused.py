"""Expert tensors that stack every expert in one tensor, in jaxmoe's own ``[E, in, out]``
orientation: gpt-oss's ``experts.gate_up_proj`` ``[E, H, 2F]`` (gate in the even columns, up
in the odd ones: ``gate_up[..., 2f]`` is ``w_gate[..., f]``, ``gate_up[..., 2f + 1]`` is
``w_up[..., f]``), ``experts.gate_up_proj_bias`` ``[E, 2F]`` (interleaved the same way),
``experts.down_proj`` ``[E, F, H]`` and ``experts.down_proj_bias`` ``[E, H]``.

The weights may be stored in MXFP4 instead (gpt-oss's Hub checkpoints): ``{key}_blocks``
``[E, out, in / 32, 16]`` and ``{key}_scales`` ``[E, out, in / 32]``, each row one output
column (:mod:`jaxmoe.hf.mxfp4`); they are read dequantized. Written back, every tensor is
dense.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxmoe.hf.mxfp4 import BLOCK, dequantize_mxfp4


def _columns(index: slice, count: int) -> tuple[int, int]:
    start, stop, step = index.indices(count)
    if step != 1:
        raise ValueError(f"jaxmoe.hf: an expert shard's index must be contiguous; got {index}.")
    return start, stop


@dataclasses.dataclass(frozen=True)
class FusedExpertTensor:
    """Where one jaxmoe expert parameter (``[E, in, out]`` weight or ``[E, out]`` bias) lives.

    Attributes:
      key: the stacked tensor's checkpoint key.
      parity: 0 (gate) or 1 (up) for a half of an interleaved gate/up tensor; None when the
        tensor is the parameter itself.
      mxfp4: the weight is stored as ``{key}_blocks`` / ``{key}_scales``.
    """

    key: str
    parity: int | None = None
    mxfp4: bool = False

    def stored_keys(self) -> list[str]:
        return [f"{self.key}_blocks", f"{self.key}_scales"] if self.mxfp4 else [self.key]

    def _stored_out(self, out: int) -> int:
        return out if self.parity is None else 2 * out

    def expected_shapes(self, shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """The stored shape of each of :meth:`stored_keys`, for the jaxmoe parameter ``shape``."""
        *lead, out = shape
        stored = (*lead, self._stored_out(out))
        if not self.mxfp4:
            return {self.key: stored}
        experts, size_in = lead
        if size_in % BLOCK:
            raise ValueError(
                f"jaxmoe.hf.load_moe_layer: {self.key!r} is stored in MXFP4, whose blocks are "
                f"{BLOCK} input values, but config.json implies an input width of {size_in}, not "
                f"a multiple of {BLOCK}. The weights and config.json are from different models."
            )
        rows = (experts, self._stored_out(out), size_in // BLOCK)
        return {f"{self.key}_blocks": (*rows, BLOCK // 2), f"{self.key}_scales": rows}

    def read(self, files, index: tuple[slice, ...], shape: tuple[int, ...], dtype) -> np.ndarray:
        """``index`` of the jaxmoe parameter of ``shape``: only its experts, and only the stored
        columns (or MXFP4 rows) that hold its output columns."""
        start, stop = _columns(index[-1], shape[-1])
        step = 1 if self.parity is None else 2
        stored = slice(step * start, step * stop)
        half = slice(None) if self.parity is None else slice(self.parity, None, 2)
        if not self.mxfp4:
            block = files.read(self.key, (*index[:-1], stored))[..., half]
        else:  # rows are output columns; every input column's blocks are read, then sliced
            rows = (index[0], stored, slice(None))
            blocks = files.read(f"{self.key}_blocks", (*rows, slice(None)))
            scales = files.read(f"{self.key}_scales", rows)
            weight = dequantize_mxfp4(blocks, scales, self.key)[:, half]
            block = np.swapaxes(weight, -1, -2)[:, index[1]]
        return np.ascontiguousarray(block).astype(dtype, copy=False)

    def write(self, value: np.ndarray, tensors: dict) -> None:
        """Puts the whole parameter ``value`` into ``tensors`` under the dense key (the two
        halves of an interleaved tensor fill its even and odd columns)."""
        if self.parity is None:
            tensors[self.key] = np.ascontiguousarray(value)
            return
        shape = (*value.shape[:-1], 2 * value.shape[-1])
        fused = tensors.setdefault(self.key, np.empty(shape, value.dtype))
        fused[..., self.parity :: 2] = value


def gpt_oss_experts(prefix: str, mxfp4: bool) -> dict[str, FusedExpertTensor]:
    """gpt-oss's expert parameters under ``{prefix}.experts`` (gated, with biases)."""
    experts = f"{prefix}.experts"
    return {
        "w_gate": FusedExpertTensor(f"{experts}.gate_up_proj", 0, mxfp4),
        "w_up": FusedExpertTensor(f"{experts}.gate_up_proj", 1, mxfp4),
        "w_down": FusedExpertTensor(f"{experts}.down_proj", None, mxfp4),
        "b_gate": FusedExpertTensor(f"{experts}.gate_up_proj_bias", 0),
        "b_up": FusedExpertTensor(f"{experts}.gate_up_proj_bias", 1),
        "b_down": FusedExpertTensor(f"{experts}.down_proj_bias"),
    }


__all__ = ["FusedExpertTensor", "gpt_oss_experts"]

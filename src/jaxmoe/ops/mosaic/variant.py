"""What a Mosaic ``gmm`` kernel computes besides ``lhs @ rhs[g]``: one small description
(:class:`GmmVariant`) that the grouped, gated and FP8 ops construct and the kernel body
(:mod:`.gmm_kernel`) splits along."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class GmmVariant:
    """The kernel's variant, fixed before tracing.

    Attributes:
      epilogue: ``epilogue(acc, *epilogue_operands, group=, row0=, col0=)`` maps one slab of a
        compute warpgroup's float32 accumulator (rows from ``row0``, columns from ``col0``)
        before the cast, to one result or a tuple of ``num_outputs`` (the FP8 rowwise scales;
        the gated FFN's activation derivative). ``None``: the accumulator itself.
      num_rhs: weights sharing each lhs block, one accumulator each (the fused gated kernel's
        gate and up projections).
      combine: maps the ``num_rhs`` accumulators to the ``num_outputs`` float32 results (the
        fused gated kernel's ``act(gate) * up``).
      num_outputs: the kernel's ``[M, N]`` results.
      k_step_scale: ``k_step_scale(*epilogue_operands, k_step=, group=, row0=, col0=, rows=,
        cols=)``: the ``[rows]`` scales of one compute warpgroup's ``[rows, cols]`` product of K
        step ``k_step``, which the kernel multiplies into each row before adding the product to
        the accumulator (the FP8 blockwise recipe: one K step is one scale block). The kernel
        loads them before it waits for the step's ``wgmma``, so that the loads overlap it.
      paired: a second ``(lhs, rhs)`` pair runs its K steps after the first's into the same
        accumulator: ``lhs @ rhs[g] + lhs2 @ rhs2[g]`` (the gated FFN's input gradient).
      ring_operands: the epilogue's two ``[M, N]`` operands ride the operand ring
        (:mod:`.ring_operands`) and reach ``epilogue`` as register blocks.
    """

    epilogue: Callable | None = None
    num_rhs: int = 1
    combine: Callable | None = None
    num_outputs: int = 1
    k_step_scale: Callable | None = None
    paired: bool = False
    ring_operands: bool = False

    def __post_init__(self):
        if self.num_rhs < 1 or self.num_outputs < 1:
            raise ValueError(
                f"GmmVariant: `num_rhs` ({self.num_rhs}) and `num_outputs` ({self.num_outputs}) "
                "must be at least 1."
            )
        # Each option's kernel path is built for the plain product around it only.
        conflicts = {
            "k_step_scale": self.k_step_scale is not None
            and (self.num_rhs > 1 or self.combine is not None),
            "paired": self.paired
            and (self.num_rhs > 1 or self.epilogue is not None or self.combine is not None),
            "ring_operands": self.ring_operands
            and (
                self.num_rhs > 1
                or self.paired
                or self.combine is not None
                or self.k_step_scale is not None
            ),
        }
        for name, conflict in conflicts.items():
            if conflict:
                raise ValueError(
                    f"GmmVariant: `{name}` takes one rhs and no other option; got {self}."
                )

    @property
    def plain_accumulator(self) -> bool:
        """The one accumulator is the one result, unmapped: what the last round's split (its
        fix-up adds float32 partial sums of the accumulator itself) can take."""
        return not (self.epilogue or self.num_rhs > 1 or self.combine or self.k_step_scale)


PLAIN = GmmVariant()

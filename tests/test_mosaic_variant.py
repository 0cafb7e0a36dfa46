"""The Mosaic gmm's variant description: what combines, what the last round's split takes, and
the launcher's agreement between the variant and the operands it is given."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from jaxmoe.ops.mosaic import launch
from jaxmoe.ops.mosaic.variant import PLAIN, GmmVariant


def _scale(partial, *operands, **where):
    del operands, where
    return partial


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (dict(k_step_scale=_scale, num_rhs=2), "k_step_scale"),
        (dict(k_step_scale=_scale, combine=max), "k_step_scale"),
        (dict(paired=True, epilogue=_scale), "paired"),
        (dict(paired=True, num_rhs=2), "paired"),
        (dict(ring_operands=True, paired=True), "ring_operands"),
        (dict(ring_operands=True, k_step_scale=_scale), "ring_operands"),
        (dict(num_outputs=0), "num_outputs"),
    ],
)
def test_options_the_kernel_has_no_path_for_are_refused(options, named):
    with pytest.raises(ValueError, match=named):
        GmmVariant(**options)


def test_only_a_plain_accumulator_takes_the_last_round_split():
    assert PLAIN.plain_accumulator and GmmVariant(paired=True).plain_accumulator
    for variant in (
        GmmVariant(epilogue=_scale),
        GmmVariant(num_rhs=2, combine=max),
        GmmVariant(k_step_scale=_scale),
    ):
        assert not variant.plain_accumulator


def test_the_launcher_refuses_operands_the_variant_does_not_expect():
    lhs, rhs = jnp.zeros((128, 64), jnp.bfloat16), jnp.zeros((2, 64, 256), jnp.bfloat16)
    sizes = jnp.array([64, 64], jnp.int32)
    plan = launch.plan_gmm(
        lhs.shape,
        rhs.shape,
        lhs.dtype,
        transpose_rhs=False,
        out_dtype=None,
        tiles=None,
        interpret=True,
    )
    with pytest.raises(ValueError, match="more_rhs"):
        launch.launch_gmm(lhs, rhs, sizes, plan, more_rhs=(rhs,))
    with pytest.raises(ValueError, match="paired"):
        launch.launch_gmm(lhs, rhs, sizes, plan, launch.PAIRED)

"""``jaxmoe.ops.grouped_matmul.preferred_alignment``: the op answers, per backend and operand
dtype, the row padding the layer uses by default (GPU answers tested by faking the platform and
the Hopper check)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import pytest

from jaxmoe.ops import grouped_matmul
from jaxmoe.ops.grouped_matmul import XlaGroupedMatmul, preferred_alignment
from jaxmoe.ops.grouped_matmul.pallas_mosaic import PallasMosaicGroupedMatmul
from jaxmoe.ops.mosaic import tiles as pallas_mosaic_tiles

BF16, FP8 = jnp.bfloat16, jnp.float8_e4m3fn


@pytest.mark.parametrize("backend", [None, "auto", "pallas", "pallas_triton", "xla", "reference"])
def test_no_padding_off_a_gpu(backend):
    assert preferred_alignment(backend, BF16, platform="cpu") == 1


@pytest.mark.parametrize(
    "backend, dtype, hopper, want",
    [
        (None, BF16, True, 64),  # "auto" runs the Mosaic kernels on a Hopper
        ("auto", jnp.float16, True, 64),
        ("pallas", BF16, True, 64),
        ("pallas", FP8, True, 128),  # the FP8 kernels' row tile
        ("auto", BF16, False, 128),  # another GPU: the Triton kernels' row tile
        ("pallas_triton", BF16, True, 128),
        ("xla", BF16, True, 128),
        ("reference", BF16, True, 128),
        (PallasMosaicGroupedMatmul(), BF16, True, 64),  # a configured backend object answers too
        (XlaGroupedMatmul(), BF16, True, 128),
    ],
)
def test_gpu_answer_comes_from_the_backend(monkeypatch, backend, dtype, hopper, want):
    monkeypatch.setattr(pallas_mosaic_tiles, "hopper_gpu", lambda: hopper)
    assert preferred_alignment(backend, dtype, platform="gpu") == want


def test_a_backend_of_its_own_is_asked():
    @dataclasses.dataclass(frozen=True)
    class Wide(XlaGroupedMatmul):
        def preferred_alignment(self, dtype) -> int:
            return 256 if jnp.dtype(dtype).itemsize == 2 else 32

    assert preferred_alignment(Wide(), BF16, platform="gpu") == 256
    assert preferred_alignment(Wide(), jnp.float32, platform="gpu") == 32
    assert preferred_alignment(Wide(), BF16, platform="cpu") == 1


def test_exported_from_the_op():
    assert "preferred_alignment" in grouped_matmul.__all__

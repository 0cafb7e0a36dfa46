"""The grouped matmul op: one API (``api.grouped_matmul``), a backend per file."""

from jaxmoe.ops.grouped_matmul.api import (
    BACKEND_NAMES,
    default_backend_name,
    grouped_matmul,
    preferred_alignment,
    resolve_backend,
)
from jaxmoe.ops.grouped_matmul.base import GroupedMatmulBackend
from jaxmoe.ops.grouped_matmul.reference import ReferenceGroupedMatmul
from jaxmoe.ops.grouped_matmul.xla import XlaGroupedMatmul

__all__ = [
    "BACKEND_NAMES",
    "GroupedMatmulBackend",
    "ReferenceGroupedMatmul",
    "XlaGroupedMatmul",
    "default_backend_name",
    "grouped_matmul",
    "preferred_alignment",
    "resolve_backend",
]

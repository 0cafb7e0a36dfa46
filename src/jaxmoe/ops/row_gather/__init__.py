"""The row gather op: one API (``api.gather_rows``), a backend per file."""

from jaxmoe.ops.row_gather.api import BACKEND_NAMES, gather_rows

__all__ = ["BACKEND_NAMES", "gather_rows"]

"""Expert-parallel exchange implementations, one file each, behind :class:`Exchange`.

``resolve_exchange(None)`` gives the platform default (``"all_to_all"``: dense, runs everywhere,
fastest measured on H200s: docs/kernels.md, 'Expert parallelism: exchange and dispatch
defaults').
"""

from __future__ import annotations

import jax

from jaxmoe.option_names import EP_EXCHANGES, check_registry
from jaxmoe.parallel.exchange.all_gather import AllGatherExchange
from jaxmoe.parallel.exchange.all_to_all import AllToAllExchange
from jaxmoe.parallel.exchange.all_to_all_chunked import ChunkedAllToAllExchange
from jaxmoe.parallel.exchange.base import Exchange, exchange_rows
from jaxmoe.parallel.exchange.ragged import RaggedAllToAllExchange

EXCHANGES = {
    cls.name: cls
    for cls in (
        AllToAllExchange,
        ChunkedAllToAllExchange,
        AllGatherExchange,
        RaggedAllToAllExchange,
    )
}
EXCHANGE_NAMES = tuple(EXCHANGES)
check_registry("EP_EXCHANGES", EP_EXCHANGES, EXCHANGE_NAMES)


def default_exchange_name(platform: str | None = None) -> str:
    """The exchange ``ep_exchange=None`` means on ``platform`` (dense all-to-all everywhere)."""
    del platform  # measured fastest on GPU, and the only fast one on CPU
    return "all_to_all"


def resolve_exchange(exchange: str | Exchange | None, platform: str | None = None) -> Exchange:
    """Turns ``None``, a name, or an :class:`Exchange` into an exchange that runs on ``platform``.

    Raises:
      ValueError: unknown name.
      NotImplementedError: the named exchange cannot run on ``platform`` (never a silent
        fallback to another exchange).
    """
    platform = platform or jax.default_backend()
    if isinstance(exchange, Exchange):
        impl = exchange
    else:
        name = default_exchange_name(platform) if exchange is None else exchange
        if name not in EXCHANGES:
            raise ValueError(
                f"MoEConfig.ep_exchange: unknown exchange {name!r}; choose one of "
                f"{EXCHANGE_NAMES} or None for the platform default."
            )
        impl = EXCHANGES[name]()
    impl.check_platform(platform)
    return impl


__all__ = [
    "EXCHANGES",
    "EXCHANGE_NAMES",
    "AllGatherExchange",
    "AllToAllExchange",
    "ChunkedAllToAllExchange",
    "Exchange",
    "RaggedAllToAllExchange",
    "default_exchange_name",
    "exchange_rows",
    "resolve_exchange",
]

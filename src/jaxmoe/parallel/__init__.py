"""Expert parallelism: experts sharded over a mesh axis, exact against one device.

* :func:`moe_sharded` (what ``jaxmoe.moe(..., mesh=mesh)`` calls): the layer under
  ``jax.shard_map``.
* :func:`ep_dispatch` / :func:`ep_combine`: the exchange-level API for use inside your own
  ``shard_map``; :func:`ep_apply_experts` wraps both around an expert function, with the
  dropless fast path.
* :mod:`jaxmoe.parallel.token_dispatch`: the token dispatch (``ep_dispatch="tokens"``: one
  row per (token, destination rank) on the wire, not one per copy).
* :mod:`jaxmoe.parallel.layout`: the slot and receive-buffer arithmetic behind them.
* :mod:`jaxmoe.parallel.exchange`: the exchange implementations (dense all-to-all, all-gather
  reference, ragged all-to-all).
* :mod:`jaxmoe.parallel.sharding`: mesh checks, partition specs, logical axis rules.
"""

from jaxmoe.parallel.apply_experts import ep_apply_experts
from jaxmoe.parallel.dispatch import EPHandle, ep_combine, ep_dispatch
from jaxmoe.parallel.exchange import (
    EXCHANGE_NAMES,
    Exchange,
    default_exchange_name,
    resolve_exchange,
)
from jaxmoe.parallel.layout import all_expert_counts, fullest_slot, slot_rows
from jaxmoe.parallel.sharded import moe_sharded
from jaxmoe.parallel.sharding import (
    batch_partition_spec,
    check_mesh,
    logical_axis_rules,
    param_partition_specs,
)

__all__ = [
    "EXCHANGE_NAMES",
    "EPHandle",
    "Exchange",
    "all_expert_counts",
    "batch_partition_spec",
    "check_mesh",
    "default_exchange_name",
    "ep_apply_experts",
    "ep_combine",
    "ep_dispatch",
    "fullest_slot",
    "logical_axis_rules",
    "moe_sharded",
    "param_partition_specs",
    "resolve_exchange",
    "slot_rows",
]

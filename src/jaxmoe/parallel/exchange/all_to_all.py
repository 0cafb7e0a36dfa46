"""Dense ``jax.lax.all_to_all`` of fixed-size slots: the default exchange on every platform.

Every rank sends all ``P`` rows of each slot (real rows first, zeros after), so the bytes on the
wire are ``(ep - 1) * P * H`` per rank whatever the routing: choose ``P`` tight
(``MoEConfig.ep_receive_factor``) when routing is balanced. One NCCL all-to-all on GPU; runs on
CPU too.
"""

from __future__ import annotations

import jax

from jaxmoe.parallel.exchange.base import Exchange


class AllToAllExchange(Exchange):
    """``recv = lax.all_to_all(send, axis_name, split_axis=0, concat_axis=0)``."""

    name = "all_to_all"

    def exchange(self, send, send_sizes, recv_sizes, axis_name):
        del send_sizes, recv_sizes  # the slots are dense: sizes only tell the reader what is real
        return jax.lax.all_to_all(send, axis_name, split_axis=0, concat_axis=0, tiled=True)

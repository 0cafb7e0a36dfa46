"""The reference exchange: gather every rank's send buffer, keep the slots addressed to me.

Simple and exact, and memory-hungry: each rank materialises all ``ep * ep * P`` rows. Its VJP
(the same exchange on the cotangent) is again a gather, so no reduction is involved. Use it to
check the other exchanges, not to train.
"""

from __future__ import annotations

import jax

from jaxmoe.parallel.exchange.base import Exchange


class AllGatherExchange(Exchange):
    """``recv[s] = all_gather(send)[s, me]``."""

    name = "all_gather"

    def exchange(self, send, send_sizes, recv_sizes, axis_name):
        del send_sizes, recv_sizes
        gathered = jax.lax.all_gather(send, axis_name)  # [ep (sender), ep (receiver), P, H]
        me = jax.lax.axis_index(axis_name)
        return jax.lax.dynamic_index_in_dim(gathered, me, axis=1, keepdims=False)

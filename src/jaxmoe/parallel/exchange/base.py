r"""The exchange interface: every expert-parallel exchange moves the same fixed-layout buffer.

Each rank holds a send buffer ``[ep, P, H]``: slot ``d`` holds the rows it sends to rank ``d``,
the first ``send_sizes[d]`` of them real (the rest are zeros). An exchange returns the receive
buffer ``[ep, P, H]``: slot ``s`` holds the rows rank ``s`` sent here, the first
``recv_sizes[s]`` of them real; what lies past them is unspecified (callers never read it).
In block terms it transposes the ``[sender, receiver]`` matrix of slots::

    rank 0 sends [a0 | b0]        rank 0 receives [a0 | a1]
    rank 1 sends [a1 | b1]   ->   rank 1 receives [b0 | b1]

That map is its own transpose, so the transpose of an exchange is the same exchange applied to the
cotangent with the sizes swapped (``send_sizes`` <-> ``recv_sizes``): :func:`exchange_rows`
wraps every implementation in that transpose (a :func:`~jaxmoe.multilinear.multilinear` map:
forward mode exchanges the tangent). No implementation adds values (no scatter-add),
so forward and backward are deterministic.

``P`` (rows per slot) is a static bound chosen by :mod:`jaxmoe.parallel.layout`.
"""

from __future__ import annotations

import abc

import jax

from jaxmoe.multilinear import multilinear


class Exchange(abc.ABC):
    """One way to move slots between the ranks of a mesh axis (see the module docstring)."""

    #: The name ``MoEConfig.ep_exchange`` uses for this implementation.
    name: str = ""

    def check_platform(self, platform: str) -> None:
        """Raises NotImplementedError, naming ``platform``, if this exchange cannot run there."""
        del platform  # the default: runs everywhere

    @abc.abstractmethod
    def exchange(
        self, send: jax.Array, send_sizes: jax.Array, recv_sizes: jax.Array, axis_name
    ) -> jax.Array:
        """``send[ep, P, H] -> recv[ep, P, H]``: ``recv[s] = send_of_rank_s[me]`` (real rows)."""

    def __hash__(self):
        return hash(type(self))

    def __eq__(self, other):
        return type(self) is type(other)


def _exchange(send, send_sizes, recv_sizes, *, impl, axis_name):
    return impl.exchange(send, send_sizes, recv_sizes, axis_name)


def _exchange_transpose(grad_recv, send_sizes, recv_sizes, *, impl, axis_name):
    # The block transpose is an involution: the cotangent of slot (s -> me) goes back (me -> s).
    return impl.exchange(grad_recv, recv_sizes, send_sizes, axis_name)


def exchange_rows(impl: Exchange, send, send_sizes, recv_sizes, axis_name):
    """``impl.exchange``, linear in ``send``, with the reverse exchange as its transpose and
    forward mode exchanging the tangent (see the module docstring)."""
    return multilinear(
        _exchange,
        (_exchange_transpose,),
        ((send,),),
        (send_sizes, recv_sizes),
        out=jax.ShapeDtypeStruct(send.shape, send.dtype),
        impl=impl,
        axis_name=axis_name,
    )

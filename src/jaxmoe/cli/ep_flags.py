"""The rules between the flags of ``jaxmoe bench ep`` and ``bench ep-memory``, checked once they
are parsed: an expert-parallel size that cannot split a layer's experts, or a layer option the
library refuses (a ``MoEConfig`` rule, or ``ep_chunks`` that does not divide each device's
tokens), would otherwise fail after minutes of work on the sizes before it.

:func:`check_bench_ep` and :func:`check_ep_memory` need no device (they run before JAX starts,
which the simulated CPU devices of ``--ep`` require); :func:`check_devices` starts JAX.
"""

from __future__ import annotations

import jax

from jaxmoe.bench import ep_memory, expert_parallel
from jaxmoe.bench.layer_scaling import LAYER_CASES, TINY_LAYER_CASES, layer_config
from jaxmoe.cli import flags

# The ``bench ep`` flag that sets each ``MoEConfig`` field of the layer part (``ep_dispatch`` is
# the ``-tokens`` presets').
LAYER_FLAGS = {
    "num_experts": "--ep",
    "ep_exchange": "--layer-exchange",
    "ep_receive_factor": "--receive-factor",
    "ep_fast_slot_factor": "--fast-slot-factor",
    "ep_chunks": "--chunks",
    "ep_dispatch": "--preset",
}


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def check_experts_split(ep_sizes, num_experts: int, layer: str) -> None:
    """``ValueError`` naming ``--ep`` unless every size divides ``num_experts``: each rank holds
    an equal share of the experts (``jaxmoe.parallel`` shards them over the ``ep`` axis)."""
    for ep in ep_sizes:
        if num_experts % ep:
            raise ValueError(
                f"argument --ep: {ep} does not divide the {num_experts} experts of {layer} "
                f"(each rank holds an equal share of the experts); choose among "
                f"{_divisors(num_experts)}"
            )


def check_bench_ep(args, cases, tiny: bool) -> None:
    """``ValueError`` (one line, naming the flag) if the layer part cannot run one of
    ``cases`` at one of ``args.ep`` with these flags."""
    if "layer" not in args.parts:
        return
    presets = ",".join(args.preset)
    for name in cases:
        case = (TINY_LAYER_CASES if tiny else LAYER_CASES)[name]
        layer = f"the layer part's {case.name} layer (--preset {presets})"
        if case.num_experts is not None:
            check_experts_split(args.ep, case.num_experts, layer)
        for ep in args.ep:
            try:
                layer_config(
                    case,
                    ep,
                    exchange=args.layer_exchange,
                    receive_factor=args.receive_factor,
                    fast_slot_factor=args.fast_slot_factor,
                    chunks=args.chunks,
                )
            except ValueError as error:
                raise ValueError(flags.config_error(error, LAYER_FLAGS)) from None
        # jaxmoe.parallel's rule, checked there only once the batch is known.
        if args.chunks > 1 and max(args.ep) > 1 and case.tokens_per_gpu % args.chunks:
            raise ValueError(
                f"argument --chunks: {args.chunks} must divide the {case.tokens_per_gpu} tokens "
                f"per device of {layer} (ep_chunks splits each device's tokens into equal "
                f"chunks); choose among {_divisors(case.tokens_per_gpu)}"
            )


def check_ep_memory(args) -> None:
    """``ValueError`` naming ``--ep`` if it cannot split ``bench ep-memory``'s experts."""
    check_experts_split([args.ep], ep_memory.SHAPE["E"], "bench ep-memory's layer")


def check_devices(args) -> None:
    """``ValueError`` naming the flag if this process has fewer devices than the largest
    ``--ep`` (or, where the exchange part runs, ``--exchange-ep``), or ``--layer-exchange``
    does not run on its platform. This starts JAX."""
    platform = jax.default_backend()
    sizes = {"--ep": max(args.ep)}
    if args.exchange_ep and "exchange" in args.parts and platform != "cpu":  # not run on CPU
        sizes["--exchange-ep"] = max(args.exchange_ep)
    for flag, size in sizes.items():
        if size > jax.device_count():
            raise ValueError(
                f"argument {flag}: {size} devices asked for; {jax.device_count()} available"
            )
    here = expert_parallel.available_exchanges(platform)
    if args.layer_exchange is not None and args.layer_exchange not in here:
        raise ValueError(
            f"argument --layer-exchange: {args.layer_exchange} does not run on {platform}; "
            f"choose from {', '.join(here)}"
        )

"""Expert-parallel benchmark: the driver of its three parts, over any EP sizes the devices allow.

* ``correctness`` (:mod:`jaxmoe.bench.sharded_correctness`): the sharded layer, every exchange the
  platform runs, against the one-device layer (float32: output, every gradient, the stats).
* ``exchange`` (:mod:`jaxmoe.bench.exchange_bandwidth`): dispatch + combine against bare
  all-to-alls of the same payload, in bytes each rank sends to other ranks per second.
* ``layer`` (:mod:`jaxmoe.bench.layer_scaling`): ``jaxmoe.moe`` forward+backward at fixed tokens
  per GPU (weak scaling), tokens/s per GPU.

The command line is ``jaxmoe bench ep``; in Python::

    rows = run_ep_benchmark([1, 2, 4])
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxmoe.bench.exchange_bandwidth import bench_exchange
from jaxmoe.bench.layer_scaling import LAYER_CASES, TINY_LAYER_CASES, bench_layer
from jaxmoe.bench.sharded_correctness import check_correctness
from jaxmoe.parallel.exchange import EXCHANGES

PARTS = ("correctness", "exchange", "layer")
# What the results header says about the numbers.
HEADER_FACTS = {
    "bandwidth": "gbps_per_rank: token copies each rank sends to other ranks per second "
    "(payload); sent_gbps_per_rank: bytes the exchange puts on the wire to other ranks per "
    "second (whole slots, every window); dispatch+combine fwd = 2 exchanges, fwd+bwd = 4",
    "timing": "median ms per call after warm-up (jaxmoe.bench.timing.time_jax)",
}
# The table ``jaxmoe bench ep`` prints (see jaxmoe.bench.harness.format_table): one row per
# correctness check, exchange timing or layer timing; "-" where a column does not apply.
COLUMNS = (
    ("case", "case", ""),
    ("ep", "ep", ""),
    ("impl", "impl", ""),
    ("ms", "ms", "{:.3f}"),
    ("gbps_per_rank", "GB/s/rank", "{:.1f}"),
    ("tokens_per_s_per_gpu", "tokens/s/GPU", "{:,.0f}"),
    ("tflops_per_gpu", "TFLOP/s/GPU", "{:.3f}"),
    ("ratio_vs_dense_a2a", "vs dense a2a", "{:.2f}x"),
    ("sent_gbps_per_rank", "sent GB/s/rank", "{:.1f}"),
    ("sent_ratio_vs_dense_a2a", "sent vs dense a2a", "{:.2f}x"),
    ("weak_scaling_vs_first", "weak scaling", "{:.2f}"),
    ("max_rel_err", "max rel err", "{:.1e}"),
    ("ok", "ok", ""),
)


def available_exchanges(platform: str | None = None) -> list[str]:
    """Exchange names that run on ``platform``."""
    platform = platform or jax.default_backend()
    names = []
    for name, cls in EXCHANGES.items():
        try:
            cls().check_platform(platform)
        except NotImplementedError:
            continue
        names.append(name)
    return names


def run_ep_benchmark(
    ep_sizes: Sequence[int],
    *,
    parts: Sequence[str] = PARTS,
    cases: Sequence[str] = ("dsv3", "mixtral"),
    tiny: bool = False,
    receive_factor: float | None = 1.25,
    fast_slot_factor: float | None = 1.125,
    chunks: int = 1,
    budget_s: float = 1e9,
    exchange_ep: Sequence[int] | None = None,
    exchanges: Sequence[str] | None = None,
    layer_exchange: str | None = None,
    log: Callable[[str], None] = print,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Runs the parts in order over ``ep_sizes``; stops starting new work past ``budget_s``.

    What cannot run here gives a row with ``"skipped"`` (the reason): an exchange this platform
    lacks, the exchange part on CPU (timed loops of CPU collectives can deadlock XLA's
    in-process rendezvous), work past the time budget.

    ``exchanges`` restricts the exchange part to these names (default: all that run here);
    ``layer_exchange`` is the layer part's ``ep_exchange`` (None: the default), with
    ``receive_factor`` as its ``ep_receive_factor`` (None: dropless) and ``fast_slot_factor``
    as its ``ep_fast_slot_factor``.
    """
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []

    def emit(row):
        rows.append(row)
        log(json.dumps(row))
        if on_row is not None:
            on_row(row)

    def out_of_time(what):
        if time.perf_counter() - start > budget_s:
            emit({"case": what, "skipped": f"time budget of {budget_s} s spent"})
            return True
        return False

    impls_here = available_exchanges()

    def correctness():
        # At the largest EP only (every exchange): the CPU suite covers the other sizes.
        ep = max(ep_sizes)
        if ep < 2:
            return
        for impl in ("all_to_all", "all_gather", "ragged_all_to_all"):
            if impl not in impls_here:
                why = f"the {impl} exchange does not run on {jax.default_backend()}"
                emit({"case": "correctness", "ep": ep, "impl": impl, "skipped": why})
                continue
            if out_of_time(f"correctness ep={ep} {impl}"):
                return
            try:
                emit(check_correctness(ep, impl, tiny=tiny))
            except NotImplementedError as error:
                emit({"case": "correctness", "ep": ep, "impl": impl, "skipped": str(error)})
        # The token dispatch, with its fast window only and with overflow windows forced.
        for factor in (1.125, 1.0):
            if out_of_time(f"correctness ep={ep} tokens"):
                return
            emit(
                check_correctness(
                    ep, "all_to_all", tiny=tiny, fast_slot_factor=factor, ep_dispatch="tokens"
                )
            )

    def exchange():
        if jax.default_backend() == "cpu":
            why = "timed loops of CPU collectives can deadlock XLA's in-process rendezvous"
            emit({"case": "exchange", "skipped": f"not timed on CPU: {why}"})
            return
        exchange_impls = [
            ("all_to_all", None, fast_slot_factor or 1.125),  # the default
            # The token dispatch: one row per (token, destination rank).
            ("all_to_all", None, fast_slot_factor or 1.125, 1, "tokens"),
            ("all_to_all", None, fast_slot_factor or 1.125, 2),
            ("all_to_all", None, fast_slot_factor or 1.125, 4),
            ("all_to_all", None, None),
            ("all_to_all", receive_factor or 1.25, None),
            ("all_to_all_chunked", None, None),
            ("all_gather", None, fast_slot_factor or 1.125),
        ]
        if "ragged_all_to_all" in impls_here:
            exchange_impls.append(("ragged_all_to_all", None, fast_slot_factor or 1.125))
        if exchanges:
            exchange_impls = [spec for spec in exchange_impls if spec[0] in exchanges]
        for ep in ep_sizes if exchange_ep is None else exchange_ep:
            if ep < 2 or out_of_time(f"exchange ep={ep}"):
                continue
            for row in bench_exchange(ep, impls=exchange_impls, tiny=tiny, log=lambda _: None):
                emit(row)

    def layer():
        table = TINY_LAYER_CASES if tiny else LAYER_CASES
        backend = None
        for name in cases:
            case = table[name]
            base = None
            for ep in sorted(ep_sizes):
                if case.num_experts is not None and case.num_experts % ep:
                    continue
                if out_of_time(f"layer {name} ep={ep}"):
                    return

                def attempt(backend, case=case, ep=ep):
                    return bench_layer(
                        case,
                        ep,
                        exchange=layer_exchange,
                        receive_factor=receive_factor,
                        fast_slot_factor=fast_slot_factor,
                        chunks=chunks,
                        backend=backend,
                    )

                def error_row(error, case=case, ep=ep):
                    return {
                        "case": f"layer_fwd_bwd:{case.name}",
                        "ep": ep,
                        "ms": None,
                        "error": str(error)[:300],
                    }

                try:
                    row = attempt(backend)
                except Exception as error:  # noqa: BLE001 - the Pallas kernel may not be ready
                    if backend is not None:
                        emit(error_row(error))
                        continue
                    log(f"backend auto failed ({str(error)[:300]}); retrying with backend='xla'")
                    backend = "xla"
                    try:
                        row = attempt(backend)
                    except Exception as error2:  # noqa: BLE001
                        emit(error_row(error2))
                        continue
                row["grouped_matmul_backend"] = backend or "auto"
                if base is None:
                    base = row
                row["weak_scaling_vs_first"] = (
                    row["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"]
                )
                emit(row)

    for part in parts:
        {"correctness": correctness, "exchange": exchange, "layer": layer}[part]()
    return rows


def cases_for_presets(presets: Sequence[str]) -> tuple[list[str], bool]:
    """The layer cases (:data:`LAYER_CASES` names) of ``--preset`` names, and whether tiny:
    ``tiny`` alone means the tiny dsv3 and mixtral cases (a CPU smoke test)."""
    if list(presets) == ["tiny"]:
        return ["dsv3", "mixtral"], True
    if "tiny" in presets:
        raise ValueError("--preset tiny cannot be combined with other presets")
    unknown = [name for name in presets if name not in LAYER_CASES]
    if unknown:
        raise ValueError(
            f"no expert-parallel layer case {unknown[0]!r}; choose from tiny, "
            f"{', '.join(LAYER_CASES)}"
        )
    return list(presets), False

"""Where a jitted function's device time goes: GPU kernel durations from a JAX profiler trace,
summed per XLA op.

``kernel_breakdown(fn, *args)`` runs ``fn`` a few times under :func:`jax.profiler.trace`, reads
the trace back with :class:`jax.profiler.ProfileData` (no TensorBoard needed) and sums the
duration of every kernel on the device planes, grouped by the HLO op that launched it (the
``hlo_op`` stat; the kernel's own name where there is none). Durations are per call: the sum
over the traced calls divided by their number. On a CPU there are no device planes and the
breakdown is empty.
"""

from __future__ import annotations

import collections
import glob
import os
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax

# Launches shorter than this are left out of :func:`launch_sequence`'s list (the many small XLA
# ops of a layer's routing and permutation).
SEQUENCE_MIN_US = 20.0


def op_name(kernel: str, op: str) -> str:
    """What an event counts under: its HLO op, or its kernel's name where it has none or the op
    is a command buffer (a CUDA graph of several ops)."""
    return kernel if not op or op.startswith("command_buffer") else op


def summarize(
    events: Iterable[tuple[str, str, float, float]], calls: int, top: int = 25
) -> dict[str, Any]:
    """Aggregates ``(kernel_name, hlo_op, start_ns, duration_ns)`` events of ``calls`` calls.

    Returns ``{"total_ms", "span_ms", "kernels", "rows", "sequence"}``: the kernels'
    milliseconds per call, the span from the first kernel's start to the last one's end per call
    (with calls launched back to back, ``span_ms - total_ms`` is the device's idle time per
    call), the number of kernel launches per call, the ``top`` ops by time, each ``{"op",
    "kernel", "ms", "share", "launches"}`` (``kernel``: the op's longest-running kernel name,
    shortened), and the launches of one call in order (:func:`launch_sequence`), which tells
    apart kernels that share one name and no op (Mosaic GPU's). An event whose op is a command
    buffer (a CUDA graph) counts under its kernel's name.
    """
    if calls < 1:
        raise ValueError(f"`calls` must be >= 1; got {calls}.")
    time_ns: dict[str, float] = collections.defaultdict(float)
    launches: dict[str, int] = collections.Counter()
    longest: dict[str, tuple[float, str]] = {}
    events = list(events)
    for kernel, op, _, duration_ns in events:
        key = op_name(kernel, op)
        time_ns[key] += duration_ns
        launches[key] += 1
        if duration_ns > longest.get(key, (-1.0, ""))[0]:
            longest[key] = (duration_ns, kernel)
    total_ns = sum(time_ns.values())
    ordered = sorted(time_ns, key=time_ns.get, reverse=True)[:top]
    rows = [
        {
            "op": key,
            "kernel": longest[key][1][:80],
            "ms": time_ns[key] / calls / 1e6,
            "share": time_ns[key] / total_ns if total_ns else 0.0,
            "launches": launches[key] / calls,
        }
        for key in ordered
    ]
    starts = [start for _, _, start, _ in events]
    ends = [start + duration for _, _, start, duration in events]
    span_ns = max(ends) - min(starts) if events else 0.0
    return {
        "total_ms": total_ns / calls / 1e6,
        "span_ms": span_ns / calls / 1e6,
        "kernels": sum(launches.values()) / calls,
        "rows": rows,
        "sequence": launch_sequence(events, calls),
    }


def launch_sequence(
    events: Iterable[tuple[str, str, float, float]], calls: int, min_us: float = SEQUENCE_MIN_US
) -> list[dict[str, Any]]:
    """One call's launches in order, each ``{"index", "op", "kernel", "us"}`` (its microseconds
    averaged over the calls), those under ``min_us`` left out (``index`` counts them).

    The events, in start order, are cut into ``calls`` equal runs: calls launched back to back
    on one stream launch the same kernels in the same order. Empty where the events do not
    divide evenly (an incomplete trace)."""
    ordered = sorted(events, key=lambda event: event[2])
    if calls < 1 or len(ordered) % calls:
        return []
    per_call = len(ordered) // calls
    sequence = []
    for index in range(per_call):
        kernel, op, _, _ = ordered[index]
        microseconds = sum(ordered[c * per_call + index][3] for c in range(calls)) / calls / 1e3
        if microseconds >= min_us:
            name = op_name(kernel, op)[:60]
            sequence.append({"index": index, "op": name, "kernel": kernel[:60], "us": microseconds})
    return sequence


def idle_gaps(
    events: Iterable[tuple[str, str, float, float]], calls: int, top: int = 10
) -> dict[str, Any]:
    """Where the device sat idle between kernels, from the same events as :func:`summarize`.

    Kernels are taken in start order; a gap is the time from the latest end so far to the next
    kernel's start (overlapping kernels, on several streams, leave none). Returns ``{"idle_ms",
    "gaps", "largest"}``: idle milliseconds per call, the number of gaps per call, and the
    ``top`` largest gaps, each ``{"us", "after", "before"}`` (the ops, or kernel names where
    there is no op, on either side). With calls launched back to back the idle time is what the
    host's launches or a device-to-host wait cost the device, not the kernels' own speed.
    """
    if calls < 1:
        raise ValueError(f"`calls` must be >= 1; got {calls}.")
    ordered = sorted(events, key=lambda event: event[2])
    gaps = []
    latest_end, latest_name = None, ""
    for kernel, op, start_ns, duration_ns in ordered:
        name = op or kernel
        if latest_end is not None and start_ns > latest_end:
            gaps.append((start_ns - latest_end, latest_name, name))
        if latest_end is None or start_ns + duration_ns >= latest_end:
            latest_end, latest_name = start_ns + duration_ns, name
    gaps.sort(key=lambda gap: gap[0], reverse=True)
    return {
        "idle_ms": sum(gap for gap, _, _ in gaps) / calls / 1e6,
        "gaps": len(gaps) / calls,
        "largest": [
            {"us": gap / 1e3, "after": after[:60], "before": before[:60]}
            for gap, after, before in gaps[:top]
        ],
    }


def device_events(xplane_path: str) -> list[tuple[str, str, float, float]]:
    """``(kernel_name, hlo_op, start_ns, duration_ns)`` for every event on the trace's device
    planes."""
    data = jax.profiler.ProfileData.from_file(xplane_path)
    events = []
    for plane in data.planes:
        if not plane.name.startswith("/device:"):
            continue
        lines = list(plane.lines)
        # XLA's GPU planes hold one line per stream plus derived lines ("XLA Ops", "XLA
        # Modules", ...) that repeat the kernels' time: keep the streams where they are named.
        streams = [line for line in lines if line.name.startswith("Stream")] or lines
        for line in streams:
            for event in line.events:
                stats = dict(event.stats)
                op = str(stats.get("hlo_op", ""))
                events.append((event.name, op, event.start_ns, event.duration_ns))
    return events


def traced_events(
    fn: Callable[..., Any], *args: Any, calls: int = 5, settle_s: float = 0.0
) -> list[tuple[str, str, float, float]]:
    """The device events of ``calls`` calls of ``fn(*args)`` launched back to back under
    :func:`jax.profiler.trace` (compiled and warmed up first); see :func:`device_events`.

    ``settle_s``: first run ``fn`` back to back for that many seconds, so that the calls are
    profiled at the clock a GPU settles to under the load (an H100 at its power limit takes
    0.1-0.4 s to reach it), not at an idle GPU's boost clock."""
    if calls < 1:
        raise ValueError(f"`calls` must be >= 1; got {calls}.")
    if settle_s < 0:
        raise ValueError(f"`settle_s` must be >= 0; got {settle_s}.")
    out = jax.block_until_ready(fn(*args))
    deadline = time.perf_counter() + settle_s
    while time.perf_counter() < deadline:
        out = jax.block_until_ready([fn(*args) for _ in range(4)])
    with tempfile.TemporaryDirectory() as log_dir:
        with jax.profiler.trace(log_dir):
            for _ in range(calls):
                out = fn(*args)
            jax.block_until_ready(out)
        paths = glob.glob(os.path.join(log_dir, "**", "*.xplane.pb"), recursive=True)
        return device_events(max(paths, key=os.path.getmtime)) if paths else []


def kernel_breakdown(
    fn: Callable[..., Any], *args: Any, calls: int = 5, top: int = 25, settle_s: float = 0.0
) -> dict[str, Any]:
    """Profiles ``calls`` calls of ``fn(*args)`` (compiled and warmed up first, then run for
    ``settle_s`` seconds: :func:`traced_events`); see :func:`summarize`."""
    return summarize(traced_events(fn, *args, calls=calls, settle_s=settle_s), calls, top)


def format_breakdown(title: str, breakdown: dict[str, Any]) -> str:
    """A markdown table of :func:`summarize`'s rows under ``title``."""
    lines = [
        f"### {title}: {breakdown['total_ms']:.3f} ms of kernels per call, span "
        f"{breakdown['span_ms']:.3f} ms, {breakdown['kernels']:.0f} launches",
        "",
        "| op | ms | share | launches | kernel |",
        "|---|---|---|---|---|",
    ]
    for row in breakdown["rows"]:
        lines.append(
            f"| {row['op']} | {row['ms']:.3f} | {row['share']:.1%} | {row['launches']:.0f} "
            f"| {row['kernel']} |"
        )
    if breakdown.get("sequence"):
        lines += [
            "",
            f"Launches of one call in order (>= {SEQUENCE_MIN_US:g} us):",
            "",
            "| # | op | us |",
            "|---|---|---|",
        ]
        lines += [f"| {s['index']} | {s['op']} | {s['us']:.1f} |" for s in breakdown["sequence"]]
    return "\n".join(lines)

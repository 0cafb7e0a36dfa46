"""Device-synchronised timing for JAX and torch callables: median milliseconds per call.

Device work is asynchronous, so each sample launches ``inner`` calls back to back and then waits for
the device; the sample is the elapsed host time over ``inner``. Launching several calls per sample
hides the per-call dispatch gap (tens of microseconds) behind device work, as a training loop does.
``inner`` is chosen so that one sample lasts about ``target_sample_ms``. Compilation and the first
(warm-up) calls are never timed.

With ``per_call=True`` each call is also timed on its own, waited for before the next is launched
(``per_call_median_ms``): what a script that calls ``block_until_ready()`` after every call sees.
It adds the host's launch time of the program wherever the device would otherwise outrun it (on an
H100 about 0.3-0.6 ms for the whole MoE layer at XLA's default CUDA-graph settings).

Peers timed against each other (:func:`time_interleaved`) each run untimed for ``settle_ms``
before each sample: a GPU at its power limit takes a fraction of a second to bring its clock to a
new load.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax

# How long the benches run each contender untimed before each of its samples on a GPU (see
# :func:`time_interleaved`'s ``settle_ms``).
SETTLE_MS = 500.0


def settle_ms_for(platform: str, settle_ms: float | None) -> float:
    """``settle_ms``, or where it is ``None`` the default: :data:`SETTLE_MS` on a GPU, whose
    clock follows the load, nothing elsewhere."""
    if settle_ms is None:
        return SETTLE_MS if platform == "gpu" else 0.0
    if settle_ms < 0:
        raise ValueError(
            f"`settle_ms` must be >= 0 (None: the platform's default); got {settle_ms}."
        )
    return float(settle_ms)


@dataclasses.dataclass(frozen=True)
class Timing:
    """Milliseconds per call over ``samples`` timed samples of ``inner`` calls each."""

    median_ms: float
    min_ms: float
    max_ms: float
    samples: int
    inner: int
    per_call_median_ms: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def warm_up(
    call: Callable[[], Any],
    sync: Callable[[Any], None],
    *,
    warmup: int = 3,
    target_sample_ms: float = 20.0,
    max_inner: int = 50,
) -> int:
    """Runs ``call`` ``warmup`` times, then three times timed one by one; returns how many
    back-to-back calls make a sample of about ``target_sample_ms``, from the fastest of the three
    (one slow probe call, a host hiccup, can cut a fast kernel's samples to a few calls and put
    the fixed cost of a sync in every one: docs/kernels.md, 'Benchmark
    harness')."""
    out = None
    for _ in range(max(1, warmup)):
        out = call()
    sync(out)
    probe_ms = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        sync(call())
        probe_ms = min(probe_ms, (time.perf_counter() - t0) * 1e3)
    return int(max(1, min(max_inner, target_sample_ms // max(probe_ms, 1e-3))))


def take_sample(call: Callable[[], Any], sync: Callable[[Any], None], inner: int) -> float:
    """Milliseconds per call of ``inner`` calls launched back to back, then one device sync."""
    t0 = time.perf_counter()
    for _ in range(inner):
        out = call()
    sync(out)
    return (time.perf_counter() - t0) * 1e3 / inner


def _timing(samples: list[float], inner: int, per_call_ms: float | None = None) -> Timing:
    return Timing(
        statistics.median(samples), min(samples), max(samples), len(samples), inner, per_call_ms
    )


def _time_with_sync(
    call: Callable[[], Any],
    sync: Callable[[Any], None],
    *,
    warmup: int,
    repeats: int,
    target_sample_ms: float,
    max_inner: int,
    per_call: bool = False,
) -> Timing:
    inner = warm_up(
        call, sync, warmup=warmup, target_sample_ms=target_sample_ms, max_inner=max_inner
    )
    samples = [take_sample(call, sync, inner) for _ in range(repeats)]
    per_call_ms = per_call_median_ms(call, sync, calls=max(repeats, 20)) if per_call else None
    return _timing(samples, inner, per_call_ms)


def per_call_median_ms(
    call: Callable[[], Any], sync: Callable[[Any], None], calls: int = 20
) -> float:
    """Median milliseconds of ``calls`` calls, each waited for before the next is launched."""
    single = []
    for _ in range(calls):
        t0 = time.perf_counter()
        sync(call())
        single.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(single)


def settle(call: Callable[[], Any], sync: Callable[[Any], None], inner: int, ms: float) -> None:
    """Runs ``call`` untimed, ``inner`` calls back to back then a wait, until ``ms`` have
    passed (at least once when ``ms > 0``)."""
    if ms <= 0:
        return
    end = time.perf_counter() + ms / 1e3
    while True:
        for _ in range(inner):
            out = call()
        sync(out)
        if time.perf_counter() >= end:
            return


def time_interleaved(
    contenders: Mapping[str, tuple[Callable[[], Any], Callable[[Any], None], int]],
    rounds: int = 10,
    settle_ms: float | None = None,
) -> dict[str, Timing]:
    """Times several callables against each other: each round takes one sample of every
    contender (``(call, sync, inner)``, ``inner`` from :func:`warm_up`), starting one contender
    later each round. Peers sampled seconds apart share the GPU's clock and temperature, which
    drift by up to 15% over a long run on an H100, so their ratio is far steadier than that of
    timings taken one after the other (docs/kernels.md, 'Benchmark harness').

    ``settle_ms``: before each sample, the contender runs untimed for this long, so that the
    sample sees the clock its own load settles at (None: :func:`settle_ms_for` the default
    backend, :data:`SETTLE_MS` on a GPU, nothing elsewhere). An H100 at its power limit clocks
    kernels by the power they draw and takes 0.1-0.4 s to follow a change of load, so a sample
    taken right after a peer's starts at the peer's clock (~10% either way on the Mixtral
    layer: docs/kernels.md, 'Benchmark harness')."""
    settle_ms = settle_ms_for(jax.default_backend(), settle_ms)
    names = list(contenders)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds):
        for name in names[index % len(names) :] + names[: index % len(names)]:
            call, sync, inner = contenders[name]
            settle(call, sync, inner, settle_ms)
            samples[name].append(take_sample(call, sync, inner))
    return {name: _timing(samples[name], contenders[name][2]) for name in names}


def jax_sync(out: Any) -> None:
    """Waits for a JAX result."""
    jax.block_until_ready(out)


def torch_sync(_: Any) -> None:
    """Waits for everything queued on the current CUDA device."""
    import torch

    torch.cuda.synchronize()


def time_jax(
    fn: Callable[..., Any],
    *args,
    warmup: int = 3,
    repeats: int = 10,
    target_sample_ms: float = 20.0,
    max_inner: int = 50,
    per_call: bool = False,
) -> Timing:
    """Median ms per call of ``fn(*args)`` (jitted), synced by ``block_until_ready``."""
    return _time_with_sync(
        lambda: fn(*args),
        jax_sync,
        warmup=warmup,
        repeats=repeats,
        target_sample_ms=target_sample_ms,
        max_inner=max_inner,
        per_call=per_call,
    )


def time_torch(
    fn: Callable[..., Any],
    *args,
    warmup: int = 3,
    repeats: int = 10,
    target_sample_ms: float = 20.0,
    max_inner: int = 50,
    per_call: bool = False,
) -> Timing:
    """Median ms per call of ``fn(*args)`` on the current CUDA device, synced by
    ``torch.cuda.synchronize``."""
    return _time_with_sync(
        lambda: fn(*args),
        torch_sync,
        warmup=warmup,
        repeats=repeats,
        target_sample_ms=target_sample_ms,
        max_inner=max_inner,
        per_call=per_call,
    )


def host_launch_ms(fn: Callable[..., Any], *args, repeats: int = 20) -> float:
    """Median host milliseconds for ``fn(*args)`` (jitted) to return, the device idle before each
    call: the launch cost a one-call-at-a-time loop pays on top of the device's time."""
    samples = []
    for _ in range(repeats):
        jax.block_until_ready(fn(*args))
        t0 = time.perf_counter()
        out = fn(*args)
        samples.append((time.perf_counter() - t0) * 1e3)
        jax.block_until_ready(out)
    return statistics.median(samples)

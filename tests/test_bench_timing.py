"""The benchmark timers: back to back, one call at a time, and host launch time."""

import time
import types

import jax
import jax.numpy as jnp
import pytest

from jaxmoe.bench import timing


def test_per_call_timing_waits_for_every_call():
    calls = []

    def call():
        calls.append(time.perf_counter())
        return len(calls)

    waits = []
    result = timing._time_with_sync(
        call, waits.append, warmup=1, repeats=3, target_sample_ms=1.0, max_inner=4, per_call=True
    )
    assert result.per_call_median_ms is not None and result.per_call_median_ms >= 0
    # The per-call samples (the last 20 calls) are each followed by their own wait.
    assert waits[-20:] == list(range(len(calls) - 19, len(calls) + 1))
    plain = timing._time_with_sync(
        call, waits.append, warmup=1, repeats=3, target_sample_ms=1.0, max_inner=4
    )
    assert plain.per_call_median_ms is None


def test_host_launch_ms_is_a_positive_duration():
    fn = jax.jit(lambda x: x * 2)
    assert 0 < timing.host_launch_ms(fn, jnp.ones(8), repeats=3) < 1e3


def test_interleaved_timing_rotates_the_contenders_every_round(monkeypatch):
    # A fake clock that only the contenders advance: real sleeps on a loaded CI machine
    # overshoot by more than the gaps between the contenders (seen in CI).
    order, now = [], [0.0]
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    def contender(name, ms):
        def call():
            order.append(name)
            now[0] += ms / 1e3
            return name

        return call, lambda out: None, 2

    timings = timing.time_interleaved(
        {"a": contender("a", 1.0), "b": contender("b", 3.0), "c": contender("c", 2.0)}, rounds=3
    )
    # One sample (two calls) of every contender per round, starting one later each round.
    assert "".join(order) == "aabbcc" + "bbccaa" + "ccaabb"
    assert {name: t.samples for name, t in timings.items()} == {"a": 3, "b": 3, "c": 3}
    medians = {name: t.median_ms for name, t in timings.items()}
    assert medians == pytest.approx({"a": 1.0, "b": 3.0, "c": 2.0})
    assert timings["b"].inner == 2


def test_warm_up_sizes_samples_from_the_fastest_probe_call(monkeypatch):
    # The first timed call stalls (a host hiccup): the sample size must come from the fast ones.
    # On a fake clock, as above (real 2 ms sleeps on a loaded machine overshoot), in binary
    # fractions of a second so that its differences are exact: a 62.5 ms stall, 1.95 ms calls.
    durations, now = iter([0.0, 2.0**-4, 2.0**-9, 2.0**-9]), [0.0]
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))

    def call():
        now[0] += next(durations, 2.0**-9)

    inner = timing.warm_up(call, lambda _: None, warmup=1, target_sample_ms=20.0, max_inner=50)
    assert inner == 10  # 20 ms // 1.95 ms; the stall alone would give 0 -> 1


def test_interleaved_timing_settles_each_contender_before_its_sample():
    # Each sample follows at least settle_ms of the same contender's untimed calls (synced):
    # the order shows a run of one contender's calls longer than its two timed ones.
    order, waits = [], []

    def contender(name):
        def call():
            order.append(name)
            time.sleep(1e-3)
            return name

        return call, waits.append, 2

    timing.time_interleaved({"a": contender("a"), "b": contender("b")}, rounds=2, settle_ms=5.0)
    # Rounds a, b then b, a: three runs of one contender's calls (b's two samples adjoin).
    runs = [order[0]] + [n for p, n in zip(order, order[1:], strict=False) if n != p]
    assert runs == ["a", "b", "a"]
    # Per sample: at least one synced pair of settling calls, then the two timed calls.
    assert order.count("a") >= 2 * (2 + 2) and order.count("b") >= 2 * (2 + 2)
    assert len(waits) >= 4 * 2
    # Settling lasts at least settle_ms, in whole synced batches.
    order.clear()
    waits.clear()
    t0 = time.perf_counter()
    timing.settle(*contender("a"), 5.0)
    assert (time.perf_counter() - t0) * 1e3 >= 5.0
    assert len(order) == 2 * len(waits) >= 2
    # No settling by default.
    order.clear()
    timing.time_interleaved({"a": contender("a")}, rounds=1)
    assert order == ["a", "a"]


def test_settle_ms_defaults_to_the_gpu_only_and_refuses_negative():
    assert timing.settle_ms_for("gpu", None) == timing.SETTLE_MS > 0
    assert timing.settle_ms_for("cpu", None) == 0.0
    assert timing.settle_ms_for("cpu", 20) == 20.0
    with pytest.raises(ValueError, match="settle_ms"):
        timing.settle_ms_for("gpu", -1)

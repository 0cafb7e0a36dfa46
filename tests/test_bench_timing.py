"""The benchmark timers: back to back, one call at a time, and host launch time."""

import time

import jax
import jax.numpy as jnp

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

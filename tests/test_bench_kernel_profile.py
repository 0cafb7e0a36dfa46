"""``jaxmoe.bench.kernel_profile``: the per-op sums of a trace's kernel events."""

import jax
import jax.numpy as jnp
import pytest

from jaxmoe.bench import kernel_profile


def test_summarize_groups_by_op_per_call_and_measures_the_span():
    # Two calls: each runs gemm (3 ms) and a fusion (1 ms); a command buffer's kernels count
    # under their own names; the calls span 0..10 ms with 2 ms of idle time in between.
    events = [
        ("gemm_kernel", "dot.1", 0.0, 3e6),
        ("loop_fusion", "fusion.2", 3e6, 1e6),
        ("gemm_kernel", "dot.1", 6e6, 3e6),
        ("loop_fusion", "fusion.2", 9e6, 1e6),
        ("anonymous_kernel", "command_buffer_1", 4e6, 0.5e6),
        ("anonymous_kernel", "command_buffer_1", 5e6, 0.5e6),
    ]
    got = kernel_profile.summarize(events, calls=2)
    assert got["total_ms"] == pytest.approx(4.5)
    assert got["span_ms"] == pytest.approx(5.0)
    assert got["kernels"] == 3
    rows = {row["op"]: row for row in got["rows"]}
    assert list(rows) == ["dot.1", "fusion.2", "anonymous_kernel"]  # by time, longest first
    assert rows["dot.1"]["ms"] == pytest.approx(3.0)
    assert rows["dot.1"]["share"] == pytest.approx(3.0 / 4.5)
    assert rows["anonymous_kernel"]["launches"] == 1
    assert "| dot.1 | 3.000 |" in kernel_profile.format_breakdown("case", got)


def test_launch_sequence_averages_each_position_over_the_calls():
    # Two calls of three launches; two of them share one name and no op (as Mosaic's kernels
    # do): the order tells them apart. The 5 us one is left out, its index still counted.
    one_call = [
        ("mosaic", "", 0.0, 400e3),
        ("tiny", "fusion.1", 1e6, 5e3),
        ("mosaic", "", 2e6, 900e3),
    ]
    second = [
        (kernel, op, start + 10e6, duration * 1.5) for kernel, op, start, duration in one_call
    ]
    got = kernel_profile.launch_sequence(second + one_call, calls=2)
    assert [(row["index"], row["op"]) for row in got] == [(0, "mosaic"), (2, "mosaic")]
    assert [row["us"] for row in got] == pytest.approx([500.0, 1125.0])
    assert kernel_profile.launch_sequence(one_call[:2] + one_call, calls=2) == []  # 5 events
    table = kernel_profile.format_breakdown(
        "case", {**kernel_profile.summarize(one_call, calls=1), "sequence": got}
    )
    assert "| 2 | mosaic | 1125.0 |" in table


def test_summarize_refuses_zero_calls_and_takes_no_events():
    with pytest.raises(ValueError, match="calls"):
        kernel_profile.summarize([], calls=0)
    assert kernel_profile.summarize([], calls=1) == {
        "total_ms": 0.0,
        "span_ms": 0.0,
        "kernels": 0.0,
        "rows": [],
        "sequence": [],
    }


def test_kernel_breakdown_runs_under_the_profiler_on_a_cpu():
    # No device planes on a CPU: an empty breakdown, but the trace is taken and read back.
    fn = jax.jit(lambda x: jnp.sin(x) @ x)
    got = kernel_profile.kernel_breakdown(fn, jnp.ones((64, 64)), calls=2)
    assert set(got) == {"total_ms", "span_ms", "kernels", "rows", "sequence"}


def test_traced_events_settles_first_for_the_time_asked():
    # settle_s: the function runs back to back for that long before the profiled calls.
    calls = []

    def fn(x):
        calls.append(1)
        return x + 1

    kernel_profile.traced_events(fn, jnp.ones(4), calls=2, settle_s=0.0)
    unsettled = len(calls)
    calls.clear()
    kernel_profile.traced_events(fn, jnp.ones(4), calls=2, settle_s=0.2)
    assert len(calls) >= unsettled + 4
    with pytest.raises(ValueError, match="settle_s"):
        kernel_profile.traced_events(fn, jnp.ones(4), calls=2, settle_s=-1.0)


def test_idle_gaps_measures_the_device_idle_between_kernels_per_call():
    # Two streams overlap (no gap between them); then 2 ms idle before fusion.2, and 0.5 ms
    # before the second call's gemm. Times in ns.
    events = [
        ("gemm_kernel", "dot.1", 0.0, 3e6),
        ("side_kernel", "", 1e6, 1e6),  # inside dot.1's time: no gap, and no op name
        ("loop_fusion", "fusion.2", 5e6, 1e6),
        ("gemm_kernel", "dot.1", 6.5e6, 3e6),
    ]
    got = kernel_profile.idle_gaps(events, calls=2, top=1)
    assert got["idle_ms"] == pytest.approx(2.5 / 2)
    assert got["gaps"] == 1.0
    assert got["largest"] == [{"us": pytest.approx(2000.0), "after": "dot.1", "before": "fusion.2"}]
    with pytest.raises(ValueError, match="calls"):
        kernel_profile.idle_gaps(events, calls=0)
    assert kernel_profile.idle_gaps([], calls=1) == {"idle_ms": 0.0, "gaps": 0.0, "largest": []}

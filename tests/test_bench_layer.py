"""The layer benchmark times the peers of one (preset, pass) together, in interleaved rounds."""

import jax.numpy as jnp

from jaxmoe.bench import layer, timing


def test_layer_bench_samples_its_peers_in_interleaved_rounds(monkeypatch):
    rounds_of_each_timing = []  # per interleaved timing: the contenders, rounds and samples
    real_time_interleaved, real_take_sample = timing.time_interleaved, timing.take_sample
    impl_of_call = {}

    def recording_time_interleaved(contenders, rounds=10, settle_ms=0.0):
        impl_of_call.clear()
        impl_of_call.update({call: impl for impl, (call, _, _) in contenders.items()})
        rounds_of_each_timing.append(
            {"impls": set(contenders), "rounds": rounds, "samples": [], "settle_ms": settle_ms}
        )
        return real_time_interleaved(contenders, rounds, settle_ms)

    def recording_take_sample(call, sync, inner):
        if call in impl_of_call:  # not the dense peak's timing
            rounds_of_each_timing[-1]["samples"].append(impl_of_call[call])
        return real_take_sample(call, sync, inner)

    monkeypatch.setattr(timing, "time_interleaved", recording_time_interleaved)
    monkeypatch.setattr(timing, "take_sample", recording_take_sample)
    # A dense layer that fails its check: it records the error and is left out of the rounds.
    real_dense_layer = layer.dense_layer
    monkeypatch.setattr(layer, "dense_layer", lambda p, x, k: 2 * real_dense_layer(p, x, k))

    # 64 tokens (the tiny preset's 256 are not needed: each call is also timed 20 times alone).
    _, rows = layer.run_layer_benchmark(
        ["tiny"], ["jaxmoe", "jaxmoe-xla", "dense"], tokens=64, repeats=2, log=lambda line: None
    )

    # One interleaved timing per pass, of both working impls, one sample of each per round,
    # starting one impl later each round.
    assert len(rounds_of_each_timing) == len(layer.PASSES)
    for timed in rounds_of_each_timing:
        assert timed["impls"] == {"jaxmoe", "jaxmoe-xla"} and timed["rounds"] == 2
        assert timed["settle_ms"] == 0.0  # on a CPU; a GPU settles SETTLE_MS before each sample
        assert timed["samples"] == ["jaxmoe", "jaxmoe-xla", "jaxmoe-xla", "jaxmoe"]
    assert len(rows) == 3 * len(layer.PASSES)
    for row in rows:
        if row["impl"] == "dense":
            assert row["ms"] is None and "wrong result" in row["error"], row
            continue
        assert row["ms"] > 0 and row["ms_per_call"] > 0 and row["tflops"] > 0, row
        assert row["timing"]["samples"] == 2, row
        assert row["timing"]["per_call_median_ms"] == row["ms_per_call"]
        assert row["ratio"] > 0 and row["rel_err"] < layer.REL_TOL[jnp.dtype(jnp.bfloat16)]


def test_forward_backward_takes_the_cotangent_given_or_from_the_output():
    # y = w * x: grad_w = sum(cotangent * x), grad_x = w * cotangent.
    def scale(w, x):
        return w * x

    w, x, dy = jnp.float32(3.0), jnp.array([1.0, 2.0]), jnp.array([0.5, -1.0])
    y, grad_w, grad_x = layer.forward_backward(scale)(w, x, dy)
    assert float(grad_w) == float(jnp.sum(dy * x))
    assert jnp.array_equal(grad_x, w * dy)
    _, grad_w, grad_x = layer.forward_backward(scale, cotangent_from_output=True)(w, x, dy)
    assert float(grad_w) == float(jnp.sum((dy + y) * x))
    assert jnp.array_equal(grad_x, w * (dy + y))

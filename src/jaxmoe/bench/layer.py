"""Layer benchmark: the whole MoE layer (router, permutation, experts, combine), forward and
forward+backward, jaxmoe against a dense JAX layer and a plain PyTorch layer.

Implementations (``impls`` names):

- ``jaxmoe``: :func:`jaxmoe.moe` with the platform's default grouped-matmul backend.
- ``jaxmoe-<backend>``: the same with a named backend, e.g. ``jaxmoe-xla`` (``lax.ragged_dot``),
  ``jaxmoe-pallas``, ``jaxmoe-reference``.
- ``jaxmoe-fp8-<recipe>``: the default backend with ``MoEConfig.fp8_recipe`` (``rowwise`` or
  ``blockwise``): the expert matmuls in FP8 (checked against the float32 reference with
  :data:`FP8_REL_TOL`). ``jaxmoe-fp8-<recipe>-cached``: the same with the expert weights
  quantized once, outside the timed calls (:func:`jaxmoe.quantize_expert_weights`), as a step
  with gradient accumulation runs each micro-batch after the first. The recipe's ``wgrad`` is
  its default ``"auto"`` (FP8 weight gradients where they are faster); ``-fp8wgrad`` /
  ``-highwgrad`` (before ``[-cached]``) force ``"fp8"`` (rowwise only) / ``"high"``.
- ``dense``: plain JAX, every expert applied to every token and masked by the combine weights
  (E/K times the useful work; skipped when its intermediates would not fit).
- ``torch``: :class:`jaxmoe.bench.torch_layer.TorchMoELayer` (``torch._grouped_mm``; skipped
  when torch, CUDA or the op is missing).
- ``torchtitan`` (opt-in): torchtitan's ``MoE`` module, one GPU, no expert parallelism
  (:class:`jaxmoe.bench.torchtitan_layer.TorchTitanMoELayer`; bf16 only; skipped, with the exact
  reason, when torch, CUDA or an importable torchtitan is missing).

All get the same weights and inputs, and every output (and, for forward+backward, every input
gradient) is checked against a float32 per-expert reference before anything is timed.

Timing (:mod:`jaxmoe.bench.timing`): per (preset, pass), every impl that passed its check is
warmed up, then all are timed together in ``repeats`` interleaved rounds
(:func:`jaxmoe.bench.timing.time_interleaved`): one sample of each per round, starting one impl
later each round, so that peers share the GPU's clock and temperature (an H100's drifts by up to
15% within a minute of sustained load, enough to skew the ratios of peers timed one after the
other). Before each sample an impl runs untimed for ``settle_ms`` (on a GPU 500 ms by
default), so that the sample runs at the clock its own load settles at: an H100 at its power
limit clocks kernels by the power they draw and takes 0.1-0.4 s to follow a change of load, so
a sample right after a peer's would start at the peer's clock (~10% either way on the Mixtral
layer's first calls: docs/kernels.md, 'Benchmark harness'). A sample is as many calls back to
back as fill about :data:`SAMPLE_TARGET_MS`, then one device sync: ``ms``, the median over the
rounds, is what a training loop sees. After the rounds each impl's calls are also timed one at a
time, each waited for (``ms_per_call``). The torch peers stay alive through the rounds; torch's
CUDA cache is freed after each preset.

Throughput counts the expert matmuls only: forward ``3 * 2*T*K*H*F`` FLOPs (gate, up, down),
forward+backward three times that. MFU divides it by the dense peak measured in the same run
(one large ``jnp.dot`` in the benchmark dtype).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

import jaxmoe
from jaxmoe.bench import timing
from jaxmoe.bench.dense_layers import dense_bytes, dense_layer, reference_layer
from jaxmoe.bench.harness import (
    fill_ratios,
    package_version,
    relative_error,
    release_torch_memory,
)
from jaxmoe.bench.layer_cases import (
    SkipImpl,
    forward_backward,
    jax_case,
    measure_dense_peak,
    torch_case,
)
from jaxmoe.bench.presets import LAYER_PRESETS, LayerPreset

PASSES = ("fwd", "fwd+bwd")
DEFAULT_IMPLS = ("torch", "jaxmoe", "jaxmoe-xla", "dense")
# The PyTorch peers: prepared before the JAX ones; torch's CUDA cache is freed after each preset.
TORCH_IMPLS = ("torch", "torchtitan")
# Milliseconds of back-to-back calls per timed sample. Long enough that a sample holds several
# calls of the slowest case (a 16 ms fwd+bwd on an H100 makes six): at timing's 20 ms default it
# held one, so the "calls back to back" figure was really one call plus a sync.
SAMPLE_TARGET_MS = 100.0
DTYPES = {
    "bf16": jnp.bfloat16,
    "bfloat16": jnp.bfloat16,
    "fp32": jnp.float32,
    "float32": jnp.float32,
}
# Relative L2 error allowed against the float32 reference. bf16: activations rounded between the
# matmuls (~4e-3 each). fp32: XLA and torch may use TF32 on GPU (~1e-3).
REL_TOL = {jnp.dtype(jnp.bfloat16): 3e-2, jnp.dtype(jnp.float32): 5e-3}
# FP8 (e4m3, 3 mantissa bits): each quantized operand is off by up to 2^-4 per element, ~3-4% per
# matmul on random data (torch's FP8 grouped matmul: 3.75%); three matmuls in a row.
FP8_REL_TOL = 0.12
FP8_PREFIX = "jaxmoe-fp8-"
FP8_CACHED_SUFFIX = "-cached"
# Fp8Recipe(recipe, wgrad=...): the weight gradients' precision forced (default: "auto").
FP8_WGRAD_SUFFIXES = {"-fp8wgrad": "fp8", "-highwgrad": "high"}
# The dense layer is skipped when its estimated live bytes exceed this share of device memory.
DENSE_MEMORY_SHARE = 0.3
CPU_MEMORY_BYTES = 4 << 30
# What the results header says about the numbers.
HEADER_FACTS = {
    "flops": "expert matmuls only: fwd 3*2*T*K*H*F, fwd+bwd 3x that",
    "timing": "median ms per call after warm-up, device-synchronised (jaxmoe.bench.timing); per "
    "(preset, pass) the impls are sampled in interleaved rounds, one sample of each per round, "
    "each after settle_ms (in the row's timing) of the impl's own calls untimed: "
    f"ms = calls back to back filling ~{SAMPLE_TARGET_MS:.0f} ms per sample (a training loop), "
    "ms_per_call = each call waited for on its own (timed after the rounds)",
}
# The table ``jaxmoe bench layer`` prints (see jaxmoe.bench.harness.format_table).
COLUMNS = (
    ("preset", "preset", ""),
    ("tokens", "tokens", ""),
    ("pass", "pass", ""),
    ("impl", "impl", ""),
    ("ms", "ms", "{:.3f}"),
    ("ms_per_call", "ms (per call)", "{:.3f}"),
    ("tflops", "TFLOP/s", "{:.3f}"),
    ("mfu", "MFU", "{:.1%}"),
    ("ratio", "ratio", "{:.2f}x"),
)


def layer_config(preset: LayerPreset, dtype) -> jaxmoe.MoEConfig:
    """The benchmarked layer: softmax top-k routing, SwiGLU experts, dropless, no losses."""
    return jaxmoe.MoEConfig(
        num_experts=preset.num_experts,
        top_k=preset.top_k,
        hidden_size=preset.hidden_size,
        ffn_size=preset.ffn_size,
        dtype=dtype,
        param_dtype=dtype,
    )


def layer_inputs(preset: LayerPreset, dtype, seed: int = 0):
    """``(cfg, params, x, dy)``: the benchmarked layer's config, its parameters, a ``[T, H]``
    input and an output cotangent (standard normal, in ``dtype``), from ``seed``."""
    cfg = layer_config(preset, dtype)
    kp, kx, kd = jax.random.split(jax.random.key(seed), 3)
    params = jaxmoe.init_params(kp, cfg)
    x = jax.random.normal(kx, (preset.tokens, preset.hidden_size), jnp.float32).astype(dtype)
    dy = jax.random.normal(kd, x.shape, jnp.float32).astype(dtype)
    return cfg, params, x, dy


def expert_flops(preset: LayerPreset, pass_: str) -> float:
    """Useful expert-matmul FLOPs: ``3 * 2*T*K*H*F`` forward, three times that fwd+bwd."""
    forward = 3 * 2 * preset.tokens * preset.top_k * preset.hidden_size * preset.ffn_size
    return float(forward * (1 if pass_ == "fwd" else 3))


def device_memory_bytes() -> int:
    stats = jax.devices()[0].memory_stats() or {}
    return int(stats.get("bytes_limit", CPU_MEMORY_BYTES))


def _fp8_wgrad_suffix(impl: str) -> str | None:
    stem = impl.removesuffix(FP8_CACHED_SUFFIX)
    return next((suffix for suffix in FP8_WGRAD_SUFFIXES if stem.endswith(suffix)), None)


def _fp8_recipe_name(impl: str) -> str:
    stem = impl.removeprefix(FP8_PREFIX).removesuffix(FP8_CACHED_SUFFIX)
    return stem.removesuffix(_fp8_wgrad_suffix(impl) or "")


def _fp8_recipe(impl: str) -> jaxmoe.ops.fp8.Fp8Recipe:
    """The ``MoEConfig.fp8_recipe`` of a ``jaxmoe-fp8-...`` impl name."""
    suffix = _fp8_wgrad_suffix(impl)
    wgrad = {"wgrad": FP8_WGRAD_SUFFIXES[suffix]} if suffix else {}
    return jaxmoe.ops.fp8.Fp8Recipe(_fp8_recipe_name(impl), **wgrad)


def check_impls(impls: Sequence[str]) -> None:
    """Raises ValueError on a name that is not ``torch``, ``torchtitan``, ``dense``, ``jaxmoe``
    or ``jaxmoe-<backend>`` with a known grouped-matmul backend."""
    backends = jaxmoe.ops.grouped_matmul.BACKEND_NAMES
    recipes = jaxmoe.ops.fp8.RECIPE_NAMES
    for impl in impls:
        known = (
            impl in (*TORCH_IMPLS, "dense", "jaxmoe")
            or (impl.startswith(FP8_PREFIX) and _fp8_recipe_name(impl) in recipes)
            or (impl.startswith("jaxmoe-") and impl.removeprefix("jaxmoe-") in backends)
        )
        if known and impl.startswith(FP8_PREFIX):
            _fp8_recipe(impl)  # blockwise has no FP8 wgrad: Fp8Recipe says so
        if not known:
            raise ValueError(
                f"unknown layer impl {impl!r}; use torch, torchtitan, dense, jaxmoe, "
                f"jaxmoe-<backend> (backends: {', '.join(backends)}), "
                "jaxmoe-fp8-<recipe>[-fp8wgrad|-highwgrad][-cached] "
                f"(recipes: {', '.join(recipes)})."
            )


def run_layer_benchmark(
    presets: Sequence[str | LayerPreset] = ("tiny",),
    impls: Sequence[str] = DEFAULT_IMPLS,
    passes: Sequence[str] = PASSES,
    *,
    dtype: str = "bf16",
    tokens: int | None = None,
    repeats: int = 10,
    settle_ms: float | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    log: Callable[[str], None] = print,
    on_row: Callable[[list[dict[str, Any]]], None] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Checks then times every (preset, pass, impl): per (preset, pass) the impls that pass their
    check are timed together in ``repeats`` interleaved rounds (see the module docstring).

    Args:
      presets: names in :data:`LAYER_PRESETS` or :class:`LayerPreset` objects.
      impls: implementation names (see the module docstring); the first one that runs is the
        baseline of ``ratio`` (its ms over this row's ms: > 1 means faster than the baseline).
      passes: ``"fwd"`` and/or ``"fwd+bwd"``.
      dtype: ``"bf16"`` or ``"fp32"`` for inputs, weights and expert compute.
      tokens: overrides every preset's token count.
      repeats: interleaved rounds, one timed sample of each impl per round (median reported).
      settle_ms: each impl runs untimed this long before each of its samples (None:
        :data:`jaxmoe.bench.timing.SETTLE_MS` on a GPU, 0 elsewhere).
      progress: called once per finished row (e.g. a progress bar's update).
      log: where each row's one-line summary goes.
      on_row: called with the rows so far after every (preset, pass) (e.g. to rewrite a results
        file, so that a run cut by a time limit keeps what it measured).

    Returns:
      ``(extra_header, rows)``: ``extra_header`` holds the measured dense peak; each row is
      ``{"preset", "pass", "impl", "ms", "ms_per_call", "timing", "tflops", "mfu", "ratio",
      "ratio_vs_torch", "rel_err", ...}`` with ``"skipped"`` (a reason) or ``"error"`` instead of
      timings when it did not run.
    """
    if dtype not in DTYPES:
        raise ValueError(f"`dtype` must be one of {sorted(DTYPES)}; got {dtype!r}.")
    jdtype = jnp.dtype(DTYPES[dtype])
    check_impls(impls)
    settle_ms = timing.settle_ms_for(jax.default_backend(), settle_ms)
    for pass_ in passes:
        if pass_ not in PASSES:
            raise ValueError(f"unknown pass {pass_!r}; choose from {PASSES}.")
    presets = [LAYER_PRESETS[p] if isinstance(p, str) else p for p in presets]
    if tokens is not None:
        presets = [dataclasses.replace(p, tokens=tokens) for p in presets]
    peak = measure_dense_peak(jdtype)
    log(f"dense peak ({peak['size']}^3 jnp.dot, {jdtype.name}): {peak['tflops']:.2f} TFLOP/s")

    rows: list[dict[str, Any]] = []
    for preset in presets:
        cfg, params, x, dy = layer_inputs(preset, jdtype, seed)
        want = {}
        ref_y, ref_vjp = jax.vjp(
            jax.jit(lambda p, x, k=preset.top_k: reference_layer(p, x, k)), params, x
        )
        want["y"] = ref_y
        if "fwd+bwd" in passes:
            want["dx"] = ref_vjp(dy.astype(jnp.float32))[1]
        # torch peers first: prepared first, and the first sampled in the first round.
        order = [i for i in impls if i in TORCH_IMPLS] + [i for i in impls if i not in TORCH_IMPLS]
        for pass_ in passes:
            here = [_row(impl, pass_, preset, cfg) for impl in order]
            contenders = {}
            for row in here:
                contender = _prepare(row, preset, cfg, params, x, dy, want)
                if contender is not None:
                    contenders[row["impl"]] = contender
            _time_rows(here, contenders, repeats, settle_ms)
            contenders = None  # free this pass's cases before the next one
            for row in here:
                row["tflops"] = (
                    expert_flops(preset, pass_) / (row["ms"] * 1e-3) / 1e12 if row["ms"] else None
                )
                row["mfu"] = row["tflops"] / peak["tflops"] if row["tflops"] else None
                rows.append(row)
                log(row_line(row))
                if progress:
                    progress(f"{preset.name} {row['impl']} {pass_}")
            if on_row:
                on_row(rows)
        # After all of the preset's passes, so that the two frameworks' allocators do not compete.
        release_torch_memory()
    fill_ratios(rows, ("preset", "pass"), impls)
    return {"dense_peak": peak, "dtype": jdtype.name}, rows


def _row(impl: str, pass_: str, preset: LayerPreset, cfg: jaxmoe.MoEConfig) -> dict[str, Any]:
    return {
        "preset": preset.name,
        "pass": pass_,
        "impl": impl,
        "tokens": preset.tokens,
        "hidden_size": preset.hidden_size,
        "ffn_size": preset.ffn_size,
        "num_experts": preset.num_experts,
        "top_k": preset.top_k,
        "dtype": cfg.dtype.name,
        "ms": None,
    }


def _prepare(row, preset, cfg, params, x, dy, want):
    """Builds and checks ``row``'s case, then warms it up: ``(call, sync, inner)`` for
    :func:`jaxmoe.bench.timing.time_interleaved`, or ``None`` with ``row["skipped"]`` or
    ``row["error"]`` set when it cannot run or fails (wrong result, out of memory, ...)."""
    impl, pass_ = row["impl"], row["pass"]
    tolerance = REL_TOL[cfg.dtype]
    try:
        if impl in TORCH_IMPLS:
            try:
                import torch  # noqa: F401
            except ImportError as error:
                raise SkipImpl(f"torch is not installed ({error})") from error
            if impl == "torchtitan":
                row["torchtitan"] = package_version("torchtitan")
            call, sync, outputs = torch_case(params, x, dy, cfg.top_k, cfg.dtype, pass_, impl)
        elif impl == "dense":
            need = dense_bytes(preset, cfg.dtype.itemsize)
            have = device_memory_bytes()
            if need > DENSE_MEMORY_SHARE * have:
                raise SkipImpl(
                    f"dense layer needs ~{need / 2**30:.1f} GiB of intermediates, over "
                    f"{DENSE_MEMORY_SHARE:.0%} of {have / 2**30:.1f} GiB"
                )
            layer_fn = lambda p, x: dense_layer(p, x, cfg.top_k)  # noqa: E731
            call, sync, outputs = jax_case(layer_fn, params, x, dy, pass_)
        elif impl.startswith(FP8_PREFIX):
            recipe = _fp8_recipe(impl)
            row["fp8_recipe"] = _fp8_recipe_name(impl)
            row["fp8_wgrad"] = recipe.wgrad
            # What "auto" (or a forced precision) runs at this preset's K and N.
            in_fp8 = recipe.fp8_wgrad(preset.hidden_size, preset.ffn_size)
            row["fp8_wgrad_runs"] = "fp8" if in_fp8 else "high"
            tolerance = FP8_REL_TOL
            layer_cfg = dataclasses.replace(cfg, fp8_recipe=recipe)
            constants = ()
            if impl.endswith(FP8_CACHED_SUFFIX):  # made once, outside the timed calls
                constants = (
                    jax.jit(jaxmoe.quantize_expert_weights, static_argnums=1)(params, layer_cfg),
                )

            def layer_fn(p, x, *cached):  # cached: () or (the FP8 weights,)
                return jaxmoe.moe(p, x, layer_cfg, fp8_weights=cached[0] if cached else None)[0]

            call, sync, outputs = jax_case(layer_fn, params, x, dy, pass_, constants)
        else:
            backend = impl.removeprefix("jaxmoe-") if impl.startswith("jaxmoe-") else None
            layer_cfg = dataclasses.replace(cfg, grouped_matmul_backend=backend)
            if backend is not None:
                jaxmoe.ops.grouped_matmul.resolve_backend(backend)  # unknown names fail here
            layer_fn = lambda p, x: jaxmoe.moe(p, x, layer_cfg)[0]  # noqa: E731
            call, sync, outputs = jax_case(layer_fn, params, x, dy, pass_)
        errors = {name: relative_error(value, want[name]) for name, value in outputs().items()}
        row["rel_err"] = max(errors.values())
        if not row["rel_err"] <= tolerance:
            raise AssertionError(f"wrong result, relative errors {errors} > {tolerance}")
        return call, sync, timing.warm_up(call, sync, target_sample_ms=SAMPLE_TARGET_MS)
    except SkipImpl as skip:
        row["skipped"] = str(skip)
    except Exception as error:  # noqa: BLE001 - record it and go on (out of memory, no kernel)
        row["error"] = _error_text(error)
    return None


def _time_rows(rows, contenders, repeats: int, settle_ms: float) -> None:
    """Times the prepared cases into their rows: ``repeats`` interleaved rounds of samples
    (``ms``), each after ``settle_ms`` of the impl's own load, then each impl's calls one at a
    time (``ms_per_call``), again after ``settle_ms`` of its own load."""
    by_impl = {row["impl"]: row for row in rows}
    try:
        timings = timing.time_interleaved(contenders, rounds=repeats, settle_ms=settle_ms)
    except Exception as error:  # noqa: BLE001 - e.g. out of memory with both frameworks' buffers
        for impl in contenders:
            by_impl[impl]["error"] = _error_text(error)
        return
    for impl, (call, sync, inner) in contenders.items():
        row = by_impl[impl]
        try:
            timing.settle(call, sync, inner, settle_ms)  # the previous impl's clock, gone
            per_call_ms = timing.per_call_median_ms(call, sync, calls=max(repeats, 20))
        except Exception as error:  # noqa: BLE001 - record it and go on
            row["error"] = _error_text(error)
            continue
        row_timing = dataclasses.replace(timings[impl], per_call_median_ms=per_call_ms)
        row["ms"] = row_timing.median_ms
        row["ms_per_call"] = row_timing.per_call_median_ms
        row["timing"] = {**row_timing.as_dict(), "settle_ms": settle_ms}


def _error_text(error: Exception) -> str:
    return f"{type(error).__name__}: {str(error)[:300]}"


def row_line(row: dict[str, Any]) -> str:
    what = f"{row['preset']:>8} {row['pass']:>8} {row['impl']:>14}"
    if row.get("skipped"):
        return f"{what}  skipped: {row['skipped']}"
    if row.get("error"):
        return f"{what}  ERROR {row['error']}"
    return f"{what} {row['ms']:10.3f} ms  err {row['rel_err']:.1e}"


__all__ = [
    "DEFAULT_IMPLS",
    "PASSES",
    "TORCH_IMPLS",
    "COLUMNS",
    "check_impls",
    "dense_layer",
    "expert_flops",
    "forward_backward",
    "layer_inputs",
    "measure_dense_peak",
    "reference_layer",
    "run_layer_benchmark",
]

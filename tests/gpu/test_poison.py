"""Poisoned-buffer, determinism and exactness check of the layer on a GPU (skipped elsewhere).

Run on a GPU host with ``JAX_PLATFORMS=cuda,cpu pytest tests/gpu -n 0`` (the suite's conftest
defaults to CPU). For each config and dtype the layer's forward and backward (jit) must be:

* deterministic: two runs give bitwise-identical outputs and gradients;
* unchanged by poison: with JAXMOE_POISON on (never-read buffer rows filled with NaN) the results
  are bitwise identical to the run without it, and finite;
* exact: in float32 against a float64 run of the same layer (float64 expert matmuls on the host
  CPU, ``jax.enable_x64`` around that run only; every float32 dot in full float32, not XLA's GPU
  default TF32), each leaf within the tolerance or within twice the error of the same float32
  layer with the plain ``reference`` grouped matmul (an ill-conditioned leaf, such as the skewed
  case's output and input gradient, has a float32 error above the tolerance however exact the
  kernels are); in bfloat16 against the plain reference grouped matmul within a bf16 tolerance;
* with two or more GPUs: the layer sharded over two (``ep_axis``) with poison on matches the
  single-device one.

Configs: dropless softmax, capacity 1.0 (counted drops), sigmoid with groups, bias and a shared
expert, and a skewed routing (one giant group, 14 empty ones). The recorded results:
``benchmarks/results/poison-h100`` and ``poison-h200x2-ep``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe
from jaxmoe import debug
from jaxmoe.bench.harness import first_devices_mesh, relative_error
from jaxmoe.ops.grouped_matmul import GroupedMatmulBackend
from jaxmoe.ops.grouped_matmul.base import group_ids

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "gpu", reason="a GPU check: run with JAX_PLATFORMS=cuda,cpu on a GPU"
)
CONFIGS = (
    "dropless-softmax-swiglu",
    "capacity-1.0",
    "sigmoid-grouped-bias-shared-geglu",
    "skewed-all-to-one",
)

TOLERANCE = {"float32": 1e-5, "bfloat16": 2e-2}
PRECISION = {"float32": "highest", "bfloat16": "default"}


def _configs(small: bool):
    tokens, hidden, ffn = (256, 64, 96) if small else (4096, 1024, 512)
    base = dict(hidden_size=hidden, ffn_size=ffn, alignment=None if not small else 8)
    return {
        "dropless-softmax-swiglu": (jaxmoe.MoEConfig(16, 4, **base), tokens),
        "capacity-1.0": (jaxmoe.MoEConfig(16, 2, capacity_factor=1.0, **base), tokens),
        "sigmoid-grouped-bias-shared-geglu": (
            jaxmoe.MoEConfig(
                16,
                4,
                score="sigmoid",
                num_groups=4,
                group_top_k=2,
                use_expert_bias=True,
                num_shared_experts=1,
                activation="geglu",
                aux_loss_coef=1e-2,
                **base,
            ),
            tokens,
        ),
        "skewed-all-to-one": (jaxmoe.MoEConfig(16, 2, **base), tokens),
    }


def _group_onehot(group_sizes, num_rows):
    """``[M, G]`` float64: row m is in group g (rows past the groups: in none)."""
    ids = group_ids(group_sizes, num_rows)
    return ids[:, None] == jnp.arange(group_sizes.shape[0])[None, :]


@dataclasses.dataclass(frozen=True)
class Float64GroupedMatmul(GroupedMatmulBackend):
    """Dense masked grouped matmul in float64 (needs ``jax.enable_x64``): the exact side."""

    name: str = dataclasses.field(default="float64", init=False)

    def gmm(self, lhs, rhs, group_sizes, *, transpose_rhs, out_dtype):
        onehot = _group_onehot(group_sizes, lhs.shape[0])
        lhs = jnp.where(onehot.any(axis=1, keepdims=True), lhs.astype(jnp.float64), 0.0)
        spec = "mk,gnk->gmn" if transpose_rhs else "mk,gkn->gmn"
        every_group = jnp.einsum(spec, lhs, rhs.astype(jnp.float64))
        return jnp.einsum("gmn,mg->mn", every_group, onehot.astype(jnp.float64)).astype(out_dtype)

    def tgmm(self, lhs, rhs, group_sizes, *, out_dtype):
        onehot = _group_onehot(group_sizes, lhs.shape[0])
        keep = onehot.any(axis=1, keepdims=True)
        lhs = jnp.where(keep, lhs.astype(jnp.float64), 0.0)
        rhs = jnp.where(keep, rhs.astype(jnp.float64), 0.0)
        out = jnp.einsum("mk,mg,mn->gkn", lhs, onehot.astype(jnp.float64), rhs)
        return out.astype(out_dtype)


def _float64_reference(cfg, params, x):
    """The layer's results (float32 leaves) with float64 expert compute and parameters, on the
    host CPU: XLA on CUDA 13 (jax 0.11.2) refuses float64 GEMMs ("not supported by cublasLt")."""
    try:
        host = jax.devices("cpu")[0]
    except RuntimeError as error:
        raise RuntimeError(
            "the float32 check computes its float64 side on the host CPU: run with "
            "JAX_PLATFORMS=cuda,cpu (JAX_PLATFORMS=cuda hides the CPU backend)"
        ) from error
    with jax.enable_x64(True), jax.default_device(host):
        cfg64 = dataclasses.replace(
            cfg, dtype=jnp.float64, grouped_matmul_backend=Float64GroupedMatmul()
        )
        params64, x64 = jax.tree.map(
            lambda value: jnp.asarray(np.asarray(value, np.float64)), (params, x)
        )
        return _leaves(_step(cfg64)(params64, x64))


def _float32_floor(cfg, params, x):
    """The same float32 layer on the same device with the plain ``reference`` grouped matmul,
    every dot in full float32: what float32 rounding alone costs each leaf against the float64
    run. It shares the router's float32 logits (and their summation order) with the checked run;
    the float64 run, on the host CPU, does not, which on the skewed case (logits ~4e3, softmax
    of their ~1e0 differences) moves the combine weights by ~1e-4 whatever the kernels do."""
    with jax.default_matmul_precision("highest"):
        floor_cfg = dataclasses.replace(cfg, grouped_matmul_backend="reference")
        return _leaves(_step(floor_cfg)(params, x))


def _within_floor(errors, floor_errors, tolerance):
    """Every leaf within ``tolerance`` or within twice float32's own error on it (a leaf that is
    a sum of nearly cancelling terms has a float32 error far above ``tolerance`` however exact
    the kernels are)."""
    return all(err <= max(tolerance, 2 * floor_errors[name]) for name, err in errors.items())


def _inputs(name, cfg, tokens, dtype):
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    if name == "skewed-all-to-one":
        # Every token prefers experts 0 and 1 by a wide margin: one giant group, 14 empty ones.
        kernel = params["router"]["kernel"]
        params["router"]["kernel"] = kernel.at[:, :2].add(5.0)
    params = jax.tree.map(lambda p: p.astype(dtype), params)
    x = jax.random.normal(jax.random.key(1), (tokens // 256, 256, cfg.hidden_size), dtype)
    if name == "skewed-all-to-one":
        x = jnp.abs(x)
    return params, x


def _step(cfg, mesh=None):
    def loss(params, x):
        y, stats = jaxmoe.moe(params, x, cfg, mesh=mesh)
        return jnp.mean(jnp.square(y.astype(jnp.float32))) + stats.aux_loss, (y, stats)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))


def _leaves(result):
    """``{name: float32 numpy array}`` of the loss, output, stats and every gradient."""
    (value, (y, stats)), grads = result
    named = jax.tree_util.tree_flatten_with_path(
        {"loss": value, "y": y, "stats": stats, "grads": grads}
    )[0]
    return {
        jax.tree_util.keystr(path): np.asarray(leaf.astype(jnp.float32)) for path, leaf in named
    }


def _bitwise_equal(a, b):
    return all(np.array_equal(a[name], b[name], equal_nan=False) for name in a)


def _relative_error(a, b):
    """The largest relative error over the leaves."""
    return max(_leaf_errors(a, b).values())


def _leaf_errors(a, b):
    return {name: float(relative_error(a[name], b[name])) for name in a}


def _worst_leaf(a, b):
    errors = _leaf_errors(a, b)
    return max(errors, key=errors.get)


def check_config(name: str, dtype: str, small: bool = False, ep: int | None = None) -> dict:
    """One config's row: determinism, poison, exactness (and, with ``ep``, the sharded layer)."""
    cfg, tokens = _configs(small)[name]
    cfg_d = dataclasses.replace(cfg, dtype=dtype)
    params, x = _inputs(name, cfg_d, tokens, jnp.dtype(dtype))
    # XLA's GPU default for float32 dots is TF32 (the router, the shared expert): the
    # float32 check runs every dot in full float32, as the float64 side does.
    with debug.poison_buffers(False), jax.default_matmul_precision(PRECISION[dtype]):
        first = _leaves(_step(cfg_d)(params, x))
        second = _leaves(_step(cfg_d)(params, x))
    with debug.poison_buffers(True), jax.default_matmul_precision(PRECISION[dtype]):
        poisoned = _leaves(_step(cfg_d)(params, x))
    if dtype == "float32":
        reference_name = "float64"
        reference = _float64_reference(cfg_d, params, x)
    else:
        reference_name = "reference backend"
        reference_cfg = dataclasses.replace(cfg_d, grouped_matmul_backend="reference")
        with debug.poison_buffers(True):
            reference = _leaves(_step(reference_cfg)(params, x))
    row = {
        "config": name,
        "dtype": dtype,
        "backend": jaxmoe.ops.grouped_matmul.default_backend_name(),
        "deterministic": _bitwise_equal(first, second),
        "poison_bitwise_equal": _bitwise_equal(first, poisoned),
        "poison_finite": all(np.all(np.isfinite(a)) for a in poisoned.values()),
        "reference": reference_name,
        "rel_err_vs_reference": _relative_error(poisoned, reference),
        "worst_leaf": _worst_leaf(poisoned, reference),
        "leaf_errors": _leaf_errors(poisoned, reference),
        "tolerance": TOLERANCE[dtype],
    }
    if ep:
        mesh = first_devices_mesh(ep)
        ep_cfg = dataclasses.replace(cfg_d, ep_axis="ep")
        with debug.poison_buffers(True):
            sharded = _leaves(_step(ep_cfg, mesh)(params, x))
        row["ep"] = ep
        row["ep_rel_err_vs_single"] = _relative_error(sharded, first)
        row["ep_finite"] = all(np.all(np.isfinite(a)) for a in sharded.values())
    exact = row["rel_err_vs_reference"] <= row["tolerance"]
    if dtype == "float32":
        floor = _leaf_errors(_float32_floor(cfg_d, params, x), reference)
        row["float32_floor_worst_leaf"] = floor[row["worst_leaf"]]
        exact = _within_floor(row["leaf_errors"], floor, row["tolerance"])
    row["ok"] = (
        row["deterministic"]
        and row["poison_bitwise_equal"]
        and row["poison_finite"]
        and exact
        and (not ep or (row["ep_finite"] and row["ep_rel_err_vs_single"] <= row["tolerance"]))
    )
    return row


def _assert_ok(row: dict) -> None:
    assert row["deterministic"], row
    assert row["poison_bitwise_equal"], row
    assert row["poison_finite"], row
    assert row["ok"], row  # exact: within the tolerance or the float32 floor, leaf by leaf


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", CONFIGS)
def test_layer_is_deterministic_poison_proof_and_exact(name, dtype):
    _assert_ok(check_config(name, dtype))


@pytest.mark.skipif(jax.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["dropless-softmax-swiglu", "skewed-all-to-one"])
def test_sharded_layer_with_poison_matches_one_gpu(name, dtype):
    row = check_config(name, dtype, ep=2)
    assert row["ep_finite"], row
    assert row["ep_rel_err_vs_single"] <= row["tolerance"], row

"""The row gather op: every backend against one plain reference, its argument checks, what
``auto`` picks, and the permutation's dispatch through it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxmoe
from jaxmoe import permutation
from jaxmoe.ops import row_gather
from jaxmoe.ops.row_gather import api, pallas_triton
from tests.xla_cpu import jit_xla_defaults


def reference_gather(values, index, row_scale=None) -> np.ndarray:
    """``values[index]`` by rows in NumPy, zero rows where ``index`` is outside ``[0, T)``;
    with ``row_scale``, each row times its scale in float32, rounded to ``values.dtype``."""
    dtype = values.dtype
    values, index = np.asarray(values.astype(jnp.float32)), np.asarray(index)
    out = np.zeros((index.shape[0], values.shape[1]), np.float32)
    inside = (index >= 0) & (index < values.shape[0])
    out[inside] = values[index[inside]]
    if row_scale is not None:
        out = (out * np.asarray(row_scale, np.float32)[:, None]).astype(dtype).astype(np.float32)
    return out


def operands(num_values, num_columns, num_out, dtype, seed=0):
    values = jax.random.normal(jax.random.key(seed), (num_values, num_columns)).astype(dtype)
    # Entries below 0 and at or past T (the permutation's sentinel is T) give zero rows.
    index = jax.random.randint(jax.random.key(seed + 1), (num_out,), -5, num_values + 5)
    return values, index.astype(jnp.int32)


@pytest.mark.parametrize("backend", ["xla", "pallas_triton"])
@pytest.mark.parametrize(
    ("num_values", "num_columns", "num_out", "dtype"),
    [
        (37, 1024, 64, jnp.bfloat16),  # two column blocks
        (5, 256, 16, jnp.float32),  # one block narrower than the kernel's 512 columns
        (300, 512, 48, jnp.float16),
        (1, 512, 32, jnp.bfloat16),  # one row: most entries out of range
    ],
)
def test_backends_match_reference(backend, num_values, num_columns, num_out, dtype):
    values, index = operands(num_values, num_columns, num_out, dtype)
    out = row_gather.gather_rows(values, index, backend=backend, interpret=True)
    assert out.shape == (num_out, num_columns) and out.dtype == dtype
    np.testing.assert_array_equal(
        np.asarray(out.astype(jnp.float32)), reference_gather(values, index)
    )


@pytest.mark.parametrize("backend", ["xla", "pallas_triton"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_row_scale_matches_reference(backend, dtype):
    values, index = operands(50, 1024, 48, dtype, seed=3)
    row_scale = jax.random.uniform(jax.random.key(9), (48,), jnp.float32, -2.0, 2.0)
    out = row_gather.gather_rows(
        values, index, row_scale=row_scale, backend=backend, interpret=True
    )
    assert out.dtype == dtype
    expected = reference_gather(values, index, row_scale)
    np.testing.assert_array_equal(np.asarray(out.astype(jnp.float32)), expected)


@pytest.mark.parametrize("scaled", [False, True])
def test_kernel_lowers_for_a_gpu(scaled):
    """The Triton lowering (array-indexed masked loads, the scaled form too), from this CPU host,
    at the Qwen3-like layer's dispatch shape."""
    args = [
        jax.ShapeDtypeStruct((8192, 2048), jnp.bfloat16),
        jax.ShapeDtypeStruct((73600,), jnp.int32),
    ]
    if scaled:
        args.append(jax.ShapeDtypeStruct((73600,), jnp.float32))

    def gather(values, index, *row_scale):
        return pallas_triton.gather_rows(values, index, row_scale=(row_scale or [None])[0])

    text = jax.jit(gather).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert ("jaxmoe_row_gather_scaled" in text) == scaled and "jaxmoe_row_gather" in text


def test_kernel_refuses_shapes_it_does_not_take():
    values, index = operands(8, 768, 32, jnp.bfloat16)  # 768 columns: not a multiple of 512
    with pytest.raises(NotImplementedError, match="768 columns"):
        row_gather.gather_rows(values, index, backend="pallas_triton", interpret=True)
    values, index = operands(8, 512, 24, jnp.bfloat16)  # 24 entries: not a multiple of 16
    with pytest.raises(NotImplementedError, match="24 entries"):
        row_gather.gather_rows(values, index, backend="pallas_triton", interpret=True)


@pytest.mark.parametrize(
    ("values_shape", "index", "match"),
    [
        ((8,), jnp.zeros((16,), jnp.int32), "`values` must be 2-D"),
        ((8, 512), jnp.zeros((4, 4), jnp.int32), "`index` must be a 1-D integer"),
        ((8, 512), jnp.zeros((16,), jnp.float32), "`index` must be a 1-D integer"),
    ],
)
def test_bad_arguments_name_the_argument(values_shape, index, match):
    with pytest.raises(ValueError, match=match):
        row_gather.gather_rows(jnp.zeros(values_shape), index)


@pytest.mark.parametrize("row_scale", [jnp.ones((8,)), jnp.ones((16,), jnp.int32)])
def test_bad_row_scale_names_the_argument(row_scale):
    with pytest.raises(ValueError, match="`row_scale` must be a float array shaped like"):
        row_gather.gather_rows(
            jnp.zeros((8, 512)), jnp.zeros((16,), jnp.int32), row_scale=row_scale
        )


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown `backend` 'triton'"):
        row_gather.gather_rows(jnp.zeros((8, 512)), jnp.zeros((16,), jnp.int32), backend="triton")


class KernelCalls:
    """``pallas_triton.gather_rows``, counting its calls; ``interpret``: always in Pallas'
    interpreter (for callers that do not ask for it, as the permutation)."""

    def __init__(self, interpret: bool = False):
        self.count = 0
        self.kernel = pallas_triton.gather_rows
        self.interpret = interpret

    def __call__(self, *args, **kwargs):
        self.count += 1
        if self.interpret:
            kwargs["interpret"] = True
        return self.kernel(*args, **kwargs)


@pytest.mark.parametrize(
    ("platform", "num_columns", "dtype", "kernel"),
    [
        ("gpu", 1024, jnp.bfloat16, True),
        ("gpu", 1024, jnp.float32, True),
        ("gpu", 768, jnp.bfloat16, False),  # a shape the kernel does not take
        ("gpu", 1024, jnp.int32, False),  # a dtype it was not measured on
        ("cpu", 1024, jnp.bfloat16, False),
    ],
)
def test_auto_picks_the_kernel_on_a_gpu_where_it_applies(
    monkeypatch, platform, num_columns, dtype, kernel
):
    calls = KernelCalls()
    monkeypatch.setattr(api, "_on_gpu", lambda: platform == "gpu")
    monkeypatch.setattr(pallas_triton, "gather_rows", calls)
    values, index = operands(40, num_columns, 32, dtype)
    out = row_gather.gather_rows(values, index, interpret=True)
    assert calls.count == int(kernel)
    np.testing.assert_array_equal(
        np.asarray(out.astype(jnp.float32)), reference_gather(values, index)
    )
    # Scaled rows go the same way.
    row_scale = jnp.linspace(-1.0, 1.0, 32)
    out = row_gather.gather_rows(values, index, row_scale=row_scale, interpret=True)
    assert calls.count == 2 * int(kernel)
    np.testing.assert_array_equal(
        np.asarray(out.astype(jnp.float32)), reference_gather(values, index, row_scale)
    )


def test_dispatch_gathers_through_the_op(monkeypatch):
    """The permutation's dispatch (forward) takes its rows from ``row_gather.gather_rows``,
    here the kernel in the interpreter: the same buffer and input gradient as XLA's gather."""
    num_tokens, top_k, num_experts, hidden = 32, 2, 4, 512
    # Distinct experts per token, as a top-k gives (plan_dispatch refuses repeats).
    scores = jax.random.uniform(jax.random.key(0), (num_tokens, num_experts))
    experts = jnp.argsort(scores, axis=-1)[:, :top_k].astype(jnp.int32)
    x = jax.random.normal(jax.random.key(1), (num_tokens, hidden), jnp.float32)
    plan = jaxmoe.plan_dispatch(experts, num_experts, alignment=16)
    cotangent = jax.random.normal(jax.random.key(2), (plan.num_rows, hidden))

    def buffer_and_grad():
        buffer, vjp = jax.vjp(lambda x: jaxmoe.dispatch(x, plan), x)
        return buffer, vjp(cotangent)[0]

    expected = buffer_and_grad()
    calls, gather_rows = [], row_gather.gather_rows

    def kernel(values, index):
        calls.append(index.shape)
        return gather_rows(values, index, backend="pallas_triton", interpret=True)

    monkeypatch.setattr(row_gather, "gather_rows", kernel)
    got = buffer_and_grad()
    assert calls == [(plan.num_rows,)]
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("check_vma", [True, False])
def test_auto_inside_shard_map(monkeypatch, check_vma):
    """Under ``shard_map(check_vma=True)`` (the sharded layer with a non-Pallas grouped matmul)
    a Pallas output cannot declare its mesh variance: ``auto`` takes XLA's gather there and
    the kernel under ``check_vma=False``; the named kernel says why it refuses."""
    calls = KernelCalls()
    monkeypatch.setattr(api, "_on_gpu", lambda: True)
    monkeypatch.setattr(pallas_triton, "gather_rows", calls)
    mesh = jax.make_mesh((2,), ("ep",), axis_types=(jax.sharding.AxisType.Auto,))
    values, index = operands(64, 512, 64, jnp.float32)
    spec = jax.sharding.PartitionSpec("ep")

    def sharded(gather):
        return jax.jit(
            jax.shard_map(
                gather, mesh=mesh, in_specs=(spec, spec), out_specs=spec, check_vma=check_vma
            )
        )

    out = sharded(lambda v, i: row_gather.gather_rows(v, i, interpret=True))(values, index)
    assert calls.count == int(not check_vma)
    halves = zip(np.split(np.asarray(values), 2), np.split(np.asarray(index), 2), strict=True)
    expected = np.concatenate([reference_gather(v, i) for v, i in halves])
    np.testing.assert_array_equal(np.asarray(out), expected)
    if check_vma:
        with pytest.raises(NotImplementedError, match="check_vma=True"):
            sharded(
                lambda v, i: row_gather.gather_rows(v, i, backend="pallas_triton", interpret=True)
            )(values, index)


@pytest.mark.parametrize("spread_backend", [None, "xla", "pallas_triton"])
def test_combine_backward_spreads_through_the_op(monkeypatch, spread_backend):
    """The combine's backward spreads the output gradient with a weight per row through the row
    gather op, on ``permutation.WEIGHTED_SPREAD_BACKEND`` (None: its default, which takes the
    kernel on a GPU, faked here, in the interpreter): the same gradients either way."""
    num_tokens, top_k, num_experts, hidden = 32, 2, 4, 512
    # Distinct experts per token, as a top-k gives (plan_dispatch refuses repeats).
    scores = jax.random.uniform(jax.random.key(0), (num_tokens, num_experts))
    experts = jnp.argsort(scores, axis=-1)[:, :top_k].astype(jnp.int32)
    weights = jax.random.uniform(jax.random.key(1), (num_tokens, top_k), jnp.float32)
    plan = jaxmoe.plan_dispatch(experts, num_experts, alignment=16)
    buffer = jax.random.normal(jax.random.key(2), (plan.num_rows, hidden)).astype(jnp.bfloat16)
    cotangent = jax.random.normal(jax.random.key(3), (num_tokens, hidden), jnp.float32)

    def grads():
        _, vjp = jax.vjp(lambda b, w: jaxmoe.combine(b, w, plan), buffer, weights)
        return vjp(cotangent)

    expected = grads()
    calls = KernelCalls(interpret=True)
    monkeypatch.setattr(api, "_on_gpu", lambda: True)
    monkeypatch.setattr(pallas_triton, "gather_rows", calls)
    if spread_backend is not None:
        monkeypatch.setattr(permutation, "WEIGHTED_SPREAD_BACKEND", spread_backend)
    got = grads()
    assert calls.count == int(spread_backend != "xla")
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("check_vma", [True, False])
def test_sharded_layer_with_the_kernel(monkeypatch, check_vma):
    """The expert-parallel layer with ``auto`` faked onto the kernel (in the interpreter):
    unchecked (a Pallas grouped matmul's shard_map) its dispatches gather through the kernel,
    checked they take XLA's gather; the same gradients as without it either way."""

    class Xla(jaxmoe.ops.grouped_matmul.XlaGroupedMatmul):
        supports_check_vma = check_vma

    mesh = jax.make_mesh((4,), ("ep",), axis_types=(jax.sharding.AxisType.Auto,))
    cfg = jaxmoe.MoEConfig(
        num_experts=8,
        top_k=2,
        hidden_size=64,
        ffn_size=32,
        ep_axis="ep",
        grouped_matmul_backend=Xla(),
    )
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    x = jax.random.normal(jax.random.key(1), (8, 32, 64), jnp.float32)  # send buffers of 144 rows

    def grads():
        def loss(p, x):
            y, stats = jaxmoe.moe(p, x, cfg, mesh=mesh)
            return jnp.sum(y * jnp.cos(x)) + stats.aux_loss

        return jit_xla_defaults(jax.grad(loss, argnums=(0, 1)))(params, x)

    expected = grads()
    calls = KernelCalls(interpret=True)
    monkeypatch.setattr(api, "_on_gpu", lambda: True)
    monkeypatch.setattr(pallas_triton, "gather_rows", calls)
    got = grads()
    assert (calls.count > 0) == (not check_vma)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

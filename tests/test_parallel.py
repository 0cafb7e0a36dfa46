"""Expert parallelism on 8 simulated CPU devices: the sharded layer equals the one-device layer.

Forward, every gradient and the stats, over meshes ep=2/4/8 and (data=2, ep=4), routings
uniform / skewed / all tokens to one expert / ranks that receive nothing, and every exchange
that runs on CPU. Shapes are tiny: the cost is compilation.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import jaxmoe
from jaxmoe import debug
from jaxmoe.parallel import logical_axis_rules, moe_sharded, param_partition_specs, slot_rows
from tests.xla_cpu import jit_xla_defaults

RTOL = 1e-5
HIDDEN, FFN, NUM_EXPERTS, TOP_K = 8, 16, 8, 2


def make_mesh(shape, names):
    devices = np.array(jax.devices()[: int(np.prod(shape))]).reshape(shape)
    return Mesh(devices, names)


MESHES = {
    "ep2": (make_mesh((2,), ("ep",)), ()),
    "ep4": (make_mesh((4,), ("ep",)), ()),
    "ep8": (make_mesh((8,), ("ep",)), ()),
    "data2_ep4": (make_mesh((2, 4), ("data", "ep")), ("data",)),
}


def routing_bias(kind: str, ep: int) -> np.ndarray:
    """Selection bias (sigmoid scores lie in (0, 1), so +10 decides the choice)."""
    bias = np.zeros(NUM_EXPERTS, np.float32)
    if kind == "skewed":
        bias = np.linspace(0.6, 0.0, NUM_EXPERTS).astype(np.float32)
    elif kind == "one_expert":
        bias[3] = 10.0  # every token's first choice is expert 3
    elif kind == "empty_ranks":
        # Only the experts of rank 0 are chosen: the other ranks receive nothing.
        bias[: max(TOP_K, NUM_EXPERTS // ep)] = 10.0
    return bias


def make_case(
    routing="uniform", batch=8, seq=4, num_experts=NUM_EXPERTS, top_k=TOP_K, **cfg_kwargs
):
    cfg = jaxmoe.MoEConfig(
        num_experts=num_experts,
        top_k=top_k,
        hidden_size=HIDDEN,
        ffn_size=FFN,
        score="sigmoid",
        use_expert_bias=True,
        aux_loss_coef=0.01,
        seq_aux_loss_coef=0.02,
        z_loss_coef=0.001,
        **cfg_kwargs,
    )
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = jaxmoe.init_params(k1, cfg)
    shape = (batch, seq, HIDDEN) if seq else (batch, HIDDEN)
    x = jax.random.normal(k2, shape, jnp.float32)
    cotangent = jax.random.normal(k3, shape, jnp.float32)
    return cfg, params, x, cotangent


def with_bias(params, routing, ep):
    return {**params, "expert_bias": jnp.asarray(routing_bias(routing, ep))}


@functools.cache
def _jitted_value_and_grads(cfg, mesh, poisoned):
    """One jitted program per layer (``poisoned``: whether debug.poison_buffers was on when it
    was traced, which jit's cache does not see): the tests' references and repeated runs
    reuse its compile instead of tracing and lowering the same program again. A poisoned
    program compiles at XLA's defaults (``tests/xla_cpu.py`` says why)."""

    def loss(params, x, cotangent):
        y, stats = jaxmoe.moe(params, x, cfg, mesh=mesh)
        return jnp.sum(y * cotangent) + stats.aux_loss, (y, stats)

    jit = jit_xla_defaults if poisoned else jax.jit
    return jit(jax.grad(loss, argnums=(0, 1), has_aux=True))


def value_and_grads(cfg, params, x, cotangent, mesh=None):
    """The gradients of ``sum(y * cotangent) + aux_loss`` in (params, x), and (y, stats)."""
    return _jitted_value_and_grads(cfg, mesh, debug.poison_enabled())(params, x, cotangent)


def assert_close(actual, expected, what):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    scale = max(np.max(np.abs(expected)), 1e-30)
    err = np.max(np.abs(actual - expected)) / scale
    assert err < RTOL, f"{what}: relative error {err:.3g}"


def assert_same_layer(result, reference):
    (grads, (y, stats)), (ref_grads, (ref_y, ref_stats)) = result, reference
    assert_close(y, ref_y, "y")
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        ref = dict(jax.tree_util.tree_flatten_with_path(ref_grads)[0])[path]
        assert_close(g, ref, f"grad{jax.tree_util.keystr(path)}")
    np.testing.assert_array_equal(stats.tokens_per_expert, ref_stats.tokens_per_expert)
    assert int(stats.dropped_tokens) == int(ref_stats.dropped_tokens)
    for name in ("aux_loss", "load_balancing_loss", "seq_aux_loss", "z_loss"):
        assert_close(getattr(stats, name), getattr(ref_stats, name), name)


def overflow_numpy(experts: np.ndarray, ep: int, groups: int, rows: int) -> int:
    """Copies past the first ``rows`` of their (sender, receiver) slot, over every ep group
    (ranks own contiguous token and expert ranges; data shards are ep groups)."""
    local = NUM_EXPERTS // ep
    per_rank = experts.reshape(groups, ep, -1)
    return sum(
        max(0, int(np.sum(per_rank[g, s] // local == d)) - rows)
        for g in range(groups)
        for s in range(ep)
        for d in range(ep)
    )


LAYER_CASES = [
    # (mesh, routing, exchange, fast slot factor, overflows): each case compiles its own
    # sharded program. Every exchange that runs on CPU, every mesh and routing; the overflow
    # windows on each kind of mesh. The default factor 1.125 is MoEConfig's.
    ("ep4", "skewed", "all_to_all", 1.125, True),
    ("ep4", "empty_ranks", "all_gather", 1.125, True),
    ("data2_ep4", "skewed", "all_gather", 1.125, True),
    ("ep4", "one_expert", "all_to_all_chunked", 1.125, True),
    ("data2_ep4", "skewed", "all_to_all_chunked", 1.125, True),
    # The platform default exchange (None: all_to_all), and other slot factors: uniform routing
    # fits slots of twice the balanced share; the others overflow into later windows.
    # Merged away, and what covers them: ep8/uniform/None (the default on ep8): ep8/empty_ranks/
    # None, uniform routing at ep2; data2_ep4/empty_ranks/all_to_all: data2_ep4/empty_ranks/None
    # (the same exchange at f=1.5); the overflow cases ep4/one_expert/1.5 and data2_ep4/skewed/1.5:
    # ep4/skewed/all_to_all and data2_ep4/skewed/all_gather, whose overflow is counted exactly
    # too; test_overflow_windows_are_bitwise_deterministic (data2_ep4, overflowing): every case
    # runs twice and compares bitwise, the data2_ep4 ones overflowing. Then ep2/uniform/
    # all_to_all/1.125 (no overflow): ep2 in ep2/one_expert/None (the same exchange),
    # uniform routing without overflow in ep4/uniform/None/2.0, the explicit all_to_all in
    # ep4/skewed; ep8/one_expert/all_to_all/1.125: ep8 overflowing over all_to_all in
    # ep8/empty_ranks/None, one_expert on ep2 and ep4 (each case is one sharded compile).
    ("ep2", "one_expert", None, 1.5, True),
    ("ep4", "uniform", None, 2.0, False),
    ("ep8", "empty_ranks", None, 1.5, True),
    ("data2_ep4", "empty_ranks", None, 1.5, True),
]


@pytest.mark.parametrize("mesh_name,routing,exchange,factor,overflows", LAYER_CASES)
def test_layer_matches_single_device(mesh_name, routing, exchange, factor, overflows):
    """Dropless EP sends slots of ``P = ceil(f*T*K/ep)`` rows; copies past them travel in later
    windows of ``P`` in a while loop. The one-device result, nothing dropped, the overflow
    counted exactly, and a second run bitwise equal to the first."""
    mesh, data_axes = MESHES[mesh_name]
    ep, groups = mesh.shape["ep"], mesh.size // mesh.shape["ep"]
    cfg, params, x, cotangent = make_case()
    params = with_bias(params, routing, ep)
    sharded = dataclasses.replace(
        cfg, ep_axis="ep", data_axes=data_axes, ep_exchange=exchange, ep_fast_slot_factor=factor
    )
    tokens = x.reshape(-1, HIDDEN)
    logits = tokens @ params["router"]["kernel"]
    experts = np.asarray(jaxmoe.route(logits, cfg, params["expert_bias"]).experts)
    tokens_per_rank = tokens.shape[0] // mesh.size
    fast_rows = slot_rows(tokens_per_rank, TOP_K, ep, NUM_EXPERTS // ep, receive_factor=factor)
    assert fast_rows < tokens_per_rank * TOP_K  # the fast slots are smaller than the worst case
    expected_overflow = overflow_numpy(experts, ep, groups, fast_rows)
    assert (expected_overflow > 0) == overflows, expected_overflow
    reference = value_and_grads(cfg, params, x, cotangent)
    result = value_and_grads(sharded, params, x, cotangent, mesh)
    assert_same_layer(result, reference)
    assert int(result[1][1].dropped_tokens) == 0
    assert int(result[1][1].overflow_tokens) == expected_overflow
    assert int(reference[1][1].overflow_tokens) == 0
    counts = np.asarray(reference[1][1].tokens_per_expert)
    if routing == "empty_ranks":
        assert counts[max(TOP_K, NUM_EXPERTS // ep) :].sum() == 0
    if routing == "one_expert":
        assert counts[3] == x.shape[0] * x.shape[1]
    # Bitwise repeatable (the overflow loop and its VJP included where they run).
    again = value_and_grads(sharded, params, x, cotangent, mesh)
    for a, b in zip(jax.tree.leaves(result), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# (Fast slots only, f=2 with uniform routing, and fast slots with overflow windows, f=2 with
# one_expert: test_chunks_needing_different_windows_match_single_device[copies], ep_chunks=2 with
# overflow windows, and test_layer_matches_single_device[ep4-uniform-None-2.0-False], the
# overflow loop running no step.)
def test_chunked_layer_with_worst_case_slots_matches_single_device():
    """ep_chunks=2 with worst-case slots only (no fast slots, no overflow loop): two exchanges
    and two expert passes per device, the same result."""
    mesh, _ = MESHES["ep4"]
    cfg, params, x, cotangent = make_case()
    params = with_bias(params, "skewed", 4)
    sharded = dataclasses.replace(cfg, ep_axis="ep", ep_chunks=2, ep_fast_slot_factor=None)
    reference = value_and_grads(cfg, params, x, cotangent)
    assert_same_layer(value_and_grads(sharded, params, x, cotangent, mesh), reference)


def chunk_windows_numpy(experts: np.ndarray, ep: int, chunks: int, rows: int) -> list[int]:
    """Windows of ``rows`` each chunk's fullest (sender, receiver) slot needs (one ep group)."""
    dest = experts.reshape(ep, chunks, -1) // (NUM_EXPERTS // ep)  # ranks own contiguous tokens
    fullest = [max(np.sum(dest[:, c] == d, axis=1).max() for d in range(ep)) for c in range(chunks)]
    return [max(1, math.ceil(int(copies) / rows)) for copies in fullest]


@pytest.mark.parametrize("dispatch,exchange", [("copies", None), ("tokens", "all_gather")])
def test_chunks_needing_different_windows_match_single_device(dispatch, exchange):
    """One overflow loop runs every chunk's window ``w`` up to the most windows any chunk needs:
    here each rank's second chunk (zero tokens: every copy to experts 0 and 1, both on rank 0)
    needs more windows than its first, whose later windows must add exact zeros. The token
    dispatch over the all_gather exchange (its only run with ep_chunks and that exchange: the
    exchange is independent of the chunks and the routing, one compile for both)."""
    mesh, _ = MESHES["ep4"]
    cfg, params, x, cotangent = make_case()
    x = x.at[1::2].set(0.0)  # rank r holds batch rows 2r, 2r+1: its second chunk is zeros
    tokens = x.reshape(-1, HIDDEN)
    logits = tokens @ params["router"]["kernel"]
    experts = np.asarray(jaxmoe.route(logits, cfg, params["expert_bias"]).experts)
    rows = slot_rows(tokens.shape[0] // 8, TOP_K, 4, NUM_EXPERTS // 4, receive_factor=1.0)
    first, second = chunk_windows_numpy(experts, 4, 2, rows)
    assert 1 < first < second, (first, second)
    sharded = dataclasses.replace(
        cfg,
        ep_axis="ep",
        ep_chunks=2,
        ep_dispatch=dispatch,
        ep_exchange=exchange,
        ep_fast_slot_factor=1.0,
    )
    result = value_and_grads(sharded, params, x, cotangent, mesh)
    assert_same_layer(result, value_and_grads(cfg, params, x, cotangent))
    assert int(result[1][1].dropped_tokens) == 0
    assert int(result[1][1].overflow_tokens) > 0


def _sub_jaxprs(eqn):
    for value in eqn.params.values():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, jax.extend.core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jax.extend.core.Jaxpr):
                yield item


def _is_exchange(eqn) -> bool:
    """An all-to-all, or an exchange bound as a multilinear map (jaxmoe.multilinear: its
    collective appears when lowered; an exchange is the map whose static arguments name an
    Exchange)."""
    if eqn.primitive.name == "all_to_all":
        return True
    static = (
        dict(eqn.params.get("static", ())) if eqn.primitive.name == "jaxmoe_multilinear" else {}
    )
    return isinstance(static.get("impl"), jaxmoe.parallel.exchange.Exchange)


def _holds_all_to_all(jaxpr) -> bool:
    return any(
        _is_exchange(eqn) or any(map(_holds_all_to_all, _sub_jaxprs(eqn))) for eqn in jaxpr.eqns
    )


def exchange_order(jaxpr, found=None) -> str:
    """The program order of a jaxpr's all-to-alls (``a``) and of its while loops that hold one
    (``W``, not looked into), through every nested jaxpr."""
    found = [] if found is None else found
    for eqn in jaxpr.eqns:
        if _is_exchange(eqn):
            found.append("a")
        elif eqn.primitive.name == "while":
            if _holds_all_to_all(eqn.params["body_jaxpr"].jaxpr):
                found.append("W")
        else:
            for sub in _sub_jaxprs(eqn):
                exchange_order(sub, found)
    return "".join(found)


@pytest.mark.parametrize("dispatch", ["copies", "tokens"])
def test_chunks_fast_windows_come_before_one_overflow_loop(dispatch):
    """ep_chunks=2 under jax.grad: every chunk's fast-window all-to-alls come before the one
    overflow loop of the forward, and the backward has one loop beside its all-to-alls (no loop
    holding collectives between two chunks' exchanges, which XLA's GPU scheduler would not move
    an async collective across)."""
    mesh, _ = MESHES["ep4"]
    cfg, params, x, cotangent = make_case(num_experts=16, top_k=4)
    sharded = dataclasses.replace(
        cfg, ep_axis="ep", ep_chunks=2, ep_dispatch=dispatch, ep_fast_slot_factor=1.0
    )

    def loss(params, x):
        return jnp.sum(jaxmoe.moe(params, x, sharded, mesh=mesh)[0] * cotangent)

    order = exchange_order(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(params, x).jaxpr)
    # Per chunk and window: the dispatch and combine exchanges (tokens: and the pairs' ids and
    # weights); the backward's all-to-alls are the transposes of the forward's.
    fast = "a" * 2 * (2 if dispatch == "copies" else 3)
    assert order in (fast + "WW" + fast, fast + "W" + fast + "W"), order


@pytest.mark.parametrize("dispatch, loops", [(None, 0), ("copies", 2), ("tokens", 5)])
def test_the_only_loops_are_the_overflow_windows(dispatch, loops):
    """No ``while`` on the layer's common path (searches are unrolled, jaxmoe.sorted_search):
    on a GPU each loop step copies its condition to the host, a stream stall no collective
    overlaps.
    What remains under jax.grad: the overflow loop and its backward (tokens: the count of
    windows needed, and inside each overflow loop's body the walk to its window's start); one
    device has none. (The lowered StableHLO of the same programs, where XLA shares a loop's
    body between uses: 0, 1 and 3 ``while`` ops; 1, 3 and 9 before the unrolled searches.)"""
    mesh, _ = MESHES["ep4"]
    cfg, params, x, cotangent = make_case(num_experts=16, top_k=4)
    if dispatch is not None:
        cfg = dataclasses.replace(cfg, ep_axis="ep", ep_dispatch=dispatch)

    def loss(params, x):
        return jnp.sum(jaxmoe.moe(params, x, cfg, mesh=None if dispatch is None else mesh)[0])

    jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(params, x))
    assert jaxpr.count(" while[") == loops


def test_chunks_must_divide_tokens_per_device():
    mesh, _ = MESHES["ep4"]
    cfg, params, x, _ = make_case()  # 32 tokens: 8 per device
    with pytest.raises(ValueError, match="ep_chunks"):
        jaxmoe.moe(params, x, dataclasses.replace(cfg, ep_axis="ep", ep_chunks=3), mesh=mesh)


def test_softmax_2d_input_shared_expert_fsdp():
    """softmax scores, a 2-D x (one sequence), a shared expert, FSDP expert weights, alignment."""
    mesh, _ = MESHES["data2_ep4"]
    cfg = jaxmoe.MoEConfig(
        num_experts=NUM_EXPERTS,
        top_k=TOP_K,
        hidden_size=HIDDEN,
        ffn_size=FFN,
        num_shared_experts=1,
        aux_loss_coef=0.01,
        seq_aux_loss_coef=0.02,
        alignment=4,
    )
    params = jaxmoe.init_params(jax.random.key(1), cfg)
    x = jax.random.normal(jax.random.key(2), (32, HIDDEN))
    cotangent = jax.random.normal(jax.random.key(3), x.shape)
    sharded = dataclasses.replace(cfg, ep_axis="ep", data_axes=("data",), fsdp_expert_weights=True)
    assert_same_layer(
        value_and_grads(sharded, params, x, cotangent, mesh),
        value_and_grads(cfg, params, x, cotangent),
    )


def test_poison_mode_reads_no_unwritten_row():
    mesh, _ = MESHES["ep4"]
    cfg, params, x, cotangent = make_case(alignment=4)
    params = with_bias(params, "skewed", 4)
    sharded = dataclasses.replace(cfg, ep_axis="ep", ep_receive_factor=1.5)
    reference = value_and_grads(sharded, params, x, cotangent, mesh)
    with debug.poison_buffers():
        poisoned = value_and_grads(sharded, params, x, cotangent, mesh)
    for leaf in jax.tree.leaves(poisoned):
        assert np.all(np.isfinite(np.asarray(leaf, np.float64)))
    assert_same_layer(poisoned, reference)


# ---------------------------------------------------------------------------------------------
# Capacity and receive-bound drops.


def outputs_and_grads(fn, params, x, cotangent):
    """``fn(params, x) -> (y, ...)``: its outputs and the gradients of ``sum(y * cotangent)``,
    forward and gradients in one program."""

    def loss(params, x):
        out = fn(params, x)
        return jnp.sum(out[0] * cotangent), out

    return jax.jit(jax.grad(loss, argnums=(0, 1), has_aux=True))(params, x)


def test_capacity_matches_single_device():
    mesh, _ = MESHES["ep4"]
    cfg, params, x, cotangent = make_case(capacity_factor=0.75, alignment=2)
    params = with_bias(params, "skewed", 4)
    reference = value_and_grads(cfg, params, x, cotangent)
    result = value_and_grads(dataclasses.replace(cfg, ep_axis="ep"), params, x, cotangent, mesh)
    assert int(reference[1][1].dropped_tokens) > 0
    assert_same_layer(result, reference)


@pytest.mark.parametrize(
    "policy,seq", [("position", 4), ("probs", 0)], ids=["3d-position", "2d-probs"]
)
def test_drop_policies_match_one_device_per_data_shard(policy, seq):
    """With data axes, C uses the ep group's tokens: each ep group drops what moe() on its data
    shard drops (the counts per expert too), sequence by sequence. Each policy and each x rank
    once: the sequence length the ep group passes on is the same code for both policies, and
    "position" is the one whose claim order it changes ("probs" ranks by weight; the sequence
    order only breaks ties). (The former test_capacity_counts_tokens_of_one_data_shard, the
    default policy "position" on a 3-D x, is the first case.)"""
    mesh, _ = MESHES["data2_ep4"]
    batch = 8 if seq else 32
    cfg, params, x, cotangent = make_case(
        batch=batch, seq=seq, capacity_factor=0.5, capacity_drop_policy=policy
    )
    params = with_bias(params, "skewed", 4)
    sharded = dataclasses.replace(cfg, ep_axis="ep", data_axes=("data",))

    def per_shard(params, x):
        halves = [jaxmoe.moe(params, half, cfg) for half in jnp.split(x, 2)]
        per_sequence = jnp.concatenate([h[1].dropped_tokens_per_sequence for h in halves])
        if not seq:  # a 2-D x is one sequence: the shards' counts add up
            per_sequence = jnp.sum(per_sequence, keepdims=True)
        y = jnp.concatenate([h[0] for h in halves])
        counts = sum(h[1].tokens_per_expert for h in halves)
        return y, sum(h[1].dropped_tokens for h in halves), per_sequence, counts

    def sharded_fn(params, x):
        y, stats = jaxmoe.moe(params, x, sharded, mesh=mesh)
        return y, stats.dropped_tokens, stats.dropped_tokens_per_sequence, stats.tokens_per_expert

    ref_grads, ref = outputs_and_grads(per_shard, params, x, cotangent)
    grads, out = outputs_and_grads(sharded_fn, params, x, cotangent)
    assert_close(out[0], ref[0], "y")
    assert int(out[1]) == int(ref[1]) > 0
    np.testing.assert_array_equal(out[2], ref[2])
    assert out[2].shape == ((batch,) if seq else (1,)) and int(jnp.sum(out[2])) == int(out[1])
    np.testing.assert_array_equal(out[3], ref[3])
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        assert_close(a, b, "grad")


# ---------------------------------------------------------------------------------------------
# Errors.


def test_mesh_errors_name_the_field():
    mesh, _ = MESHES["ep4"]
    cfg, params, x, _ = make_case()
    with pytest.raises(ValueError, match="ep_axis"):
        jaxmoe.moe(params, x, dataclasses.replace(cfg, ep_axis="expert"), mesh=mesh)
    with pytest.raises(ValueError, match="ep_axis"):
        moe_sharded(params, x, cfg, mesh)  # ep_axis None
    with pytest.raises(ValueError, match="data_axes"):
        jaxmoe.moe(
            params, x, dataclasses.replace(cfg, ep_axis="ep", data_axes=("fsdp",)), mesh=mesh
        )
    mesh8, _ = MESHES["ep8"]
    cfg6 = dataclasses.replace(cfg, num_experts=6, ep_axis="ep")
    with pytest.raises(ValueError, match="num_experts"):
        jaxmoe.moe(jaxmoe.init_params(jax.random.key(0), cfg6), x, cfg6, mesh=mesh8)
    with pytest.raises(ValueError, match="divisible"):
        jaxmoe.moe(params, x[:6], dataclasses.replace(cfg, ep_axis="ep"), mesh=mesh)
    with pytest.raises(ValueError, match="ep_exchange"):
        jaxmoe.moe(params, x, dataclasses.replace(cfg, ep_axis="ep", ep_exchange="nccl"), mesh=mesh)
    with pytest.raises(NotImplementedError, match="cpu"):
        jaxmoe.moe(
            params,
            x,
            dataclasses.replace(cfg, ep_axis="ep", ep_exchange="ragged_all_to_all"),
            mesh=mesh,
        )


def test_logical_rules_and_specs():
    cfg = jaxmoe.MoEConfig(
        num_experts=8,
        top_k=2,
        hidden_size=8,
        ffn_size=16,
        ep_axis="ep",
        data_axes=("fsdp",),
        fsdp_expert_weights=True,
    )
    rules = dict(logical_axis_rules(cfg))
    assert rules["batch"] == ("fsdp", "ep")
    assert rules["expert"] == "ep"
    assert rules["embed"] == ("fsdp",)
    specs = param_partition_specs(cfg)
    assert tuple(specs["experts"]["w_up"])[0] == "ep"
    assert tuple(specs["experts"]["w_up"])[1] in ("fsdp", ("fsdp",))
    assert tuple(specs["experts"]["w_down"])[2] in ("fsdp", ("fsdp",))
    assert tuple(specs["router"]["kernel"]) == ()

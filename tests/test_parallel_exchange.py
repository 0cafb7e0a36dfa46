"""The exchange-level API (ep_dispatch / ep_combine), the exchanges, and the compiled HLO."""

from __future__ import annotations

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxmoe
from jaxmoe.ops.grouped_matmul import XlaGroupedMatmul
from jaxmoe.parallel import (
    batch_partition_spec,
    ep_combine,
    ep_dispatch,
    param_partition_specs,
    slot_rows,
)
from jaxmoe.parallel.exchange import exchange_rows, resolve_exchange

EP, TOKENS, HIDDEN, TOP_K, NUM_EXPERTS = 4, 12, 8, 2, 8
CPU_EXCHANGES = ("all_to_all", "all_to_all_chunked", "all_gather")


def ep_mesh(ep=EP):
    return Mesh(np.array(jax.devices()[:ep]), ("ep",))


def inputs(skew: bool, seed: int = 0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(k1, (EP * TOKENS, HIDDEN))
    scores = jax.random.uniform(k2, (EP * TOKENS, NUM_EXPERTS))
    if skew:  # most copies to experts 0 and 1 (rank 0)
        scores = scores + jnp.array([2.0, 1.5] + [0.0] * (NUM_EXPERTS - 2))[None, :]
        scores = scores.at[::5].add(jnp.arange(NUM_EXPERTS)[None, :] * 0.5)
    experts = jnp.argsort(-scores, axis=1)[:, :TOP_K].astype(jnp.int32)
    weights = jax.random.uniform(k3, (EP * TOKENS, TOP_K))
    return x, experts, weights


def sharded(fn, num_out=1):
    spec = P("ep")
    out = spec if num_out == 1 else (spec,) * num_out
    return jax.jit(jax.shard_map(fn, mesh=ep_mesh(), in_specs=spec, out_specs=out))


def expected_kept(experts: np.ndarray, receive_factor):
    """The documented drop rule, in NumPy: per (sender, receiver) slot, copies ordered by
    expert then token, the first P kept."""
    rows = slot_rows(TOKENS, TOP_K, EP, NUM_EXPERTS // EP, receive_factor=receive_factor)
    kept = np.zeros(experts.shape, bool)
    for sender in range(EP):
        local = experts[sender * TOKENS : (sender + 1) * TOKENS]
        for dest in range(EP):
            position = 0
            for expert in range(dest * NUM_EXPERTS // EP, (dest + 1) * NUM_EXPERTS // EP):
                for t, k in zip(*np.nonzero(local == expert), strict=True):
                    kept[sender * TOKENS + t, k] = position < rows
                    position += 1
    return kept


@pytest.mark.parametrize("exchange", CPU_EXCHANGES)
@pytest.mark.parametrize("skew,receive_factor", [(False, None), (True, None), (True, 0.5)])
def test_round_trip_and_drops(exchange, skew, receive_factor):
    """Identity experts: combine(dispatch(x)) = sum of w * x over kept copies (documented drops)."""
    x, experts, weights = inputs(skew)

    def body(x, experts, weights):
        buffer, group_sizes, handle = ep_dispatch(
            x,
            experts,
            num_experts=NUM_EXPERTS,
            axis_name="ep",
            exchange=exchange,
            receive_factor=receive_factor,
        )
        y = ep_combine(buffer, weights, handle, "ep")
        return y, group_sizes, handle.dropped[None], handle.tokens_per_expert[None]

    y, group_sizes, dropped, counts = jax.jit(
        jax.shard_map(body, mesh=ep_mesh(), in_specs=P("ep"), out_specs=(P("ep"),) * 4)
    )(x, experts, weights)
    kept = expected_kept(np.asarray(experts), receive_factor)
    expected = np.einsum("tk,th->th", np.asarray(weights) * kept, np.asarray(x))
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)
    assert int(np.sum(dropped)) == int(np.sum(~kept))
    if receive_factor is not None:
        assert np.sum(~kept) > 0  # the case exercises the bound
    # Group sizes: kept copies per expert; counts: all copies per expert, per rank.
    flat = np.asarray(experts)
    np.testing.assert_array_equal(
        group_sizes, np.bincount(flat[kept], minlength=NUM_EXPERTS).astype(np.int32)
    )
    np.testing.assert_array_equal(
        np.asarray(counts).sum(0), np.bincount(flat.reshape(-1), minlength=NUM_EXPERTS)
    )


@pytest.mark.parametrize("exchange", CPU_EXCHANGES)
def test_closed_form_gradients(exchange):
    """dispatch's VJP = combine with unit weights; combine's VJPs: <dy, copy> for weights and
    the weighted dispatch of dy for the expert rows (adjoint identity)."""
    x, experts, weights = inputs(skew=True)
    k1, k2 = jax.random.split(jax.random.key(7))

    def body(x, experts, weights, dy):
        buffer, _, handle = ep_dispatch(
            x, experts, num_experts=NUM_EXPERTS, axis_name="ep", exchange=exchange
        )
        d_buffer = jax.random.normal(k1, buffer.shape) * (jnp.abs(buffer) > 0)
        # dispatch: VJP(d_buffer) == combine(d_buffer, ones)
        _, dispatch_vjp = jax.vjp(
            lambda x: ep_dispatch(
                x, experts, num_experts=NUM_EXPERTS, axis_name="ep", exchange=exchange
            )[0],
            x,
        )
        (grad_x,) = dispatch_vjp(d_buffer)
        unit = ep_combine(d_buffer, jnp.ones_like(weights), handle)
        # combine: VJP wrt (expert rows, weights)
        _, combine_vjp = jax.vjp(lambda b, w: ep_combine(b, w, handle), buffer, weights)
        grad_buffer, grad_weights = combine_vjp(dy)
        # Adjoint identity <combine(B, w), dy> = <B, grad_buffer> (summed over ranks outside).
        lhs = jnp.sum(ep_combine(d_buffer, weights, handle) * dy)[None]
        rhs = jnp.sum(d_buffer * grad_buffer)[None]
        return grad_x, unit, grad_weights, lhs, rhs

    dy = jax.random.normal(k2, x.shape)
    grad_x, unit, grad_weights, lhs, rhs = jax.jit(
        jax.shard_map(body, mesh=ep_mesh(), in_specs=P("ep"), out_specs=(P("ep"),) * 5)
    )(x, experts, weights, dy)
    np.testing.assert_allclose(grad_x, unit, rtol=1e-6, atol=1e-6)
    # Identity experts: the copy of token t is x[t], so d w[t, k] = <dy[t], x[t]>.
    expected = np.broadcast_to(
        np.sum(np.asarray(dy) * np.asarray(x), axis=1)[:, None], weights.shape
    )
    np.testing.assert_allclose(grad_weights, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.sum(lhs), np.sum(rhs), rtol=1e-5)


@pytest.mark.parametrize("exchange", CPU_EXCHANGES)
def test_exchange_is_its_own_inverse(exchange):
    impl = resolve_exchange(exchange)
    slots = jax.random.normal(jax.random.key(3), (EP * EP, 5, HIDDEN))
    sizes = jnp.full((EP * EP,), 5, jnp.int32)

    def body(slots, sizes):
        once = exchange_rows(impl, slots, sizes, sizes, "ep")
        return once, exchange_rows(impl, once, sizes, sizes, "ep")

    once, twice = jax.jit(
        jax.shard_map(body, mesh=ep_mesh(), in_specs=P("ep"), out_specs=(P("ep"), P("ep")))
    )(slots, sizes)
    np.testing.assert_array_equal(twice, slots)
    # Slot s of rank d after one exchange = slot d of rank s before.
    blocks = np.asarray(slots).reshape(EP, EP, 5, HIDDEN)
    np.testing.assert_array_equal(
        np.asarray(once).reshape(EP, EP, 5, HIDDEN), blocks.swapaxes(0, 1)
    )


def test_ragged_exchange_refuses_cpu():
    with pytest.raises(NotImplementedError, match="'cpu'"):
        resolve_exchange("ragged_all_to_all", "cpu")
    resolve_exchange("ragged_all_to_all", "gpu")  # no error where it runs


# ---------------------------------------------------------------------------------------------
# HLO: only the exchange and small count/stat collectives.

_COLLECTIVE = re.compile(
    r"=\s*(?P<result>.*?)\s(?P<op>all-gather|all-reduce|all-to-all|reduce-scatter|"
    r"collective-permute|collective-broadcast)(?:-start)?\("
)
_SHAPE = re.compile(r"(\w+)\[([\d,]*)\]")


def collectives(hlo: str):
    """``(op, dtype, elements)`` of every collective in compiled HLO text (largest result)."""
    found = []
    for match in _COLLECTIVE.finditer(hlo):
        shapes = [
            (dtype, math.prod(int(d) for d in dims.split(",") if d))
            for dtype, dims in _SHAPE.findall(match.group("result"))
        ]
        dtype, elements = max(shapes, key=lambda s: s[1])
        found.append((match.group("op"), dtype, elements))
    return found


def assert_only_exchange_collectives(
    hlo: str, cfg, ep: int, tokens: int, *, fsdp_weight_elements=()
):
    """Only the exchanges and small collectives. The exchanges are one dispatch + combine pair
    of ``P``-row slots; with the dropless fast path (``P = P_fast``) a second pair of the same
    slots sits in the overflow ``while`` loop, and no conditional anywhere. ``tokens`` is T,
    per rank."""
    small = cfg.num_experts * ep  # the [ep, E] counts; stats are [E] or scalars
    ops = collectives(hlo)
    # CPU splits an all-to-all into per-peer pieces: its largest result is one [P, H] slot.
    fast_path = cfg.ep_fast_slot_factor is not None and cfg.ep_receive_factor is None
    rows = slot_rows(
        tokens,
        cfg.top_k,
        ep,
        cfg.num_experts // ep,
        receive_factor=cfg.ep_fast_slot_factor if fast_path else cfg.ep_receive_factor,
    )
    slots = [rows * cfg.hidden_size] * (4 if fast_path else 2)
    assert " conditional(" not in hlo
    assert sorted(n for op, _, n in ops if op == "all-to-all") == sorted(slots), ops
    for op, dtype, elements in ops:
        if op == "all-to-all":
            continue
        if op == "all-gather" and elements in fsdp_weight_elements:
            continue
        assert op in ("all-gather", "all-reduce"), (op, dtype, elements)
        assert elements <= small, f"large {op} ({dtype}, {elements} elements): {ops}"


def _fsdp_ep_setup(fsdp_expert_weights=False):
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("fsdp", "ep"))
    cfg = jaxmoe.MoEConfig(
        num_experts=NUM_EXPERTS,
        top_k=TOP_K,
        hidden_size=HIDDEN,
        ffn_size=16,
        aux_loss_coef=0.01,
        ep_axis="ep",
        data_axes=("fsdp",),
        fsdp_expert_weights=fsdp_expert_weights,
    )
    params = jaxmoe.init_params(jax.random.key(0), cfg)
    params = jax.tree.map(
        lambda v, s: jax.device_put(v, NamedSharding(mesh, s)),
        params,
        param_partition_specs(cfg),
        is_leaf=lambda v: isinstance(v, P),
    )
    x = jax.device_put(jnp.ones((16, 4, HIDDEN)), NamedSharding(mesh, batch_partition_spec(cfg, 3)))
    return mesh, cfg, params, x


def test_hlo_layer_has_no_stray_collectives():
    mesh, cfg, params, x = _fsdp_ep_setup()
    hlo = (
        jax.jit(lambda p, x: jaxmoe.moe(p, x, cfg, mesh=mesh)).lower(params, x).compile().as_text()
    )
    assert_only_exchange_collectives(hlo, cfg, 4, tokens=8)


def test_hlo_projections_on_batch_tuple_add_no_collectives():
    """Dense projections before and after the layer, batch sharded on ('fsdp', 'ep'): the
    layer's sharding matches theirs, so no resharding collective appears."""
    mesh, cfg, params, x = _fsdp_ep_setup()
    replicated = NamedSharding(mesh, P())
    w_in = jax.device_put(jnp.eye(HIDDEN) * 0.5, replicated)
    w_out = jax.device_put(jnp.eye(HIDDEN) * 2.0, replicated)

    def model(params, w_in, w_out, x):
        h = jnp.einsum("bsh,hk->bsk", x, w_in)
        y, stats = jaxmoe.moe(params, h, cfg, mesh=mesh)
        return jnp.einsum("bsh,hk->bsk", y, w_out), stats

    hlo = jax.jit(model).lower(params, w_in, w_out, x).compile().as_text()
    assert_only_exchange_collectives(hlo, cfg, 4, tokens=8)


def test_hlo_fsdp_gathers_only_expert_weights():
    mesh, cfg, params, x = _fsdp_ep_setup(fsdp_expert_weights=True)
    hlo = (
        jax.jit(lambda p, x: jaxmoe.moe(p, x, cfg, mesh=mesh)).lower(params, x).compile().as_text()
    )
    local_weight = (NUM_EXPERTS // 4) * HIDDEN * cfg.ffn_size  # one gathered [E_l, H, F]
    assert_only_exchange_collectives(hlo, cfg, 4, tokens=8, fsdp_weight_elements=(local_weight,))
    assert any(op == "all-gather" and n == local_weight for op, _, n in collectives(hlo))


def test_hlo_without_fast_path_has_one_exchange_pair():
    mesh, cfg, params, x = _fsdp_ep_setup()
    # The copies dispatch (without a fast path "auto" prefers the token dispatch's smaller
    # worst case: docs/expert-parallelism.md, 'How "auto" chooses').
    cfg = dataclasses.replace(cfg, ep_dispatch="copies")
    for no_fast in (
        dataclasses.replace(cfg, ep_fast_slot_factor=None),
        dataclasses.replace(cfg, ep_receive_factor=1.5),  # a bound: drops, no worst case
    ):
        hlo = jax.jit(lambda p, x, c=no_fast: jaxmoe.moe(p, x, c, mesh=mesh))
        hlo = hlo.lower(params, x).compile().as_text()
        assert_only_exchange_collectives(hlo, no_fast, 4, tokens=8)
        assert sum(op == "all-to-all" for op, _, _ in collectives(hlo)) == 2


def test_default_exchange_is_dense_all_to_all():
    mesh, cfg, params, x = _fsdp_ep_setup()
    assert cfg.ep_exchange is None
    assert resolve_exchange(None).name == "all_to_all"
    explicit = dataclasses.replace(cfg, ep_exchange="all_to_all")
    # The same program, text for text (lowered, not compiled: the same program compiles alike;
    # the default's compiled collectives: test_hlo_layer_has_no_stray_collectives).
    lowered = {
        c.ep_exchange: jax.jit(lambda p, x, c=c: jaxmoe.moe(p, x, c, mesh=mesh))
        .lower(params, x)
        .as_text()
        for c in (cfg, explicit)
    }
    assert lowered[None] == lowered["all_to_all"]


def test_ragged_exchange_lowers_with_gradients():
    """CPU cannot run ragged_all_to_all, but it can trace and lower it: the forward and the
    reverse exchange type-check under shard_map's varying-axis checks."""
    from jaxmoe.parallel.exchange import RaggedAllToAllExchange

    class LowerOnly(RaggedAllToAllExchange):
        def check_platform(self, platform):
            del platform

    x, experts, weights = inputs(skew=True)

    def round_trip(x, experts, weights):
        buffer, _, handle = ep_dispatch(
            x, experts, num_experts=NUM_EXPERTS, axis_name="ep", exchange=LowerOnly()
        )
        return ep_combine(buffer, weights, handle)

    fn = jax.shard_map(round_trip, mesh=ep_mesh(), in_specs=P("ep"), out_specs=P("ep"))
    grad = jax.jit(jax.grad(lambda x, w: jnp.sum(fn(x, experts, w)), argnums=(0, 1)))
    assert grad.lower(x, weights).as_text().count("ragged_all_to_all") >= 4  # 2 fwd + 2 bwd


def test_unchecked_shard_map_path_is_exact(monkeypatch):
    """A backend declaring no vma types (Pallas, on GPU) runs shard_map(check_vma=False): same
    results."""

    class UncheckedXla(XlaGroupedMatmul):
        supports_check_vma = False

    mesh, cfg, params, x = _fsdp_ep_setup()
    x = x * jnp.arange(1, 1 + x.shape[1], dtype=x.dtype)[None, :, None]
    cotangent = jnp.cos(x)
    check_vma_used = []
    shard_map = jax.shard_map

    def recording_shard_map(*args, check_vma=True, **kwargs):
        check_vma_used.append(check_vma)
        return shard_map(*args, check_vma=check_vma, **kwargs)

    monkeypatch.setattr(jax, "shard_map", recording_shard_map)

    def grads(cfg):
        def loss(p, x):
            y, stats = jaxmoe.moe(p, x, cfg, mesh=mesh)
            return jnp.sum(y * cotangent) + stats.aux_loss

        return jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)

    checked = grads(cfg)
    unchecked = grads(dataclasses.replace(cfg, grouped_matmul_backend=UncheckedXla()))
    assert check_vma_used == [True, False]
    for a, b in zip(jax.tree.leaves(unchecked), jax.tree.leaves(checked), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

"""The exchange bench's count of the rows an exchange puts on the wire (its 'sent' bandwidth)."""

import math

import numpy as np

from jaxmoe.bench.exchange_bandwidth import (
    TINY_EXCHANGE_SHAPE,
    _sent_pair_bytes,
    _sent_rows,
    bench_exchange,
)
from jaxmoe.bench.sharded_correctness import check_correctness
from jaxmoe.parallel import layout, slot_rows

EP, LOCAL, TOP_K, TOKENS = 4, 2, 2, 16  # 16 tokens per rank, 8 experts


def _balanced():
    """Each rank's copies spread evenly: every (sender, receiver) slot holds T*K/ep copies."""
    experts = np.arange(EP * TOKENS * TOP_K).reshape(EP * TOKENS, TOP_K) % (EP * LOCAL)
    return experts.astype(np.int32)


def test_balanced_routing_sends_one_window_of_fast_slots():
    rows = slot_rows(TOKENS, TOP_K, EP, LOCAL, receive_factor=1.125)
    assert _sent_rows(_balanced(), EP, LOCAL, TOP_K, None, 1.125, 1) == (EP - 1) * rows


def test_skewed_routing_sends_every_window():
    experts = np.zeros((EP * TOKENS, TOP_K), np.int32)
    experts[:, 1] = 1  # every copy to rank 0: its slot holds T*K copies
    rows = slot_rows(TOKENS, TOP_K, EP, LOCAL, receive_factor=1.125)
    windows = math.ceil(TOKENS * TOP_K / rows)
    assert windows > 1
    assert _sent_rows(experts, EP, LOCAL, TOP_K, None, 1.125, 1) == windows * (EP - 1) * rows


def test_bounded_and_worst_case_slots_send_one_window():
    experts = np.zeros((EP * TOKENS, TOP_K), np.int32)
    experts[:, 1] = 1
    bounded = slot_rows(TOKENS, TOP_K, EP, LOCAL, receive_factor=1.5)
    assert _sent_rows(experts, EP, LOCAL, TOP_K, 1.5, 1.125, 1) == (EP - 1) * bounded
    worst = TOKENS * TOP_K
    assert _sent_rows(experts, EP, LOCAL, TOP_K, None, None, 1) == (EP - 1) * worst
    per_chunk = slot_rows(TOKENS // 2, TOP_K, EP, LOCAL, receive_factor=1.125)
    assert _sent_rows(_balanced(), EP, LOCAL, TOP_K, None, 1.125, 2) == 2 * (EP - 1) * per_chunk


def test_tokens_dispatch_sends_pair_slots():
    """dispatch='tokens': whole P_pairs-row slots both ways plus 8*K_l bytes of ids and weights
    per forward row, once per window; all copies to rank 0's two experts: 2 copies per pair,
    Q = 9 copies a window, so 4 pairs a window and 16 / 4 windows."""
    row_bytes = 64
    pair_rows = layout.pair_slot_rows(TOKENS, TOP_K, EP * LOCAL, EP, 1.125)
    assert pair_rows == math.ceil(1.125 * TOKENS * (1 - 15 / 28)) == 9
    per_window = (EP - 1) * pair_rows * (2 * row_bytes + 8 * 2)
    balanced = _sent_pair_bytes(_balanced(), EP, LOCAL, TOP_K, 1.125, 1, row_bytes)
    assert balanced == per_window
    experts = np.zeros((EP * TOKENS, TOP_K), np.int32)
    experts[:, 1] = 1
    assert layout.pair_copy_rows(TOKENS, TOP_K, EP * LOCAL, EP, 1.125) == 9
    assert _sent_pair_bytes(experts, EP, LOCAL, TOP_K, 1.125, 1, row_bytes) == 4 * per_window


def test_correctness_check_passes_through_the_overflow_windows():
    """The bench's exactness check on 4 devices: random routing overflows the fast slots (the
    overflow count is the sharded path's, not compared with one device's 0)."""
    row = check_correctness(4, "all_to_all", fast_slot_factor=1.0)
    assert row["overflow_tokens"] > 0
    assert row["ok"], row


def test_every_exchange_row_names_its_shape():
    """A tiny (CPU smoke) run cannot pass for a measurement: each row says its shape."""
    rows = bench_exchange(2, impls=[("all_to_all", None)], tiny=True, log=lambda _: None)
    assert rows
    for row in rows:
        assert row["tiny"] is True
        assert (row["tokens_per_rank"], row["hidden"]) == (
            TINY_EXCHANGE_SHAPE["tokens"],
            TINY_EXCHANGE_SHAPE["hidden"],
        )

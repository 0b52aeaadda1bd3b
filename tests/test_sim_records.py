"""The simulator's array records: the per-step kernel against the numpy formulation it replaced,
and the growing logs (behaviour only, never wall-clock)."""

from __future__ import annotations

import numpy as np

from schedir.sim.records import STEP_FIELDS, RequestLog, StepLog, account_step


def _numpy_step(reqs: RequestLog, idx, num_tokens, computed, sampled, kind, vocab, start, end):
    """The loop body the kernel replaced, verbatim in numpy (the reference)."""
    fresh = idx[kind == 1]
    if fresh.size:
        new_ones = fresh[np.isnan(reqs.first_scheduled_s[fresh])]
        reqs.first_scheduled_s[new_ones] = start
        hits = computed[kind == 1]
        first = reqs.prefix_hit_tokens[fresh] < 0
        reqs.prefix_hit_tokens[fresh[first]] = hits[first]
    got = idx[sampled]
    if got.size:
        later = reqs.tokens_out[got] > 0
        reqs.add_gaps(end - reqs.last_token_s[got[later]])
        reqs.first_token_s[got[~later]] = end
        reqs.last_token_s[got] = end
        reqs.tokens_out[got] += 1
    decode = (num_tokens == 1) & (computed >= reqs.input_len[idx])
    decode_tokens = int(decode.sum())
    tokens = np.where(sampled, (idx * 7919 + computed + num_tokens) % vocab, -1)
    return int(num_tokens.sum()) - decode_tokens, decode_tokens, tokens


def _fresh_log(n: int, rng: np.random.Generator) -> RequestLog:
    return RequestLog(np.sort(rng.uniform(0, 10, n)), rng.integers(1, 300, n), rng.integers(1, 4, n))


def test_account_step_matches_the_numpy_loop_bit_for_bit():
    rng = np.random.default_rng(7)
    n, vocab = 40, 128256
    a, b = _fresh_log(n, rng), _fresh_log(n, rng)
    b.arrival_s, b.input_len = a.arrival_s, a.input_len
    now = 0.0
    for _ in range(300):
        k = int(rng.integers(1, 12))
        idx = rng.choice(n, size=k, replace=False).astype(np.int64)
        computed = rng.integers(0, 400, k).astype(np.int64)
        num_tokens = np.where(rng.random(k) < 0.6, 1, rng.integers(1, 200, k)).astype(np.int64)
        sampled = rng.random(k) < 0.7
        kind = rng.integers(0, 3, k).astype(np.int64)
        start, now = now, now + float(rng.uniform(0.001, 0.05))
        want_prefill, want_decode, want_tokens = _numpy_step(a, idx, num_tokens, computed, sampled, kind, vocab,
                                                             start, now)
        tokens = np.empty(k, dtype=np.int64)
        prefill, decode, b.gap_count = account_step(
            idx, num_tokens, computed, sampled, kind, b.input_len, vocab, start, now, b.first_scheduled_s,
            b.prefix_hit_tokens, b.first_token_s, b.last_token_s, b.tokens_out, b.reserve_gaps(k), b.gap_count,
            tokens)
        assert (prefill, decode) == (want_prefill, want_decode)
        assert np.array_equal(tokens, want_tokens)
    for name in ("first_scheduled_s", "first_token_s", "last_token_s"):
        assert np.array_equal(getattr(a, name), getattr(b, name), equal_nan=True), name
    for name in ("prefix_hit_tokens", "tokens_out"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.gaps().size > 100
    assert np.array_equal(a.gaps(), b.gaps())  # same samples in the same order


def test_gap_buffer_grows_past_its_first_size():
    log = RequestLog(np.zeros(2), np.ones(2, np.int64), np.ones(2, np.int64))  # room for 16 at first
    for i in range(10):
        log.add_gaps(np.full(5, float(i)))
    assert log.gap_count == 50
    assert np.array_equal(log.gaps(), np.repeat(np.arange(10.0), 5))
    log.add_gaps(np.zeros(0))
    assert log.gaps().size == 50


def test_step_log_grows_and_keeps_every_row():
    steps = StepLog(capacity=3)
    for i in range(10):
        steps.append(i, 2 * i, 3 * i, 4 * i, 5 * i, 6 * i, 0.5, 7.0 * i, 8.0 * i)
    assert steps.size == 10
    assert np.array_equal(steps.column("num_reqs"), 5.0 * np.arange(10))
    assert np.array_equal(steps.column("flops"), 8.0 * np.arange(10))
    assert set(steps.as_dict()) == set(STEP_FIELDS)
    assert steps.column("start_s").flags.c_contiguous

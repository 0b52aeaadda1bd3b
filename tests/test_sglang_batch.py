"""schedir's steps lowered to SGLang's batch fields, checked against the batch plan."""

from __future__ import annotations

import numpy as np

from schedir import Request, Scheduler, SchedulerConfig
from schedir.engines.sglang import ForwardMode, sglang_batch


def _steps(chunk_budget: int):
    s = Scheduler(SchedulerConfig(num_blocks=200, block_size=4, max_num_batched_tokens=chunk_budget,
                                  max_model_len=512, enable_prefix_caching=True))
    rng = np.random.default_rng(0)
    shared = rng.integers(3, 900, 24).tolist()
    for i in range(6):
        s.add_request(Request(f"r{i}", shared + rng.integers(3, 900, int(rng.integers(5, 60))).tolist(),
                              max_tokens=6, ignore_eos=True, arrival_time=float(i)))
    while s.has_requests():
        out = s.schedule()
        yield s, out
        s.update(out, np.where(out.sampled, 7, -1))


def test_fields_agree_with_the_batch_plan() -> None:
    modes = set()
    for s, out in _steps(chunk_budget=40):
        b = sglang_batch(s, out)
        modes.add(b.forward_mode)
        if not len(out.req_ids):
            assert b.forward_mode is ForwardMode.IDLE and b.batch_size == 0
            continue
        assert sorted(b.rids) == sorted(out.req_ids) and b.batch_size == len(out.req_ids)
        assert (b.seq_lens == b.prefix_lens + b.extend_lens).all()
        assert b.out_cache_loc.size == int(b.extend_lens.sum()) == out.total_num_scheduled_tokens
        # each request's new tokens' slots: its block table at positions prefix .. seq_len - 1
        table = out.block_table
        at = 0
        for k, i in enumerate(b.order.tolist()):
            pos = np.arange(b.prefix_lens[k], b.seq_lens[k])
            want = table[i, pos // 4].astype(np.int64) * 4 + pos % 4
            assert b.out_cache_loc[at: at + pos.size].tolist() == want.tolist()
            at += pos.size
        decoding = b.prefix_lens >= b.prompt_lens
        if b.forward_mode is ForwardMode.DECODE:
            assert decoding.all() and (b.extend_lens == 1).all() and b.extend_num_tokens is None
        elif b.forward_mode is ForwardMode.EXTEND:
            assert not decoding.any()
        else:  # extends first, then the decodes (SGLang's mix_with_running)
            assert decoding.any() and not decoding.all()
            first_decode = int(np.argmax(decoding))
            assert decoding[first_decode:].all() and not decoding[:first_decode].any()
            assert b.extend_num_tokens == int(b.extend_lens.sum())
    assert {ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.MIXED} <= modes

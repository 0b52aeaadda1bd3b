"""The `sglang` preset's behaviour without SGLang installed: the rules its passes reproduce
(the step-by-step comparison with SGLang's own classes is in test_sglang_reference.py), the
radix pool's accounting, dumps that replay, and the errors a user can run into."""

from __future__ import annotations

import numpy as np
import pytest

from schedir.ir.errors import PipelineError
from schedir.lowering.radix_pool import RadixKVPool
from schedir.runtime.config import Request, SchedulerConfig
from schedir.runtime.scheduler import Scheduler
from schedir.tools.parity import sglang_schedir
from schedir.tools.parity.sglang_trace import make_trace


def _sched(**kw) -> Scheduler:  # noqa: ANN003
    base = dict(num_blocks=65, block_size=4, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=128,
                pipeline="sglang", policy="lpm")
    return Scheduler(SchedulerConfig(**{**base, **kw}))


def _step(s: Scheduler, token: int = 7):  # noqa: ANN202
    out = s.schedule()
    s.update(out, np.where(out.sampled, token, -1).astype(np.int64))
    s.pool.check()
    return out


def _run(s: Scheduler, limit: int = 500) -> int:
    n = 0
    while s.has_unfinished_requests() and n < limit:
        _step(s)
        n += 1
    return n


def test_radix_pool_conserves_pages_and_frees_everything_at_drain() -> None:
    s = _sched()
    rng = np.random.default_rng(0)
    shared = list(rng.integers(3, 1000, 24))
    for i in range(10):
        s.add_request(Request(request_id=f"r{i}", prompt_token_ids=shared + list(rng.integers(3, 1000, 6)),
                              max_tokens=5))
    _run(s)
    pool = s.pool
    assert isinstance(pool, RadixKVPool)
    assert pool.protected_size == 0 and not pool.nblk.any()
    assert pool.available + pool.evictable == pool.usable_blocks * pool.block_size  # free + cached = the pool
    assert pool.cache_tokens > 0  # finished requests left their KV in the tree


def test_lpm_prefers_the_cached_prefix_and_defers_in_batch_duplicates() -> None:
    s = _sched()
    prefix, other = list(range(100, 124)), list(range(300, 340))
    s.add_request(Request(request_id="warm", prompt_token_ids=prefix + [1, 2, 3, 4], max_tokens=1))
    _step(s)
    for rid, prompt in (("a", other + [5] * 4), ("b", prefix + [9] * 4), ("c", other + [6] * 4)):
        s.add_request(Request(request_id=rid, prompt_token_ids=prompt, max_tokens=4))
    out = _step(s)
    assert out.req_ids == ["b", "a", "c"]  # b hits 24 tokens; c shares 40 with a: last
    assert out.computed.tolist() == [24, 0, 0]


def test_prefill_first_then_decode_and_ratio_decays() -> None:
    s = _sched(policy="fcfs")
    s.add_request(Request(request_id="x", prompt_token_ids=list(range(10, 30)), max_tokens=4))
    first = _step(s)
    s.add_request(Request(request_id="y", prompt_token_ids=list(range(40, 60)), max_tokens=4))
    second = _step(s)  # y's prefill runs alone: x does not decode in a prefill step
    third = _step(s)
    assert first.req_ids == ["x"] and second.req_ids == ["y"] and third.req_ids == ["x", "y"]
    assert third.num_tokens.tolist() == [1, 1]
    assert s.scheduler_state["new_token_ratio"] == pytest.approx(0.7 - (0.7 - 0.7 * 0.14) / 600)


def test_retraction_frees_memory_and_raises_the_ratio() -> None:
    s = _sched(num_blocks=17, max_model_len=64, policy="fcfs",
               pipeline="reject-oversized,sglang-order,sglang-admit{clip=2},sglang-decode{retract-steps=2}")
    for rid, lo, n in (("x", 10, 12), ("y", 30, 12), ("z", 50, 8)):
        s.add_request(Request(request_id=rid, prompt_token_ids=list(range(lo, lo + n)), max_tokens=24))
    retracted: list[str] = []
    ratios = []
    for _ in range(300):
        if not s.has_unfinished_requests():
            break
        out = _step(s)
        retracted.extend(sorted(out.preempted_req_ids))
        ratios.append(s.scheduler_state["new_token_ratio"])
    assert not s.has_unfinished_requests()
    assert retracted and retracted[0] == "y"  # fewest outputs, then the longest prompt, then the later one
    jump = ratios.index(min(ratios[:20]))  # the ratio fell by decay, then jumped at the retraction
    assert max(ratios) <= 1.0 and any(b < a for a, b in zip(ratios, ratios[1:]))
    assert jump >= 0


def test_chunked_prompt_resumes_first_one_at_a_time() -> None:
    s = _sched(max_num_batched_tokens=16, policy="fcfs")
    s.add_request(Request(request_id="long", prompt_token_ids=list(range(10, 50)), max_tokens=2))
    s.add_request(Request(request_id="short", prompt_token_ids=list(range(60, 66)), max_tokens=2))
    steps = [(_o.req_ids, _o.num_tokens.tolist()) for _o in (_step(s) for _ in range(3))]
    assert steps == [(["long"], [16]), (["long"], [16]), (["long", "short"], [8, 6])]


def test_a_request_no_pool_could_hold_is_rejected_not_stalled() -> None:
    s = _sched(num_blocks=9, max_model_len=128, policy="fcfs")  # 32 tokens of KV
    s.add_request(Request(request_id="big", prompt_token_ids=list(range(10, 30)), max_tokens=20))
    out = s.schedule()
    assert out.rejected == {"big": "exceeds-cache"}


def test_a_cached_prefix_does_not_make_a_request_too_big_for_the_pool_admissible() -> None:
    """The matched prefix is locked while a request is weighed, so it stays in the pool beside the
    uncached tokens: a request whose whole prompt plus reservation reaches the pool never fits,
    however much of it is cached. Real SGLang 0.5.23 stalls on it (fuzz seed 2688, driven through
    its PrefillAdder: idle with the request waiting); schedir rejects it instead."""
    s = _sched(num_blocks=9, max_model_len=128, policy="fcfs")  # 8 pages of 4 tokens = 32 tokens of KV
    prompt = list(range(10, 26))
    s.add_request(Request(request_id="warm", prompt_token_ids=prompt, max_tokens=2))
    _run(s)  # its 16 prompt tokens stay cached
    s.add_request(Request(request_id="big", prompt_token_ids=prompt + list(range(40, 48)), max_tokens=4))
    out = _step(s)  # 24 prompt + 4 reserved + a page = 32 tokens: the whole pool
    assert out.rejected == {"big": "exceeds-cache"}
    assert not s.has_unfinished_requests()


def test_dumped_step_replays_to_the_same_decisions(tmp_path) -> None:
    from schedir.ir.pipeline import PassManager
    from schedir.ir.textio import parse_step_file, print_ir

    s = _sched(dump_dir=tmp_path, dump_steps="all", dump_dot=False)
    rng = np.random.default_rng(1)
    shared = list(rng.integers(3, 1000, 16))
    for i in range(6):
        s.add_request(Request(request_id=f"r{i}", prompt_token_ids=shared + list(rng.integers(3, 1000, 5)),
                              max_tokens=6))
    _run(s)
    inputs = sorted(tmp_path.glob("step-*-00-input.mlir"))
    assert len(inputs) > 5
    for src in inputs[:6]:
        final = sorted(tmp_path.glob(src.name.replace("-00-input.mlir", "-*.mlir")))[-1]
        module = parse_step_file(src)
        PassManager.parse("sglang", verify_each=True).run(module)
        assert print_ir(module).strip() == final.read_text().strip(), src.name


@pytest.mark.parametrize(("kw", "msg"), [
    (dict(pipeline="vllm", policy="lpm"), "policy 'lpm' is SGLang's"),
    (dict(policy="priority"), "priority scheduling is not reproduced"),
    (dict(enable_prefix_caching=False), "prefix caching on"),
    (dict(pipeline="reject-oversized,order-vllm,vllm-schedule-running,sglang-order,sglang-admit,sglang-decode"),
     "mixes passes"),
])
def test_refused_configurations_say_why(kw, msg) -> None:  # noqa: ANN001
    with pytest.raises(PipelineError, match=msg):
        _sched(**kw)


def test_pipeline_switch_across_pool_kinds_needs_an_empty_scheduler() -> None:
    s = _sched(policy="fcfs")
    s.set_pipeline("vllm")  # nothing live: the pool is rebuilt
    s.add_request(Request(request_id="r", prompt_token_ids=[5, 6, 7], max_tokens=2))
    with pytest.raises(PipelineError, match="no request is live"):
        s.set_pipeline("sglang")
    assert s.spec == "vllm"


def test_chunk_smaller_than_a_page_is_refused() -> None:
    s = _sched(max_num_batched_tokens=2, policy="fcfs")
    s.add_request(Request(request_id="r", prompt_token_ids=list(range(3, 20)), max_tokens=2))
    with pytest.raises(Exception, match="less than one page"):
        s.schedule()


def test_parity_driver_is_deterministic() -> None:
    trace = make_trace(num_requests=12, seed=9, num_prefixes=2, share_prob=0.7, arrival_rate=1.5)
    a = sglang_schedir.run({"policy": "lpm", "num_kv_tokens": 2048, "chunked_prefill_size": 128}, trace)
    b = sglang_schedir.run({"policy": "lpm", "num_kv_tokens": 2048, "chunked_prefill_size": 128}, trace)
    assert a["steps"] == b["steps"] and a["summary"]["finished"] == 12


def test_one_prefix_cache_question_answered_by_either_cache() -> None:
    """`Step.cached_tokens` (what prefix-cache-aware asks): vLLM's block-hash cache and SGLang's
    radix tree give the same answer for the same history, so the seed's cache-aware order runs
    unchanged over either pool."""
    prefix = list(range(100, 124))

    def first_order(pipeline: str) -> list[str]:
        s = _sched(pipeline=pipeline, policy="fcfs")
        s.add_request(Request(request_id="warm", prompt_token_ids=prefix + [1, 2, 3, 4], max_tokens=1))
        _step(s)
        for rid, prompt in (("cold", list(range(500, 530))), ("half", prefix[:12] + list(range(700, 716))),
                            ("hot", prefix + [9, 9, 9, 9])):
            s.add_request(Request(request_id=rid, prompt_token_ids=prompt, max_tokens=3))
        return _step(s).req_ids

    blocks = first_order("reject-oversized,prefix-cache-aware,schedule-running,admit-greedy")
    radix = first_order("reject-oversized,prefix-cache-aware,sglang-admit,sglang-decode")
    assert blocks == radix == ["hot", "half", "cold"]


def test_radix_peek_leaves_the_tree_untouched() -> None:
    s = _sched(policy="fcfs")
    s.add_request(Request(request_id="warm", prompt_token_ids=list(range(100, 128)), max_tokens=1))
    _step(s)
    s.add_request(Request(request_id="q", prompt_token_ids=list(range(100, 118)) + [1, 2], max_tokens=1))
    pool = s.pool
    before = pool.radix.nodes.copy(), pool.radix.meta.copy()
    row = s.table.row_of["q"]
    assert pool.cached_tokens(np.array([row]), np.array([20])).tolist() == [16]  # whole 4-token pages
    assert np.array_equal(pool.radix.nodes, before[0]) and np.array_equal(pool.radix.meta, before[1])


def test_the_list_window_kernels_equal_their_numpy_forms():
    """`list_keys` (the list's places as rank keys, new arrivals after them) and `passed_over`
    (requests `add_one_req` goes on past: never fit, or taken out by reject-oversized) equal the
    numpy passes they replace in the windows, on random queues, empty ones included."""
    from schedir.passes.sglang_admit import never_fits, passed_over
    from schedir.passes.sglang_order import list_keys

    rng = np.random.default_rng(3)
    for _ in range(500):
        n, cap = int(rng.integers(0, 30)), 64
        rows = rng.permutation(cap)[:n]
        prompt = rng.integers(1, 500, cap)
        total, max_new = prompt + rng.integers(0, 100, cap), rng.integers(0, 400, cap)
        clip, page, usable = int(rng.integers(1, 300)), int(rng.choice([1, 4, 16])), int(rng.integers(1, 80))
        oversized = rng.permutation(n)[: int(rng.integers(0, n + 1))].astype(np.int64)
        expect = never_fits(total[rows], prompt[rows], max_new[rows], clip, page, usable)[1].copy()
        expect[oversized] = True
        assert np.array_equal(passed_over(rows, total, prompt, max_new, clip, page, usable, oversized), expect)
        pos = np.where(rng.random(cap) < 0.4, -1, rng.permutation(cap))
        keys, fresh = list_keys(rows, pos)
        placed = pos[rows]
        after = int(placed.max()) + 1 if n else 0
        assert np.array_equal(keys, np.where(placed >= 0, placed, after + np.arange(n)))
        assert np.array_equal(fresh, np.flatnonzero(placed < 0))

"""The `vllm-v0` preset with prefix caching on: vLLM v0's prefix-caching block allocator.

Step-by-step parity with vLLM 0.8.5's own allocator and scheduler runs when its environment is
present (docs/vllm-v0-reference.md); the allocator's rules, dumps and refusals are checked here
without it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from schedir import Request, Scheduler, SchedulerConfig
from schedir.ir.errors import PipelineError
from schedir.lowering import kv_pool as KP
from schedir.lowering.kv_pool import CACHE_V0, KVPool
from schedir.tools.cli import main as schedir_main
from schedir.tools.parity import v0_reference, v0_schedir, v0_trace

V0_ENV = v0_reference.unavailable_reason()
PREFIX = list(range(11, 19))  # two blocks of 4 tokens


def cached_config(**kw: object) -> SchedulerConfig:
    base = dict(num_blocks=17, block_size=4, max_num_batched_tokens=32, max_model_len=32, max_num_seqs=4,
                enable_prefix_caching=True, pipeline="vllm-v0")
    base.update(kw)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


def step(s: Scheduler):  # noqa: ANN201
    out = s.schedule()
    s.pool.check()
    s.update(out, np.where(out.sampled, 7, -1))
    return out


def evictor(pool: KVPool) -> list[tuple[int, int, int]]:
    """The cached free blocks in the free queue's order, as v0's evictor keys them:
    (last access, depth, block)."""
    n = pool.num_blocks
    return [(int(pool.meta[KP.V0_BLOCKS + b]), int(pool.meta[KP.V0_BLOCKS + n + b]), int(b))
            for b in pool.free_queue().tolist() if pool.bhash[b]]


def test_the_preset_runs_v0s_allocator_and_the_others_refuse_it() -> None:
    s = Scheduler(cached_config())
    assert s.pool.kind == "v0-blocks" and s.pool.cache_kind == CACHE_V0
    assert Scheduler(cached_config(pipeline="vllm")).pool.kind == "blocks"
    with pytest.raises(PipelineError, match="swap of prefix-cached blocks .* not reproduced yet"):
        Scheduler(cached_config(pipeline="vllm-v0-swap", num_cpu_blocks=20))
    with pytest.raises(PipelineError, match="with chunked prefill is not reproduced yet"):
        Scheduler(cached_config(pipeline="vllm-v0-chunked"))
    with pytest.raises(PipelineError, match="under the priority policy is not reproduced yet"):
        Scheduler(cached_config(pipeline="vllm-v0-priority", policy="priority"))
    with pytest.raises(PipelineError, match="mixes .* 'vllm-schedule-running'"):
        Scheduler(cached_config(pipeline="order-vllm,v0-prefills,v0-running,v0-swapped,vllm-schedule-running"))


def test_freed_blocks_are_evicted_as_v0s_lru_evictor_orders_them() -> None:
    """Least recent last access first, then the deepest in its chain, then the lower block id;
    the unhashed partial blocks before all of them (v0's hashless allocator comes first)."""
    s = Scheduler(cached_config(max_num_seqs=2), clock=lambda: 0.0)
    s.add_request(Request("a", PREFIX + [30], max_tokens=1, ignore_eos=True))  # finishes in its prefill step
    step(s)
    s.add_request(Request("b", list(range(40, 48)) + [31, 32], max_tokens=2, ignore_eos=True))
    s.add_request(Request("c", list(range(50, 58)) + [33], max_tokens=2, ignore_eos=True))
    while s.has_unfinished_requests():
        step(s)
    keys = evictor(s.pool)
    assert len(keys) == 6  # three requests' two full blocks each
    assert keys == sorted(keys, key=lambda k: (k[0], -k[1], k[2]))
    assert keys[0][0] < keys[-1][0]  # "a" left first: its blocks go first
    assert [d for _, d, _ in keys[:2]] == [2, 1]  # deepest first
    front = s.pool.free_queue()[: s.pool.num_free - len(keys)]
    assert not s.pool.bhash[front].any()  # the unhashed ones lead


def test_sharers_of_a_new_prefix_in_one_step_are_charged_whole() -> None:
    """A prefix registered in this step is not computed yet: the second request shares its
    blocks but v0 charges (and computes) all of its tokens; a prefix registered before is a hit."""
    s = Scheduler(cached_config(), clock=lambda: 0.0)
    s.add_request(Request("old", PREFIX + [30], max_tokens=2, ignore_eos=True))
    step(s)
    step(s)  # "old" finishes: its two full blocks wait in the evictor
    s.add_request(Request("hit", PREFIX + [31, 32], max_tokens=2, ignore_eos=True))
    s.add_request(Request("new-a", list(range(21, 29)) + [33], max_tokens=2, ignore_eos=True))
    s.add_request(Request("new-b", list(range(21, 29)) + [34], max_tokens=2, ignore_eos=True))
    out = step(s)
    assert out.req_ids == ["hit", "new-a", "new-b"]
    assert out.num_tokens.tolist() == [2, 9, 9] and out.computed.tolist() == [8, 0, 0]
    rows = [s.table.row_of[n] for n in ("new-a", "new-b")]
    assert (s.pool.table[rows[0], :2] == s.pool.table[rows[1], :2]).all()  # shared, though charged twice
    assert s.pool.num_free == 16 - 3 - 3 - 1


def test_a_block_that_fills_with_cached_content_is_given_up() -> None:
    """Two requests with the same prompt decode the same tokens: the decode block the second
    fills is the first's, so it gives its own back (v0's promote_to_immutable_block)."""
    s = Scheduler(cached_config(), clock=lambda: 0.0)
    s.add_request(Request("a", PREFIX + [30, 31], max_tokens=6, ignore_eos=True))
    step(s)
    s.add_request(Request("b", PREFIX + [30, 31], max_tokens=6, ignore_eos=True))
    free = []
    while s.has_unfinished_requests():
        step(s)
        free.append(s.pool.num_free)
    ra, rb = s.table.row_of.get("a"), s.table.row_of.get("b")
    assert ra is None and rb is None  # both done, every block back
    assert s.pool.num_free == 16
    assert any(later > earlier for earlier, later in zip(free, free[1:], strict=False))  # a block came back


def test_dumped_cached_steps_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A step replays alone from its dump: the pool prints v0's clock, its per-block facts and the
    hits noted (`mem.pool`), and dumping changes no decision."""
    def run(dump: bool) -> tuple[Scheduler, list]:
        s = Scheduler(cached_config(num_blocks=13, **({"dump_dir": tmp_path, "dump_steps": "all"} if dump else {})),
                      clock=lambda: 0.0)
        for i in range(3):
            s.add_request(Request(f"r{i}", PREFIX + [40 + i, 50 + i], max_tokens=8, ignore_eos=True))
        outs = []
        while s.has_unfinished_requests():
            outs.append(step(s))
            if outs[-1].step == 3:
                s.add_request(Request("again", PREFIX + [40, 50], max_tokens=3, ignore_eos=True))
        return s, outs

    s, dumped = run(True)
    _, plain = run(False)
    assert [(o.req_ids, o.num_tokens.tolist()) for o in dumped] == [(o.req_ids, o.num_tokens.tolist()) for o in plain]
    for out in dumped:
        stem = f"step-{out.step:05d}-"
        capsys.readouterr()
        code = schedir_main(["opt", str(tmp_path / f"{stem}00-input.mlir"), "-p", s.spec])
        replayed = capsys.readouterr().out
        assert code == 0 and replayed == (tmp_path / f"{stem}04-v0-swapped.mlir").read_text()
    assert "caching = [2]" in replayed and "v0_blocks = [" in replayed


@pytest.mark.skipif(V0_ENV is not None, reason=f"vLLM 0.8.5's v0 scheduler is not available: {V0_ENV}")
def test_random_prefix_scenarios_match_v0_step_by_step() -> None:
    """Random traces on shared prefixes, some prompts repeated whole, pools from tight to ample:
    the long run's (`python -m schedir.tools.parity.v0_schedir --random-prefix N`) first 12, and
    seeds that once differed (1033: the waiting head's hit v0 notes while every seat is taken;
    39: a decode's full block registered as it is appended)."""
    seeds = [*range(12), 39, 1033]
    scenarios = {f"random-prefix-{k}": v0_schedir.random_prefix_scenario(k) for k in seeds}
    scenarios["prefix"] = v0_trace.scenarios()["prefix"]
    refs = v0_reference.run_reference(scenarios)
    steps = cached = 0
    for name, (trace, cfg) in scenarios.items():
        ours = v0_schedir.run_schedir(trace, cfg)
        steps += len(ours["steps"])
        cached += sum(e["cached"] for s in ours["steps"] for e in s["scheduled"])
        diffs = v0_schedir.compare(refs[name], ours)
        assert diffs == [], f"{name} {cfg}: {diffs[:5]}"
    assert steps > 1000 and cached > 1000  # the hits were there to get right


@pytest.mark.skipif(V0_ENV is not None, reason=f"vLLM 0.8.5's v0 scheduler is not available: {V0_ENV}")
def test_the_comparison_sees_each_rule_dropped() -> None:
    """Three of the allocator's rules dropped in turn, each over the same scenarios: the blocks'
    last access (every block evicted by depth alone), the head's hit noted while every seat is
    taken, and the noted hit forgotten when its request is preempted. Each shows."""
    seeds = [*range(12), 39, 1033]
    scenarios = {f"random-prefix-{k}": v0_schedir.random_prefix_scenario(k) for k in seeds}
    refs = v0_reference.run_reference(scenarios)

    def differences() -> int:
        return sum(len(v0_schedir.compare(refs[n], v0_schedir.run_schedir(t, c))) for n, (t, c) in scenarios.items())

    decide = Scheduler._decide_step

    def ungated(self: Scheduler, start: float, step: int):  # noqa: ANN202
        self.pool.v0_step(step)
        out = decide(self, start, step)
        self.pool.v0_scheduled(out.rows, step)
        return out

    for target, name, mutant in ((KVPool, "v0_scheduled", lambda self, rows, step: None),
                                 (Scheduler, "_v0_step", ungated),
                                 (KVPool, "v0_forget", lambda self, rows: None)):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(target, name, mutant)
            assert differences() > 0, name

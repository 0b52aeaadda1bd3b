"""vLLM 0.8.5's v0 Scheduler (swap, recompute, ignored, delay_factor) driven on schedir's reference scenarios.

The trace and config helpers run everywhere. The scenario checks need the v0 environment
(SCHEDIR_VLLM_V0_PYTHON, default /work/v0-env/bin/python or ../v0-env beside the clone; how to build
it is in docs/vllm-v0-reference.md) and skip with the reason when it is absent. They check that each
scenario shows what it is there to show before a `vllm-v0` preset is compared against it: swaps out
and back in before new admissions, recompute under v0's default choice, the error when the CPU pool
is too small, ignored requests with their rule, chunked and prefill-first batches, prefix hits,
delay_factor holding prefills back, priority preemption, aborts from every queue, blocks conserved
in both pools at every step and at drain, and determinism.
"""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pytest

from schedir.tools.parity import harness
from schedir.tools.parity import v0_reference as ref
from schedir.tools.parity.v0_trace import (
    DEFAULT_CONFIG,
    check_config,
    check_trace,
    fake_token,
    from_harness,
    make_trace,
    scenarios,
)

# ---- helpers that need no vLLM 0.8.5 ---------------------------------------------------------


def test_trace_is_seeded_and_valid() -> None:
    a = make_trace(num_requests=20, seed=3, num_prefixes=2, share_prob=0.5, priorities=3)
    assert a == make_trace(num_requests=20, seed=3, num_prefixes=2, share_prob=0.5, priorities=3)
    assert a != make_trace(num_requests=20, seed=4, num_prefixes=2, share_prob=0.5, priorities=3)
    reqs = check_trace(a)
    assert len(reqs) == 20 and {r["priority"] for r in reqs} <= {0, 1, 2}
    assert [r["rid"] for r in reqs] == sorted(r["rid"] for r in reqs)  # zero-padded: string order = trace order


def test_fake_token_is_the_parity_harness_token() -> None:
    """Both sides must sample the same tokens: a recomputed request re-prefills its outputs."""
    for pos in (0, 1, 17, 4096, 123457):
        assert fake_token(pos) == harness.fake_token(pos)


def test_harness_traces_convert() -> None:
    cfg = harness.ParityConfig(num_requests=5, prompt_max=64, output_max=32, policy="priority", seed=2)
    tr = from_harness(harness.make_trace(cfg))
    reqs = check_trace(tr)
    assert [r["rid"] for r in reqs] == [r.req_id for r in harness.make_trace(cfg)]
    assert all(r["abort_step"] is None for r in reqs)


@pytest.mark.parametrize(
    ("cfg", "msg"),
    [({"nope": 1}, "unknown config key"), ({"policy": "sjf"}, "is not one of"),
     ({"preemption_mode": "evict"}, "is not one of"), ({"num_gpu_blocks": 0}, "positive"),
     ({"num_cpu_blocks": -1}, "non-negative"), ({"delay_factor": -1}, "non-negative")],
)
def test_bad_config_is_named(cfg: dict[str, Any], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        check_config(cfg)


def test_bad_trace_is_named() -> None:
    good = make_trace(num_requests=2, seed=0)["requests"]
    with pytest.raises(ValueError, match=r"#1 \(r1\).*max_tokens"):
        check_trace({"requests": [good[0], {**good[1], "max_tokens": 0}]})
    with pytest.raises(ValueError, match="unique"):
        check_trace({"requests": [good[0], dict(good[0])]})
    with pytest.raises(ValueError, match="abort_step"):
        check_trace({"requests": [{**good[0], "abort_step": -2}]})


def test_every_scenario_is_valid() -> None:
    for name, (tr, cfg) in scenarios().items():
        check_trace(tr)
        assert set(check_config(cfg)) == set(DEFAULT_CONFIG), name


def test_driver_rejects_bad_input_without_traceback(tmp_path) -> None:
    """The driver checks its input before importing vLLM, so schedir's python can run this."""
    bad = tmp_path / "t.json"
    bad.write_text('{"requests": 3}')
    proc = subprocess.run([sys.executable, str(ref.DRIVER), "--trace", str(bad), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "a trace is a JSON object" in proc.stderr


def test_missing_env_is_one_sentence(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(ref.ENV_VAR, str(tmp_path / "nope" / "python"))
    try:
        reason = ref.unavailable_reason()
        assert reason is not None and "does not exist" in reason and "\n" not in reason
        with pytest.raises(RuntimeError, match="does not exist"):
            ref.run_reference({})
    finally:
        monkeypatch.undo()

# ---- vLLM 0.8.5's real v0 Scheduler -------------------------------------------------------------

REASON = ref.unavailable_reason()
needs_v0 = pytest.mark.skipif(REASON is not None, reason=f"vLLM v0 reference unavailable: {REASON}")
ERRORS = {"swap-cpu-exhausted", "priority-swap"}
"""Scenarios where v0 itself raises (the record's last step carries the error)."""


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    if REASON is not None:
        pytest.skip(REASON)
    return ref.run_reference(scenarios())


def _spec(name: str) -> dict[str, dict[str, Any]]:
    return {r["rid"]: r for r in check_trace(scenarios()[name][0])}


@needs_v0
def test_every_scenario_drains_and_conserves_blocks(runs: dict[str, Any]) -> None:
    """GPU and CPU free counts stay in range every step and return to the totals at drain; every
    request ends finished, ignored or aborted."""
    assert set(runs) == set(scenarios())
    for name, res in runs.items():
        summ, cfg = res["summary"], res["config"]
        assert res["vllm_version"] == "0.8.5", name
        for s in res["steps"]:
            assert 0 <= s["free_gpu_blocks"] <= cfg["num_gpu_blocks"], (name, s["step"])
            assert 0 <= s["free_cpu_blocks"] <= cfg["num_cpu_blocks"], (name, s["step"])
            # the token budget counts uncached tokens only (a prefix hit is scheduled "for free")
            assert sum(e["tokens"] - e["cached"] for e in s["scheduled"]) <= cfg["max_num_batched_tokens"], name
            assert len(s["scheduled"]) <= cfg["max_num_seqs"], (name, s["step"])
            assert len({e["rid"] for e in s["scheduled"]}) == len(s["scheduled"]), (name, s["step"])
            if not s["swapped"] and name not in ERRORS:  # priority-swap leaves a SWAPPED request in waiting
                assert s["free_cpu_blocks"] == cfg["num_cpu_blocks"], (name, s["step"])
        if name in ERRORS:
            assert summ["error"], name
            continue
        assert summ["error"] is None, (name, summ["error"])
        assert summ["finished"] + len(summ["ignored"]) + len(summ["aborted"]) == summ["requests"], name
        assert summ["final_free_gpu_blocks"] == cfg["num_gpu_blocks"], name
        assert summ["final_free_cpu_blocks"] == cfg["num_cpu_blocks"], name
        assert summ["unfinished"] == {"waiting": [], "running": [], "swapped": []}, name


@needs_v0
def test_cpu_pool_holds_exactly_the_swapped_blocks(runs: dict[str, Any]) -> None:
    """Block conservation across the pools: CPU blocks in use equal the blocks of the requests
    swapped out and not yet swapped in or aborted, at every step."""
    for name in ("swap", "swap-chunked", "aborts"):
        res = runs[name]
        on_cpu: dict[str, int] = {}
        for s in res["steps"]:
            for a in s["aborted"]:
                on_cpu.pop(a["rid"], None)
            for rid in s["swapped_in"]:
                assert s["swapped_in"][rid] == on_cpu.pop(rid), (name, s["step"], rid)
            on_cpu.update(s["swapped_out"])
            assert res["config"]["num_cpu_blocks"] - s["free_cpu_blocks"] == sum(on_cpu.values()), (name, s["step"])
            assert set(on_cpu) == set(s["swapped"]), (name, s["step"])
            assert s["blocks_to_swap_out"] == sum(s["swapped_out"].values()), (name, s["step"])
            assert s["blocks_to_swap_in"] == sum(s["swapped_in"].values()), (name, s["step"])


@needs_v0
def test_deterministic_across_processes(runs: dict[str, Any]) -> None:
    again = ref.run_reference({k: v for k, v in scenarios().items() if k in ("swap", "prefix", "delay", "aborts")})
    for name, res in again.items():
        assert res["steps"] == runs[name]["steps"], name


@needs_v0
def test_swap_out_then_back_in_before_new_admissions(runs: dict[str, Any]) -> None:
    for name in ("swap", "swap-chunked"):
        steps = runs[name]["steps"]
        summ = runs[name]["summary"]
        assert summ["swap_out_events"] >= 10 and summ["blocks_swapped_out"] > 0, name
        assert summ["recompute_events"] == 0, name  # swap forced: nobody is recomputed
        out_at: dict[str, int] = {}
        for s in steps:
            for rid in s["swapped_out"]:
                out_at[rid] = s["step"]
                assert all(p["mode"] == "swap" for p in s["preemptions"]), (name, s["step"])
            for rid in s["swapped_in"]:
                assert out_at.pop(rid) < s["step"]
                assert any(e["rid"] == rid for e in s["scheduled"]), (name, s["step"])
        assert not out_at, f"{name}: swapped out and never back: {sorted(out_at)}"
        assert summ["swap_in_events"] == summ["swap_out_events"], name
    # chunked prefill off: while anything is swapped, no new prefill is admitted (`_schedule_default`
    # skips `_schedule_prefills`), and a step is either all prefills or all decodes.
    steps = runs["swap"]["steps"]
    for prev, s in zip(steps, steps[1:]):
        assert s["kind"] in ("prefill", "decode", "empty")
        if prev["swapped"]:
            assert s["kind"] != "prefill", s["step"]
    # a swap-out step swaps nothing in (`_schedule_swapped` runs only when nobody was preempted)
    for name in ("swap", "swap-chunked"):
        assert not any(s["swapped_out"] and s["swapped_in"] for s in runs[name]["steps"]), name


@needs_v0
def test_swap_chunked_mixes_prefills_and_decodes(runs: dict[str, Any]) -> None:
    steps = runs["swap-chunked"]["steps"]
    assert runs["swap-chunked"]["summary"]["mixed_steps"] > 0
    for s in steps:
        kinds = [e["phase"] for e in s["scheduled"]]
        # `_schedule_chunked_prefill` output order: prefills first, then decodes
        assert kinds == sorted(kinds, key=lambda k: k != "prefill"), s["step"]


@needs_v0
def test_cpu_pool_too_small_is_an_error_not_a_recompute(runs: dict[str, Any]) -> None:
    """0.8.5 never falls back to recompute when swap space runs out: `_swap_out` raises."""
    res = runs["swap-cpu-exhausted"]
    assert "lack of CPU swap space" in res["summary"]["error"]
    assert res["summary"]["recompute_events"] == 0 and res["summary"]["swap_out_events"] == 0
    assert res["steps"][-1]["error"] == res["summary"]["error"]


@needs_v0
def test_default_mode_recomputes_single_sequence_requests(runs: dict[str, Any]) -> None:
    """preemption_mode None: every request is one sequence, so `_preempt` picks RECOMPUTE."""
    res = runs["recompute"]
    summ = res["summary"]
    assert summ["recompute_events"] >= 10 and summ["swap_out_events"] == summ["blocks_swapped_out"] == 0
    spec = _spec("recompute")
    outputs: dict[str, int] = {}
    redo: set[str] = set()
    for s in res["steps"]:
        for e in s["scheduled"]:
            if e["phase"] == "prefill" and e["rid"] in redo:
                # recomputed: the prompt and every output token so far are prefilled again from 0
                assert e["computed_before"] == 0 and e["tokens"] == len(spec[e["rid"]]["prompt"]) + outputs[e["rid"]]
                redo.discard(e["rid"])
        for e in s["scheduled"]:
            prompt = len(spec[e["rid"]]["prompt"])
            if e["phase"] == "decode" or e["computed_before"] + e["tokens"] >= prompt:
                outputs[e["rid"]] = e["computed_before"] + e["tokens"] + 1 - prompt
        for p in s["preemptions"]:
            assert p == {"rid": p["rid"], "mode": "recompute", "by": "memory"}
            assert p["rid"] in s["waiting"]
            redo.add(p["rid"])
        assert s["preempted"] == len(s["preemptions"])
    assert not redo


@needs_v0
def test_ignored_requests_and_their_rule(runs: dict[str, Any]) -> None:
    res = runs["ignored"]
    reasons = {rid: why for s in res["steps"] for rid, why in s["ignored_reasons"].items()}
    assert reasons == {"huge-gpu": "kv_capacity", "huge-len": "prompt_limit", "huge-both": "prompt_limit"}
    assert res["summary"]["finished"] == res["summary"]["requests"] - 3
    scheduled = {e["rid"] for s in res["steps"] for e in s["scheduled"]}
    assert not scheduled & set(reasons)
    # chunked prefill on: the prompt limit is compared with the chunk, so the over-long prompt runs
    res = runs["ignored-chunked"]
    reasons = {rid: why for s in res["steps"] for rid, why in s["ignored_reasons"].items()}
    assert reasons == {"huge-both": "kv_capacity"}
    chunks = [e for s in res["steps"] for e in s["scheduled"] if e["rid"] == "huge-len"]
    assert len(chunks) >= 2 and sum(e["tokens"] for e in chunks) == 700
    finished_at = {rid: s["step"] for s in res["steps"] for rid in s["finished"]}
    assert "huge-len" in finished_at and "huge-gpu" in finished_at  # length-capped after one token


@needs_v0
def test_chunked_prefill_splits_long_prompts(runs: dict[str, Any]) -> None:
    res = runs["chunked"]
    spec = _spec("chunked")
    budget = res["config"]["max_num_batched_tokens"]
    pieces: dict[str, list[dict[str, Any]]] = {}
    for s in res["steps"]:
        for e in s["scheduled"]:
            if e["phase"] == "prefill":
                pieces.setdefault(e["rid"], []).append(e)
        assert len([e for e in s["scheduled"] if e["phase"] == "prefill"]) <= 2  # max_num_partial_prefills
    for rid, chunks in pieces.items():
        assert len(chunks) >= math.ceil(len(spec[rid]["prompt"]) / budget) >= 2, rid
        for prev, nxt in zip(chunks, chunks[1:]):
            assert nxt["computed_before"] == prev["computed_before"] + prev["tokens"]
        assert chunks[-1]["computed_before"] + chunks[-1]["tokens"] == len(spec[rid]["prompt"])
    assert any(len([e for e in s["scheduled"] if e["phase"] == "prefill"]) == 2 for s in res["steps"])


@needs_v0
def test_prefix_caching_hits(runs: dict[str, Any]) -> None:
    res = runs["prefix"]
    hits = [e for s in res["steps"] for e in s["scheduled"] if e["cached"]]
    assert hits and all(e["phase"] == "prefill" and e["cached"] < e["tokens"] for e in hits)
    bs = res["config"]["block_size"]
    assert all(e["cached"] % bs == 0 or (e["cached"] + 1) % bs == 0 for e in hits)  # whole blocks (-1 on a full hit)


@needs_v0
def test_delay_factor_holds_prefills_back(runs: dict[str, Any]) -> None:
    """`_passed_delay`: while something runs, prefills wait until the oldest waiting request has
    waited more than delay_factor x the last prompt step's latency (one fake-clock step here)."""
    res = runs["delay"]
    delay = res["config"]["delay_factor"]
    arrival = {rid: r["arrival_step"] for rid, r in _spec("delay").items()}
    held = 0
    steps = res["steps"]
    for prev, s in zip(steps, steps[1:]):
        if s["step"] != prev["step"] + 1 or not prev["running"]:
            continue
        waiting = prev["waiting"] + [r for r, a in arrival.items() if a == s["step"]]
        if not waiting:
            continue
        oldest = min(arrival[r] for r in waiting)
        if s["kind"] == "prefill":
            assert s["time"] - oldest > delay, s["step"]
        else:
            held += 1
    assert held >= 5


@needs_v0
def test_priority_preemption(runs: dict[str, Any]) -> None:
    res = runs["priority"]
    pre = [(s["step"], p) for s in res["steps"] for p in s["preemptions"]]
    assert pre and all(p["by"] == "priority" and p["mode"] == "recompute" for _, p in pre)
    assert {p["rid"] for _, p in pre} == {"lo3"}  # the lowest priority, latest arrival
    assert all(s["preempted"] == 0 for s in res["steps"])  # v0 does not count these in `preempted`
    first = {rid: s["step"] for s in reversed(res["steps"]) for e in s["scheduled"] for rid in [e["rid"]]}
    done = {rid: s["step"] for s in res["steps"] for rid in s["finished"]}
    assert first["hi1"] > pre[0][0] and done["hi1"] < done["lo3"]
    # with swap forced, 0.8.5 swaps the victim out but queues it as waiting: the next prefill pass asserts
    err = runs["priority-swap"]
    assert [p["mode"] for s in err["steps"] for p in s["preemptions"]] == ["swap"]
    assert err["summary"]["blocks_swapped_out"] == 0  # the victim's swap mapping never reaches the output
    assert "Waiting sequence group should have only one prompt sequence" in err["summary"]["error"]


@needs_v0
def test_aborts_from_every_queue(runs: dict[str, Any]) -> None:
    res = runs["aborts"]
    spec = _spec("aborts")
    where = {a["rid"]: a["from"] for s in res["steps"] for a in s["aborted"]}
    assert set(where) == {rid for rid, r in spec.items() if r["abort_step"] is not None}
    assert set(where.values()) == {"waiting", "running", "swapped"}
    for s in res["steps"]:
        for a in s["aborted"]:
            assert s["step"] == spec[a["rid"]]["abort_step"]
            later = [t for t in res["steps"] if t["step"] >= s["step"]]
            assert not any(e["rid"] == a["rid"] for t in later for e in t["scheduled"])
            assert all(a["rid"] not in t["waiting"] + t["running"] + t["swapped"] for t in later)


@needs_v0
def test_config_vllm_rejects_is_one_line() -> None:
    """vLLM's own SchedulerConfig check (no chunked prefill, budget below max_model_len)."""
    with pytest.raises(RuntimeError, match=r"exit 2\): v0_driver: bad: vLLM 0.8.5 rejects the config: "
                                           r"max_num_batched_tokens \(512\) is smaller than max_model_len"):
        ref.run_reference({"bad": (make_trace(num_requests=2, seed=0), {"max_num_batched_tokens": 512})})

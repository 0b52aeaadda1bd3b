"""SGLang 0.5.23's real scheduling classes driven on schedir's reference scenarios.

The trace and config helpers run everywhere. The scenario checks need SGLang's own
environment (SCHEDIR_SGLANG_PYTHON, default /work/sgl-env/bin/python; how to build it is in
docs/sglang-reference.md) and skip with the reason when it is absent. They check what the
reference must show before a `sglang` preset is compared against it: determinism, LPM
admitting the longest cached prefix first, chunked prefill splitting long prompts, retraction
in the small-memory scenario with new_token_ratio decaying then jumping, and tokens conserved.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from schedir.tools.parity import sglang_reference as ref
from schedir.tools.parity.sglang_trace import (
    DEFAULT_CONFIG,
    EOS_TOKEN_ID,
    check_config,
    check_trace,
    fake_token,
    make_trace,
    scenarios,
)

# ---- helpers that need no SGLang -----------------------------------------------------------


def test_trace_is_seeded_and_valid() -> None:
    a = make_trace(num_requests=20, seed=3, num_prefixes=2, share_prob=0.5, early_stop_prob=0.5)
    assert a == make_trace(num_requests=20, seed=3, num_prefixes=2, share_prob=0.5, early_stop_prob=0.5)
    assert a != make_trace(num_requests=20, seed=4, num_prefixes=2, share_prob=0.5, early_stop_prob=0.5)
    assert len(check_trace(a, check_config({}))) == 20


def test_burst_trace_warms_every_prefix_first() -> None:
    tr = make_trace(num_requests=10, seed=1, burst_at=7, num_prefixes=3, share_prob=1.0)
    warm = [r for r in tr["requests"] if r["rid"].startswith("w")]
    assert [r["arrival_step"] for r in warm] == [0, 0, 0]
    assert {r["arrival_step"] for r in tr["requests"]} - {0} == {7}


def test_fake_token_emits_eos_only_on_early_stop() -> None:
    assert fake_token(0, 3, 4, 10) == EOS_TOKEN_ID
    assert fake_token(0, 9, 10, 10) != EOS_TOKEN_ID
    assert fake_token(1, 0, 5, 5) == fake_token(1, 0, 5, 5) != fake_token(2, 0, 5, 5)


@pytest.mark.parametrize(
    ("cfg", "msg"),
    [({"nope": 1}, "unknown config key"), ({"policy": "sjf"}, "is not one of"), ({"num_kv_tokens": 0}, "positive")],
)
def test_bad_config_is_named(cfg: dict[str, Any], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        check_config(cfg)


def test_bad_trace_is_named() -> None:
    good = make_trace(num_requests=2, seed=0)
    bad = {"requests": [dict(good["requests"][0]), {**good["requests"][1], "output_len": 0}]}
    with pytest.raises(ValueError, match=r"#1 \(r1\).*output_len"):
        check_trace(bad, dict(DEFAULT_CONFIG))


def test_driver_rejects_bad_input_without_traceback(tmp_path) -> None:
    """The driver's argument checks run before SGLang is imported, so schedir's python can run them."""
    bad = tmp_path / "t.json"
    bad.write_text('{"requests": 3}')
    proc = subprocess.run([sys.executable, str(ref.DRIVER), "--trace", str(bad), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "a trace is a JSON object" in proc.stderr


# ---- SGLang's real classes -------------------------------------------------------------------

REASON = ref.unavailable_reason()
needs_sglang = pytest.mark.skipif(REASON is not None, reason=f"SGLang reference unavailable: {REASON}")


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    if REASON is not None:
        pytest.skip(REASON)
    return ref.run_reference(scenarios())


def _extends(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in steps if s["mode"] == "extend"]


@needs_sglang
def test_every_scenario_drains_and_conserves_tokens(runs: dict[str, Any]) -> None:
    for name, res in runs.items():
        summ, cfg = res["summary"], res["config"]
        assert res["sglang_version"] == "0.5.23"
        assert summ["finished"] == summ["requests"], name
        assert summ["final_protected"] == 0, name
        assert summ["final_free_tokens"] + summ["final_evictable"] == cfg["num_kv_tokens"], name
        for s in res["steps"]:
            assert s["mode"] in ("extend", "decode", "idle")
            assert s["free_tokens"] + s["cache_tokens"] <= cfg["num_kv_tokens"], (name, s["step"])


@needs_sglang
def test_deterministic_across_processes(runs: dict[str, Any]) -> None:
    again = ref.run_reference({k: v for k, v in scenarios().items() if k in ("lpm-burst", "random")})
    for name, res in again.items():
        assert res["steps"] == runs[name]["steps"], name


@needs_sglang
def test_lpm_admits_longest_prefix_first_fcfs_in_arrival_order(runs: dict[str, Any]) -> None:
    lpm = _extends(runs["lpm-burst"]["steps"])
    burst = [s for s in lpm if s["step"] >= 10]
    assert burst, "the burst was never admitted"
    for s in burst:
        matched = [m for _, m in s["queue_order"]]
        assert matched == sorted(matched, reverse=True), s["queue_order"]  # no dedupe case here (hits > 32)
        fresh = [a for a in s["admitted"] if not a["continued"]]
        assert fresh[0]["prefix"] == max(a["prefix"] for a in fresh)
    fcfs = [a["rid"] for s in _extends(runs["fcfs-burst"]["steps"]) if s["step"] >= 10
            for a in s["admitted"] if not a["continued"]]
    assert fcfs == sorted(fcfs, key=lambda rid: int(rid[1:]))
    lpm_order = [a["rid"] for s in burst for a in s["admitted"] if not a["continued"]]
    assert lpm_order != fcfs and sorted(lpm_order) == sorted(fcfs)


@needs_sglang
def test_chunking_splits_long_prompts(runs: dict[str, Any]) -> None:
    res = runs["chunked"]
    size = res["config"]["chunked_prefill_size"]
    prompts = {r["rid"]: len(r["prompt"]) for r in scenarios()["chunked"][0]["requests"]}
    pieces: dict[str, list[dict[str, Any]]] = {}
    for s in _extends(res["steps"]):
        assert sum(a["extend"] for a in s["admitted"]) <= size
        for a in s["admitted"]:
            pieces.setdefault(a["rid"], []).append(a)
    long = [rid for rid, n in prompts.items() if n > size]
    assert long
    for rid in long:
        chunks = pieces[rid]
        assert len(chunks) >= 2 and all(c["continued"] for c in chunks[1:])
        for prev, nxt in zip(chunks, chunks[1:]):
            assert nxt["prefix"] == prev["prefix"] + prev["extend"]  # each chunk resumes where the last ended
        assert chunks[-1]["prefix"] + chunks[-1]["extend"] == prompts[rid]
    assert all(s["chunked"] is None or isinstance(s["chunked"], str) for s in res["steps"])


@needs_sglang
def test_small_memory_retracts_and_ratio_jumps_after_decaying(runs: dict[str, Any]) -> None:
    steps = runs["retract"]["steps"]
    cfg = runs["retract"]["config"]
    init = cfg["init_new_token_ratio"]
    floor = init * cfg["min_new_token_ratio_factor"]
    retract_steps = [s for s in steps if s["retracted"]]
    assert len(retract_steps) >= 3
    for s in retract_steps:
        assert s["new_token_ratio"] > s["ratio_used"]  # the jump to retract_decode's estimate
        for rid in s["retracted"]:
            assert rid in s["waiting"]  # back to the waiting queue
    decays = [s for s in steps if s["mode"] == "decode" and not s["retracted"]]
    assert decays and all(s["new_token_ratio"] <= s["ratio_used"] for s in decays)
    assert any(s["new_token_ratio"] < s["ratio_used"] for s in decays)
    assert min(s["new_token_ratio"] for s in steps) == pytest.approx(floor)
    # Retracted requests come back: every one of them is admitted again later.
    for s in retract_steps:
        later = {a["rid"] for t in steps[s["step"] + 1:] for a in t["admitted"]}
        assert set(s["retracted"]) <= later


@needs_sglang
def test_ratio_resets_when_idle(runs: dict[str, Any]) -> None:
    steps = runs["lpm-burst"]["steps"]
    init = runs["lpm-burst"]["config"]["init_new_token_ratio"]
    idle = [s for s in steps if s["mode"] == "idle"]
    assert idle and all(s["new_token_ratio"] == init for s in idle)


@needs_sglang
def test_other_policies_run(runs: dict[str, Any]) -> None:
    lof = _extends(runs["lof"]["steps"])[0]
    spec = {r["rid"]: r["max_new_tokens"] for r in scenarios()["lof"][0]["requests"]}
    order = [spec[rid] for rid, _ in lof["queue_order"]]
    assert order == sorted(order, reverse=True)  # longest output first
    assert runs["dfs-weight"]["summary"]["prefix_hit_tokens"] > 0
    rnd = [rid for rid, _ in _extends(runs["random"]["steps"])[0]["queue_order"]]
    assert rnd != sorted(rnd, key=lambda rid: int(rid[1:]))


# ---- schedir's sglang preset against them, step by step ---------------------------------------


@needs_sglang
def test_sglang_preset_matches_sglang_step_by_step(runs: dict[str, Any]) -> None:
    """Every scenario, every step: mode, queue order with prefix hits, admitted requests (extend,
    prefix, continued), chunked request, decodes, retractions, finishes, new_token_ratio, the
    waiting list and the radix cache / pool sizes (sglang_schedir.COMPARED)."""
    from schedir.tools.parity import sglang_schedir

    for name, (trace, cfg) in scenarios().items():
        ours = sglang_schedir.run(cfg, trace)
        diffs = sglang_schedir.compare(runs[name], ours)
        assert not diffs, f"{name}: {len(diffs)} differences, first: " + "; ".join(diffs[:3])
        assert ours["summary"]["retractions"] == runs[name]["summary"]["retractions"], name

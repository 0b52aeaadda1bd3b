"""The tally: outcomes, failure reasons, and the failures the class under test is to blame for.

Adapter bugs ("interface/views behaviour") are listed one per line with the failing assertion,
so the tally is a to-do list; failures in tests that reach vLLM internals are only counted by
reason. With a baseline (`--compare`) the stock column sits beside it and tests that pass on
stock vLLM but not on the class under test are listed.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import attrs

from schedir.tools.vllm_tests import VLLM_VERSION, classify
from schedir.tools.vllm_tests.runner import RunResult, TestResult

OUTCOMES = ("passed", "failed", "error", "skipped")


def counts(run: RunResult) -> Counter[str]:
    """Outcome -> number of test cases."""
    return Counter(r.outcome for r in run.results)


def categories(run: RunResult) -> Counter[str]:
    """Failure reason -> number of failed/errored cases."""
    return Counter(r.category for r in run.results if r.category)


def bugs(run: RunResult) -> list[TestResult]:
    """Failures classified as the class under test's own fault."""
    return [r for r in run.results if r.category == classify.INTERFACE_BUG]


def mixed(run: RunResult) -> list[TestResult]:
    """Contract failures in tests that elsewhere reach internals: maybe bugs, to look at."""
    return [r for r in run.results if r.category.startswith(classify.MIXED_PREFIX)]


def contract_only(run: RunResult) -> list[TestResult]:
    """Cases of test functions that, statically, touch only the interface and the views."""
    return [r for r in run.results if r.reach and not r.reach.get("internals") and not r.reach.get("object_new")]


def _line(r: TestResult) -> str:
    return f"    {r.name}\n        {classify.detail(r.record)}"


def render(run: RunResult, baseline: RunResult | None = None, verbose: bool = False) -> str:
    """The printed tally (with a stock column when `baseline` is given)."""
    out: list[str] = []
    target = " / ".join(run.targets.values()) or run.label
    out.append(f"vLLM {VLLM_VERSION} scheduler tests (test_scheduler.py, test_async_scheduler.py) against {target}")
    c = counts(run)
    if baseline is None:
        out.append(
            f"  {len(run.results)} cases: "
            + ", ".join(f"{c[o]} {o}" for o in OUTCOMES)
            + f"   (pytest {run.seconds:.1f} s)"
        )
    else:
        b = counts(baseline)
        out.append(f"  {'':44} {'stock':>7} {run.label:>9}")
        out.append(f"  {'cases':44} {len(baseline.results):7d} {len(run.results):9d}")
        for o in OUTCOMES:
            out.append(f"  {o:44} {b[o]:7d} {c[o]:9d}")
        out.append(f"  {'pytest seconds':44} {baseline.seconds:7.1f} {run.seconds:9.1f}")
    idle = [r for r in run.results if r.outcome == "passed" and r.constructed == 0]
    out.append(f"  passed without building the class under test (helpers, other classes): {len(idle)}")
    only = contract_only(run)
    oc = Counter(r.outcome for r in only)
    nfun = len({r.nodeid.split("[")[0] for r in only})
    out.append(
        f"  tests that use only SchedulerInterface + running/waiting/requests: {nfun} functions, "
        f"{len(only)} cases: {oc['passed']} passed, {oc['failed'] + oc['error']} failed, {oc['skipped']} skipped"
    )
    out.append("")
    out.append("Failures by reason:")
    cats = categories(run)
    if baseline is not None:
        bc = categories(baseline)
        out.append(f"  {'stock':>5} {run.label:>8}  reason")
        for cat in sorted(set(cats) | set(bc), key=lambda k: (-cats[k], -bc[k], k)):
            out.append(f"  {bc[cat]:5d} {cats[cat]:8d}  {cat}")
    else:
        for cat, n in sorted(cats.items(), key=lambda kv: (-kv[1], kv[0])):
            out.append(f"  {n:5d}  {cat}")
    if not cats:
        out.append("  (none)")
    out.append("")
    b_list = bugs(run)
    out.append(f"INTERFACE/VIEWS BEHAVIOUR failures (bugs in the class under test): {len(b_list)}")
    out += [_line(r) for r in b_list]
    m_list = mixed(run)
    if m_list:
        out.append("")
        out.append(f"Contract checks failing in tests that also reach internals (look at these too): {len(m_list)}")
        out += [_line(r) + f"\n        [{r.category}]" for r in m_list]
    if baseline is not None:
        stock_pass = {r.nodeid for r in baseline.results if r.outcome == "passed"}
        regress = [r for r in run.results if r.nodeid in stock_pass and r.outcome != "passed"]
        out.append("")
        out.append(f"Pass on stock vLLM, not on {run.label}: {len(regress)} (by reason above)")
    if verbose:
        out.append("")
        out.append("Passed without building the class under test (they test helpers or other classes):")
        out += [f"    {r.name}" for r in idle] or ["    (none)"]
        out.append("")
        out.append("Every failure:")
        for r in run.results:
            if r.category:
                out.append(f"  {r.name}: {r.category}\n      {classify.detail(r.record)}")
    return "\n".join(out)


def to_json(run: RunResult, path: Path) -> None:
    """Write a run's results (for CI artifacts and the project's own test)."""
    data: dict[str, Any] = {
        "label": run.label,
        "targets": run.targets,
        "seconds": run.seconds,
        "counts": dict(counts(run)),
        "categories": dict(categories(run)),
        "results": [attrs.asdict(r) for r in run.results],
    }
    path.write_text(json.dumps(data, indent=1))

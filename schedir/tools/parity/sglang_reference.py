"""Schedir's handle on SGLang's reference driver: find SGLang's interpreter, probe it, run traces.

Why a subprocess: SGLang 0.5.23 pins its own torch, transformers and triton, which do not
belong in schedir's environment (vLLM's parity tests live there). SGLang lives in its own
virtual environment; this module finds that environment's python, checks that SGLang's
scheduling classes import there (`sglang_driver.py --probe`), and runs the driver on traces,
returning its JSON. Callers (tests, the future `sglang` preset's parity check) get a reason
string instead of a traceback when SGLang is absent.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

ENV_VAR = "SCHEDIR_SGLANG_PYTHON"
DRIVER = Path(__file__).resolve().parent / "sglang_driver.py"
_REPO = Path(__file__).resolve().parents[3]
CANDIDATES = (Path("/work/sgl-env/bin/python"), _REPO.parent / "sgl-env" / "bin" / "python")
"""Where SGLang's environment is looked for when SCHEDIR_SGLANG_PYTHON is unset."""


def sglang_python() -> Path | None:
    """SCHEDIR_SGLANG_PYTHON if set, else the first candidate environment that exists."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    return next((p for p in CANDIDATES if p.exists()), None)


@functools.cache
def unavailable_reason() -> str | None:
    """None when SGLang's reference can run here, else a sentence saying why not."""
    py = sglang_python()
    if py is None:
        return (f"SGLang's environment not found ({ENV_VAR} unset and none of "
                f"{', '.join(map(str, CANDIDATES))} exists); see docs/sglang-reference.md")
    if not py.exists():
        return f"{ENV_VAR}={py} does not exist; see docs/sglang-reference.md"
    try:
        proc = subprocess.run([str(py), str(DRIVER), "--probe"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not run {py}: {exc}"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"SGLang's scheduling classes do not import with {py}: {tail[0]}"
    return None


def probe_versions() -> dict[str, str]:
    """SGLang's and torch's versions in the reference environment (raises if unavailable)."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    proc = subprocess.run([str(sglang_python()), str(DRIVER), "--probe"], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_reference(runs: dict[str, tuple[dict[str, Any], dict[str, Any]]], timeout: float = 1200) -> dict[str, Any]:
    """Run each named (trace, config) through SGLang's real scheduler classes in one process.

    Returns {name: {"sglang_version", "config", "steps", "summary"}}. Raises RuntimeError with
    the driver's message when SGLang is unavailable or the driver rejects the input.
    """
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    with tempfile.TemporaryDirectory(prefix="schedir-sglang-") as tmp:
        batch = Path(tmp) / "batch.json"
        out = Path(tmp) / "out.json"
        batch.write_text(json.dumps({name: {"trace": tr, "config": cfg} for name, (tr, cfg) in runs.items()}))
        proc = subprocess.run(
            [str(sglang_python()), str(DRIVER), "--batch", str(batch), "--out", str(out)],
            capture_output=True, text=True, timeout=timeout,
        )
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip()
            raise RuntimeError(f"SGLang reference driver failed (exit {proc.returncode}): {msg[-2000:]}")
        return json.loads(out.read_text())

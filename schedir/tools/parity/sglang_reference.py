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
from schedir.tools.parity.reference_env import ReferenceEnv

ENV_VAR = "SCHEDIR_SGLANG_PYTHON"
DRIVER = Path(__file__).resolve().parent / "sglang_driver.py"
_REPO = Path(__file__).resolve().parents[3]
CANDIDATES = (Path("/work/sgl-env/bin/python"), _REPO.parent / "sgl-env" / "bin" / "python")
"""Where SGLang's environment is looked for when SCHEDIR_SGLANG_PYTHON is unset."""

ENV = ReferenceEnv("SGLang's scheduling classes", ENV_VAR, DRIVER, CANDIDATES, "docs/sglang-reference.md")


# the module's API (tests and the parity tools call these)
sglang_python = ENV.python
unavailable_reason = ENV.unavailable_reason
probe_versions = ENV.probe_versions
run_reference = ENV.run

"""A reference scheduler that runs in its own Python environment, driven as a subprocess.

SGLang 0.5.23 and vLLM 0.8.5 (v0's scheduler) each pin packages that cannot share schedir's
environment (vLLM 0.32 lives there). Each lives in its own virtual environment; a driver script
in that environment runs traces and writes JSON. `ReferenceEnv` is the common handle: it finds
the environment's python (an environment variable, else candidate paths), probes that the
reference imports (`DRIVER --probe`), and runs batches of (trace, config), so callers get a
one-line reason instead of a traceback when the environment is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs


_REASONS: dict[tuple[str, str], str | None] = {}


def _last_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stderr or proc.stdout or "").strip().splitlines()
    return lines[-1] if lines else "no output"


@attrs.frozen
class ReferenceEnv:
    """One reference's environment: where its python is, its driver, and what its probe must say."""

    what: str  # e.g. "SGLang's scheduling classes" (for messages)
    env_var: str
    driver: Path
    candidates: tuple[Path, ...]
    doc: str
    check_versions: Callable[[dict[str, str]], str | None] = lambda versions: None  # a reason, or None

    def python(self) -> Path | None:
        """The environment variable's path if set, else the first candidate that exists."""
        if os.environ.get(self.env_var):
            return Path(os.environ[self.env_var])
        return next((p for p in self.candidates if p.exists()), None)

    def unavailable_reason(self) -> str | None:
        """None when the reference can run here, else one sentence saying why not (probed once per
        interpreter path: the probe imports the whole reference, seconds)."""
        key = (str(self.driver), str(self.python()))
        if key not in _REASONS:
            _REASONS[key] = self._probe()
        return _REASONS[key]

    def _probe(self) -> str | None:
        py = self.python()
        if py is None:
            return (f"{self.what}: environment not found ({self.env_var} unset and none of "
                    f"{', '.join(map(str, self.candidates))} exists); see {self.doc}")
        if not py.exists():
            return f"{self.env_var}={py} does not exist; see {self.doc}"
        try:
            proc = subprocess.run([str(py), str(self.driver), "--probe"], capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"could not run {py}: {exc}"
        if proc.returncode != 0:
            return f"{self.what} do not import with {py}: {_last_line(proc)}"
        try:
            versions = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return f"{py} {self.driver.name} --probe printed no version line"
        return self.check_versions(versions)

    def probe_versions(self) -> dict[str, str]:
        """The reference's package versions (RuntimeError with the reason if unavailable)."""
        reason = self.unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        proc = subprocess.run([str(self.python()), str(self.driver), "--probe"], capture_output=True, text=True,
                              check=True)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def run(self, runs: dict[str, tuple[dict[str, Any], dict[str, Any]]], timeout: float = 1200) -> dict[str, Any]:
        """Each named (trace, config) through the reference, all in one process: {name: result}.
        RuntimeError with the driver's message when unavailable or the driver refuses the input."""
        reason = self.unavailable_reason()
        if reason:
            raise RuntimeError(reason)
        with tempfile.TemporaryDirectory(prefix="schedir-reference-") as tmp:
            batch = Path(tmp) / "batch.json"
            out = Path(tmp) / "out.json"
            batch.write_text(json.dumps({name: {"trace": tr, "config": cfg} for name, (tr, cfg) in runs.items()}))
            proc = subprocess.run(
                [str(self.python()), str(self.driver), "--batch", str(batch), "--out", str(out)],
                capture_output=True, text=True, timeout=timeout,
            )
            if proc.returncode != 0:
                msg = (proc.stderr or proc.stdout).strip()
                raise RuntimeError(f"{self.driver.name} failed (exit {proc.returncode}): {msg[-2000:]}")
            return json.loads(out.read_text())

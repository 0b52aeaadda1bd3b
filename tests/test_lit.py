"""Run the FileCheck tests under tests/filecheck with lit (as `lit -v tests/filecheck` does)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "tests" / "filecheck"


def _lit_command() -> list[str] | None:
    """lit from this Python's environment (its `lit.main` has no `__main__` in some releases)."""
    if importlib.util.find_spec("lit") is not None and importlib.util.find_spec("lit.main") is not None:
        return [sys.executable, "-c", "import sys, lit.main; sys.exit(lit.main.main())"]
    exe = shutil.which("lit", path=os.path.dirname(sys.executable)) or shutil.which("lit")
    return [exe] if exe else None


def _filecheck_available() -> bool:
    bin_dir = os.path.dirname(sys.executable)
    return shutil.which("filecheck") is not None or shutil.which("filecheck", path=bin_dir) is not None


def test_filecheck_suite() -> None:
    lit = _lit_command()
    if lit is None:
        pytest.skip("lit is not installed (pip install lit)")
    if not _filecheck_available():
        pytest.skip("filecheck is not installed (pip install filecheck)")
    if shutil.which("schedir") is None and shutil.which("schedir", path=os.path.dirname(sys.executable)) is None:
        pytest.skip("the `schedir` command is not on PATH (pip install -e .)")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    result = subprocess.run(
        [*lit, "-v", str(SUITE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=1800,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"lit failed (exit {result.returncode}):\n{output}"
    assert "Passed" in output, output

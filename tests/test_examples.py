"""Every `examples/*.mlir` runs through the `base` pipeline from the command line.

For each example: `python -m schedir opt X -p base --dump-dir D --dot-dir D`
exits 0, writes one IR dump and one DOT file per pass plus the input
(00-input ... 05-verify-step), an SVG beside each DOT when Graphviz is
installed, and prints IR that parses back (`schedir opt -`) to the same text.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from schedir.passes.presets import PRESETS

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.mlir"))
STAGES = ["input", *PRESETS["base"].split(",")]
"""00-input, 01-reject-oversized, ..., 05-verify-step."""


def schedir(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "schedir", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )


def test_examples_exist() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"decode_heavy.mlir", "prefill_burst.mlir", "out_of_blocks.mlir"} <= names, names


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_base_pipeline(example: Path, tmp_path: Path) -> None:
    assert example.read_text().startswith("//"), f"{example.name} should start with a comment explaining it"
    dumps = tmp_path / "dumps"
    result = schedir("opt", str(example), "-p", "base", "--dump-dir", str(dumps), "--dot-dir", str(dumps))
    assert result.returncode == 0, f"exit {result.returncode}\nstderr:\n{result.stderr}"
    assert "sched.step" in result.stdout

    expected = [f"{i:02d}-{stage}" for i, stage in enumerate(STAGES)]
    assert expected[-1] == "05-verify-step"
    suffixes = [".mlir", ".dot"] + ([".svg"] if shutil.which("dot") else [])
    want = sorted(f"{stem}{suffix}" for stem in expected for suffix in suffixes)
    got = sorted(p.name for p in dumps.iterdir())
    assert got == want
    for name in want:
        assert (dumps / name).stat().st_size > 0, f"{name} is empty"

    # The last dump is the printed result; every dump parses on its own.
    assert (dumps / f"{expected[-1]}.mlir").read_text() == result.stdout
    assert "digraph" in (dumps / f"{expected[0]}.dot").read_text()

    again = schedir("opt", "-", stdin=result.stdout)
    assert again.returncode == 0, f"the printed IR does not parse back:\n{again.stderr}"
    assert again.stdout == result.stdout


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_input_round_trips(example: Path) -> None:
    """The example as written parses, and its printed form is a fixed point."""
    first = schedir("opt", str(example))
    assert first.returncode == 0, first.stderr
    second = schedir("opt", "-", stdin=first.stdout)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout


def _filecheck() -> str | None:
    return shutil.which("filecheck", path=str(Path(sys.executable).parent)) or shutil.which("filecheck")


@pytest.mark.parametrize("example", [p for p in EXAMPLES if "// CHECK" in p.read_text()], ids=lambda p: p.stem)
def test_example_checks_hold(example: Path) -> None:
    """An example whose comment describes the decisions states them as CHECK lines too."""
    filecheck = _filecheck()
    if filecheck is None:
        pytest.skip("filecheck is not installed (pip install filecheck)")
    result = schedir("opt", str(example), "-p", "base")
    assert result.returncode == 0, result.stderr
    checked = subprocess.run([filecheck, str(example)], input=result.stdout, capture_output=True, text=True,
                             timeout=60, check=False)
    assert checked.returncode == 0, checked.stderr


def test_out_of_blocks_describes_the_preemption() -> None:
    text = (ROOT / "examples" / "out_of_blocks.mlir").read_text()
    assert "// CHECK" in text and "req.preempt %run recompute {id = [8]}" in text
    assert "never preempts" not in text  # schedule-running preempts by recompute (issue 3)

"""The README's and docs' examples stay true: the set-up commands, the pass example, and every
fenced python block runs verbatim."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path

import attrs
import pytest

import schedir.passes
from schedir.ir.pipeline import PassManager
from schedir.ir.textio import parse_step_text, print_ir

README = Path(__file__).resolve().parent.parent / "README.md"


def _block(marker: str) -> str:
    text = README.read_text()
    section = text.split(f"<!-- {marker} -->")[1].split(f"<!-- /{marker} -->")[0]
    return re.search(r"```\n(.*?)```", section, re.DOTALL).group(1).strip()


def test_readme_names_both_setup_commands():
    assert "schedir bench" in _block("main-command")
    assert "pytest" in _block("test-command")


def test_readme_pass_example_runs(monkeypatch, small_step_text):
    monkeypatch.setattr(schedir.passes, "PASSES", dict(schedir.passes.PASSES))
    code = README.read_text().split("## Writing a pass\n\n```python\n")[1].split("```")[0]
    module_ns = types.ModuleType("readme_example")
    monkeypatch.setitem(sys.modules, "readme_example", module_ns)
    exec(compile(code, "README.md", "exec", dont_inherit=True), module_ns.__dict__)  # noqa: S102 (the README's own example)
    assert "order-shortest-first" in schedir.passes.PASSES
    module = parse_step_text(small_step_text)
    manager = PassManager.parse(
        "reject-oversized,order-shortest-first,schedule-running,admit-greedy,verify-step",
        verify_each=True,
        registry=schedir.passes.PASSES,
    )
    manager.run(module)
    assert 'req.sort %w by ["remaining", "arrival"]' in print_ir(module)


if __name__ == "__main__":
    pytest.main([__file__])


# ---------------------------------------------------------------- every fenced python block runs
DOCS = [README, *sorted((README.parent / "docs").glob("*.md"))]
ILLUSTRATIVE = "<!-- illustrative"  # the line before a ```python fence that is not a program (a signature)
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
NAMED = re.compile(r"`([\w-]+\.(?:py|mlir))`")


def fenced_blocks(doc: Path) -> list[tuple[int, str, str, str | None, bool]]:
    """(line, language, code, file name, illustrative) of each fenced block, in order. A block is
    saved under the last `name.py` / `name.mlir` the paragraph before it names ("`my_passes.py`:"),
    so later blocks can import it or read it, as the docs' scratch folder holds them."""
    text = doc.read_text()
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n")
        paragraph = before.split("\n\n")[-1]
        named = NAMED.findall(paragraph)
        last_line = before.rsplit("\n", 1)[-1]
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2), named[-1] if named else None,
                    last_line.startswith(ILLUSTRATIVE)))
    return out


def _script_args(doc_text: str, name: str) -> list[str]:
    """The arguments of the first `$ python NAME ...` line the document shows, if any."""
    m = re.search(rf"^\$ python {re.escape(name)} (.*)$", doc_text, re.MULTILINE)
    return shlex.split(m.group(1)) if m else []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_python_block_runs_verbatim(doc: Path, tmp_path: Path):
    """Each ```python block of the README and docs/ runs as written, in document order, in a scratch
    folder holding the files the document names (step.mlir, my_passes.py, ...); only blocks marked
    `<!-- illustrative ... -->` on the line before the fence are not run."""
    blocks = fenced_blocks(doc)
    python_blocks = [b for b in blocks if b[1] == "python"]
    if not python_blocks:
        pytest.skip(f"{doc.name} has no python blocks")
    for _, language, code, name, _ in blocks:
        if name and language in ("python", "mlir"):
            (tmp_path / name).write_text(code)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(README.parent), env.get("PYTHONPATH", "")])
    ran = 0
    for line, _, code, name, illustrative in python_blocks:
        if illustrative:
            continue
        script = tmp_path / (name or f"block-{line}.py")
        script.write_text(code)
        result = subprocess.run(
            [sys.executable, script.name, *_script_args(doc.read_text(), script.name)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
        )
        assert result.returncode == 0, f"{doc.name}:{line}: the python block fails:\n{result.stderr[-3000:]}"
        ran += 1
    assert ran, f"{doc.name}: every python block is marked illustrative"


def test_illustrative_blocks_are_few_and_marked():
    marked = [(doc.name, code) for doc in DOCS for _, lang, code, _, ill in fenced_blocks(doc) if ill and lang == "python"]
    assert len(marked) == 1, marked  # as_step_pass's signature only
    assert marked[0][0] == "writing-a-pass.md" and marked[0][1].startswith("as_step_pass(seed, *,")


def test_readme_scheduler_snippet_names_the_real_output_fields():
    code = README.read_text().split("## The runtime and the `vllm` preset\n\n```python\n")[1].split("```")[0]
    assert "[...]" not in code
    from schedir.runtime import SchedulerOutput

    fields = {f.name for f in attrs.fields(SchedulerOutput)}
    assert {"preempted_req_ids", "finished_req_ids"} <= fields
    assert "preempted_req_ids" in code and "finished_req_ids" in code

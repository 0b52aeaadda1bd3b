"""The README's pass example and its two set-up commands stay true."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

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

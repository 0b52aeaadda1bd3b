"""The Graphviz printer: clusters, nodes, SSA edges, summaries, escaping, and real `dot` rendering."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser

from schedir.dialects import make_context
from schedir.dialects.sched import StepOp
from schedir.ir.dot import dot_quote, html_escape, ids_text, module_to_dot, record_escape, write_dot

DOT = shutil.which("dot")
needs_dot = pytest.mark.skipif(DOT is None, reason="Graphviz `dot` binary not installed (apt-get install graphviz)")

FACTS = (
    "token_budget = 64, max_seqs = 4, block_size = 16, free_blocks = 10, cached_free_blocks = 0, "
    'total_blocks = 20, max_model_len = 1024, policy = "fcfs", facts = []'
)
RUNNING = (
    "id = [1, 2], prompt = [10, 20], computed = [12, 21], total = [13, 22], max_tokens = [32, 32], "
    "priority = [0, 0], arrival = [5, 6], status = [running, running], blocks = [1, 2]"
)

EXAMPLE = f"""
sched.step 3 {{{FACTS}}} {{
  %run = req.queue running {{{RUNNING}}}
  %w = req.queue waiting {{id = [3, 4], prompt = [40, 50], computed = [0, 0], total = [40, 50], max_tokens = [8, 8], priority = [1, 0], arrival = [7, 8], status = [waiting, waiting], blocks = [0, 0]}}
  mem.match %w {{id = [3, 4], hit = [16, 0]}}
  %s = req.sort %w by ["priority", "arrival"] {{id = [4, 3]}}
  %d = req.schedule %run decode {{id = [1, 2], tokens = [1, 1]}}
  %a = req.schedule %s prefill {{id = [4], tokens = [50]}}
  req.defer %s {{id = [3], reason = [budget]}}
  mem.alloc %a {{id = [4], blocks = [4]}}
  mem.evict 2
  sched.yield %d, %a
}}
"""

WEIRD = f"""
sched.step 0 {{{FACTS}}} {{
  %q = req.queue "we|ird<\\"q\\">{{x}}&" {{{RUNNING}}}
  %d = req.schedule %q decode {{id = [1, 2], tokens = [1, 1]}}
  sched.yield %d
}}
"""

EDGE_RE = re.compile(r"^\s*(\w+) -> (\w+) \[label=\"([^\"]*)\"\];$", re.MULTILINE)
NODE_RE = re.compile(r"^\s*(s\d+_op\d+) \[label=<", re.MULTILINE)


def parse(text: str) -> ModuleOp:
    module = Parser(make_context(), text, "test").parse_module()
    module.verify()
    return module


def steps(module: ModuleOp) -> list[StepOp]:
    return [op for op in module.ops if isinstance(op, StepOp)]


def render_svg(dot_text: str) -> str:
    """Run the real `dot` on the text: it must parse, and give SVG."""
    assert DOT is not None
    proc = subprocess.run([DOT, "-Tsvg"], input=dot_text, capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "<svg" in proc.stdout
    return proc.stdout


def test_cluster_nodes_and_edges() -> None:
    module = parse(EXAMPLE)
    text = module_to_dot(module, title="example")
    assert text.startswith("digraph ")
    assert text.count("digraph") == 1
    assert text.count("subgraph cluster_") == 1
    assert "sched.step 3" in text
    for fact in ("token_budget 64", "max_seqs 4", "free_blocks 10", "total_blocks 20", "policy fcfs"):
        assert fact in text

    ops = list(steps(module)[0].body.block.ops)
    assert len(set(NODE_RE.findall(text))) == len(ops) == 10

    edges = EDGE_RE.findall(text)
    uses = sum(len(op.operands) for op in ops)
    assert len(edges) == uses == 8
    assert sum(1 for line in text.splitlines() if "->" in line) == uses
    labels = sorted(label for _, _, label in edges)
    assert labels == sorted(["%w", "%w", "%run", "%s", "%s", "%a", "%d", "%a"])
    # %s (the sort) feeds the prefill schedule and the defer
    (sort_node,) = [m.group(1) for m in re.finditer(r"^\s*(s\d+_op\d+) \[label=<.*req\.sort", text, re.MULTILINE)]
    assert sum(1 for src, _, label in edges if src == sort_node and label == "%s") == 2


def test_summaries() -> None:
    text = module_to_dot(parse(EXAMPLE))
    for word in ("running", "waiting", "by [priority, arrival]", "prefill", "decode", "2 blocks"):
        assert word in text
    assert "budget×1" in text  # reason counts use the codes' keywords
    assert "running×2" in text  # queue status counts
    assert ">tokens Σ</TD><TD ALIGN=\"LEFT\">50<" in text
    assert ">blocks Σ</TD><TD ALIGN=\"LEFT\">4<" in text
    assert "%d, %a" in text  # the yielded batch


def test_reason_counts_and_id_truncation() -> None:
    ids = list(range(100, 112))
    reasons = ["budget"] * 3 + ["memory"] + ["blocked"] * 8
    queue = ", ".join(
        f"{col} = [{', '.join(vals)}]"
        for col, vals in {
            "id": map(str, ids),
            "prompt": ["5"] * 12,
            "computed": ["0"] * 12,
            "total": ["5"] * 12,
            "max_tokens": ["1"] * 12,
            "priority": ["0"] * 12,
            "arrival": map(str, range(12)),
            "status": ["waiting"] * 12,
            "blocks": ["0"] * 12,
        }.items()
    )
    text = f"""
    sched.step 1 {{{FACTS}}} {{
      %0 = req.queue waiting {{{queue}}}
      req.defer %0 {{id = [{', '.join(map(str, ids))}], reason = [{', '.join(reasons)}]}}
      sched.yield
    }}
    """
    dot = module_to_dot(parse(text))
    assert "blocked×8, budget×3, memory×1" in dot
    assert "100, 101, 102, 103, 104, 105, 106, 107 … (+4)" in dot
    assert "111" not in dot
    assert '[label="%0"]' in dot  # unnamed value gets an auto name
    assert ids_text([1, 2, 3]) == "1, 2, 3"


def test_escaping_weird_queue_name() -> None:
    module = parse(WEIRD)
    queue = steps(module)[0].body.block.first_op
    assert queue.queue.data == 'we|ird<"q">{x}&'
    text = module_to_dot(module, title='t "quoted" \\ <b>')
    assert "we|ird&lt;&quot;q&quot;&gt;{x}&amp;" in text
    assert 'we|ird<"q">' not in text
    assert 'label="t \\"quoted\\" \\\\ <b>"' in text
    if DOT is not None:
        render_svg(text)


def test_escape_helpers() -> None:
    assert html_escape('a<b>&"c"') == "a&lt;b&gt;&amp;&quot;c&quot;"
    assert dot_quote('say "hi" \\N') == '"say \\"hi\\" \\\\N"'
    assert dot_quote("a\nb") == '"a\\nb"'
    assert record_escape('{a|b}<p> "q"') == '\\{a\\|b\\}\\<p\\> \\"q\\"'


def test_several_steps_get_several_clusters() -> None:
    module = parse(EXAMPLE + EXAMPLE.replace("sched.step 3", "sched.step 4"))
    text = module_to_dot(module)
    assert text.count("subgraph cluster_") == 2
    assert "sched.step 3" in text and "sched.step 4" in text
    assert len(EDGE_RE.findall(text)) == 16
    # edges stay inside their own step
    assert all(src.split("_")[0] == dst.split("_")[0] for src, dst, _ in EDGE_RE.findall(text))


@needs_dot
def test_dot_text_parses_with_graphviz() -> None:
    svg = render_svg(module_to_dot(parse(EXAMPLE), title="example"))
    assert "req.schedule" in svg


@needs_dot
def test_write_dot_svg(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "step.dot"
    written = write_dot(parse(EXAMPLE), path, title="example", svg=True)
    assert written == [path, path.with_suffix(".svg")]
    assert path.read_text(encoding="utf-8").startswith("digraph ")
    svg = path.with_suffix(".svg").read_text(encoding="utf-8")
    assert svg and (svg.startswith("<?xml") or "<svg" in svg)


def test_write_dot_without_svg(tmp_path: Path) -> None:
    path = tmp_path / "step.dot"
    assert write_dot(parse(EXAMPLE), path, svg=False) == [path]
    assert not path.with_suffix(".svg").exists()


def test_write_dot_svg_true_without_graphviz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="Graphviz `dot` not found"):
        write_dot(parse(EXAMPLE), tmp_path / "step.dot", svg=True)
    # with svg=None a missing `dot` just means no SVG
    assert write_dot(parse(EXAMPLE), tmp_path / "step.dot") == [tmp_path / "step.dot"]


@needs_dot
def test_write_dot_reports_dot_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import schedir.ir.dot as dot_mod

    monkeypatch.setattr(dot_mod, "module_to_dot", lambda module, title="": "digraph { a -> }\n")
    with pytest.raises(RuntimeError, match="failed") as info:
        write_dot(parse(EXAMPLE), tmp_path / "bad.dot", svg=True)
    assert "syntax error" in str(info.value)  # dot's stderr is part of the message

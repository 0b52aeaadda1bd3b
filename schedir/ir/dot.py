"""Graphviz view of step IR: one cluster per `sched.step`, one node per op, SSA edges.

xDSL has no graph printer, and a step read as text hides its data flow (which
set each decision was taken on). This printer draws each step as a cluster
labelled with its engine facts, each op as a node summarising its request
columns (count, ids, token / block sums, reason counts), and each SSA use as an
edge from the defining op to the user, labelled with the value's name.

Node and cluster labels are HTML-like labels (so only `& < > "` need escaping,
via `html_escape`); edge labels and other attributes are quoted strings (via
`dot_quote`). Every piece of text from the IR goes through one of the two.

    from schedir.ir.dot import module_to_dot, write_dot
    write_dot(module, Path("step.dot"))   # step.dot, and step.svg if `dot` exists
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from schedir.dialects.codes import ENUM_COLUMNS
from schedir.dialects.columns import ColumnsAttr
from schedir.dialects.mem import EvictOp
from schedir.dialects.req import QUEUE_COLUMNS, PreemptOp, QueueOp, ScheduleOp, SortOp
from schedir.dialects.sched import StepOp

MAX_IDS = 8
"""Ids shown per node before the list is cut to `… (+N)`: enough to recognise a set."""

DOT_TIMEOUT_S = 30.0

# Fill colours: by kind (op name) first, then by dialect. Light tones keep text readable.
KIND_COLOURS: dict[str, str] = {
    "req.queue": "#cfe2ff",  # blue: where requests come from
    "req.sort": "#e7f0ff",
    "req.select": "#e7f0ff",
    "req.schedule": "#c7f0c9",  # green: runs this step
    "req.defer": "#fff1b8",  # yellow: waits
    "req.reject": "#ffc9c9",  # red: refused for good
    "req.preempt": "#ffd8a8",  # orange: stopped
    "sched.yield": "#dcdcdc",
}
DIALECT_COLOURS: dict[str, str] = {
    "req": "#e7f0ff",
    "mem": "#eadcff",  # violet: KV-cache effects
    "sched": "#dcdcdc",
}
OTHER_COLOUR = "#ffffff"
HEADER_COLOUR: dict[str, str] = {"req": "#1f4e8c", "mem": "#5a2e8c", "sched": "#333333"}


# ---------------------------------------------------------------- escaping
def html_escape(text: object) -> str:
    """Text for an HTML-like label: `& < > "` as entities, newlines as `<BR/>`."""
    s = str(text)
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    return s.replace("\r\n", "\n").replace("\n", '<BR ALIGN="LEFT"/>')


def dot_quote(text: object) -> str:
    """A DOT double-quoted string; backslashes are doubled so `\\N`-style escapes never fire."""
    s = str(text).replace("\\", "\\\\").replace('"', '\\"')
    return '"' + s.replace("\r\n", "\n").replace("\n", "\\n") + '"'


def record_escape(text: object) -> str:
    """Text for a `shape=record` field (`{ } | < >` are syntax there); for callers drawing records."""
    out: list[str] = []
    for ch in str(text):
        if ch in '{}|<>"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        else:
            out.append(ch)
    return "".join(out)


# ---------------------------------------------------------------- summaries
def ids_text(ids: Sequence[int] | np.ndarray, limit: int = MAX_IDS) -> str:
    """`1, 2, 3` or `1, …, 8 … (+N)`: keeps large sets to one line."""
    values = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
    head = ", ".join(map(str, values[:limit]))
    rest = len(values) - limit
    return f"{head} … (+{rest})" if rest > 0 else head


def enum_counts(column: str, values: np.ndarray) -> str:
    """`budget×3, memory×1` for an enum column (keywords from `schedir.dialects.codes`)."""
    enum = ENUM_COLUMNS[column]
    counts = Counter(values.tolist())
    parts: list[str] = []
    for code, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        try:
            word = enum(code).name.lower()
        except ValueError:
            word = str(code)
        parts.append(f"{word}×{n}")
    return ", ".join(parts)


def column_lines(op: Operation, cols: ColumnsAttr) -> list[tuple[str, str]]:
    """(key, value) rows for a node: size, ids, and a short summary of decision columns."""
    rows: list[tuple[str, str]] = [("n", str(len(cols)))]
    if cols.has("id"):
        rows.append(("ids", ids_text(cols.get("id"))))
    is_queue = isinstance(op, QueueOp)
    for name in cols.names:
        if name == "id":
            continue
        values = cols.get(name)
        if name in ENUM_COLUMNS:
            if len(values):
                rows.append((name, enum_counts(name, values)))
        elif is_queue:
            # A queue carries every request's state: only the KV held is worth a glance.
            if name == "blocks":
                rows.append(("blocks Σ", str(int(values.sum()))))
        else:
            rows.append((f"{name} Σ", str(int(values.sum()))))
    if is_queue:
        extra = [n for n in cols.names if n not in QUEUE_COLUMNS]
        if extra:
            rows.append(("extra", ", ".join(extra)))
    return rows


def op_words(op: Operation) -> str:
    """The op's keywords as in its text form: queue name, sort keys, phase, mode, count."""
    if isinstance(op, QueueOp):
        return op.queue.data
    if isinstance(op, SortOp):
        return "by [" + ", ".join(op.keys) + "]"
    if isinstance(op, ScheduleOp):
        return op.phase.data
    if isinstance(op, PreemptOp):
        return op.mode.data
    if isinstance(op, EvictOp):
        return f"{op.count} blocks"
    return ""


def op_colour(name: str) -> str:
    if name in KIND_COLOURS:
        return KIND_COLOURS[name]
    return DIALECT_COLOURS.get(name.split(".", 1)[0], OTHER_COLOUR)


# ---------------------------------------------------------------- graph building
class _Namer:
    """SSA names for edge labels: the value's `name_hint`, else `%N` in definition order."""

    def __init__(self) -> None:
        self._names: dict[SSAValue, str] = {}
        self._next = 0

    def __call__(self, value: SSAValue) -> str:
        name = self._names.get(value)
        if name is None:
            if value.name_hint:
                name = "%" + value.name_hint
            else:
                name = f"%{self._next}"
                self._next += 1
            self._names[value] = name
        return name


def _html_table(header: str, subheader: str, rows: Iterable[tuple[str, str]], fill: str, ink: str) -> str:
    parts = [
        f'<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="3" BGCOLOR="{fill}">',
        f'<TR><TD COLSPAN="2" BGCOLOR="{ink}"><FONT COLOR="white"><B>{html_escape(header)}</B></FONT></TD></TR>',
    ]
    if subheader:
        parts.append(f'<TR><TD COLSPAN="2"><I>{html_escape(subheader)}</I></TD></TR>')
    for key, value in rows:
        parts.append(f'<TR><TD ALIGN="LEFT">{html_escape(key)}</TD><TD ALIGN="LEFT">{html_escape(value)}</TD></TR>')
    parts.append("</TABLE>>")
    return "".join(parts)


def _op_label(op: Operation, namer: _Namer) -> str:
    results = ", ".join(namer(r) for r in op.results)
    header = f"{results} = {op.name}" if results else op.name
    rows: list[tuple[str, str]] = []
    cols = op.properties.get("columns")
    if isinstance(cols, ColumnsAttr):
        rows = column_lines(op, cols)
    elif op.name == "sched.yield":
        rows = [("batch", ", ".join(namer(v) for v in op.operands) or "(empty)")]
    dialect = op.name.split(".", 1)[0]
    return _html_table(header, op_words(op), rows, op_colour(op.name), HEADER_COLOUR.get(dialect, "#555555"))


def _step_label(step: StepOp) -> str:
    """The step index and every engine fact, a few per line so the cluster stays narrow."""
    f = step.read_facts()
    lines = [
        f"token_budget {f.token_budget}, max_seqs {f.max_seqs}",
        f"free_blocks {f.free_blocks}, cached_free_blocks {f.cached_free_blocks}, total_blocks {f.total_blocks}",
        f"block_size {f.block_size}, max_model_len {f.max_model_len}, policy {f.policy}",
        "facts: " + (", ".join(f.facts) or "—"),
    ]
    cells = "".join(f'<TR><TD ALIGN="LEFT">{html_escape(line)}</TD></TR>' for line in lines)
    return (
        '<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">'
        f'<TR><TD ALIGN="LEFT"><B>{html_escape(f"sched.step {f.step}")}</B></TD></TR>{cells}</TABLE>>'
    )


def _emit_ops(
    ops: Iterable[Operation], prefix: str, indent: str, namer: _Namer, node_of: dict[Operation, str], out: list[str]
) -> list[Operation]:
    """Node lines for `ops`; returns them so edges are drawn once every node exists."""
    emitted: list[Operation] = []
    for k, op in enumerate(ops):
        node = f"{prefix}_op{k}"
        node_of[op] = node
        out.append(f"{indent}{node} [label={_op_label(op, namer)}];")
        emitted.append(op)
    return emitted


def module_to_dot(module: ModuleOp | StepOp, title: str = "") -> str:
    """DOT source for the steps of `module` (a bare `sched.step` is accepted too)."""
    namer = _Namer()
    node_of: dict[Operation, str] = {}
    out: list[str] = [
        "digraph schedir {",
        "  rankdir=TB;",
        "  compound=true;",
        '  node [shape=plaintext, fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9, color="#555555"];',
    ]
    if title:
        out.append(f"  label={dot_quote(title)};")
        out.append("  labelloc=t;")
        out.append('  fontname="Helvetica";')
    drawn: list[Operation] = []
    top = [module] if isinstance(module, StepOp) else list(module.ops)
    loose: list[Operation] = []
    for n, op in enumerate(top):
        if isinstance(op, StepOp):
            out.append(f"  subgraph cluster_{n} {{")
            out.append(f"    label={_step_label(op)};")
            out.append('    style="rounded,filled"; fillcolor="#fafafa"; color="#999999";')
            out.append("    labeljust=l; fontname=\"Helvetica\"; fontsize=10;")
            drawn += _emit_ops(op.body.block.ops, f"s{n}", "    ", namer, node_of, out)
            out.append("  }")
        else:
            loose.append(op)
    drawn += _emit_ops(loose, "top", "  ", namer, node_of, out)

    # Operands defined by nothing drawn here (block arguments, ops of another region) get a stub.
    stubs: dict[SSAValue, str] = {}
    for op in drawn:
        for value in op.operands:
            owner = value.owner
            if isinstance(owner, Operation) and owner in node_of:
                src = node_of[owner]
            else:
                src = stubs.get(value)
                if src is None:
                    src = stubs[value] = f"in{len(stubs)}"
                    out.append(f"  {src} [shape=ellipse, label={dot_quote(namer(value))}];")
            out.append(f"  {src} -> {node_of[op]} [label={dot_quote(namer(value))}];")
    out.append("}")
    return "\n".join(out) + "\n"


def svg_skipped_note(dot_dir: pathlib.Path) -> str:
    """The one line a command prints when it wrote DOT files but could not render them."""
    return (f"note: wrote the .dot files to {dot_dir} but no SVGs: Graphviz's `dot` is not installed "
            "(apt-get install graphviz, brew install graphviz or conda install graphviz; "
            "or render one later with `dot -Tsvg FILE.dot -o FILE.svg`)")


def write_dot(module: ModuleOp, path: pathlib.Path, title: str = "", svg: bool | None = None) -> list[pathlib.Path]:
    """Write `path` (DOT) and, if asked or if Graphviz is installed, `path.with_suffix('.svg')`.

    `svg=None` renders only when `dot` is on PATH, so callers need no Graphviz;
    `svg=True` insists and raises `RuntimeError` when it cannot render.
    """
    path = pathlib.Path(path)
    dot_bin = shutil.which("dot")
    if svg and dot_bin is None:
        raise RuntimeError("Graphviz `dot` not found; install graphviz (apt-get install graphviz) or pass svg=False")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(module_to_dot(module, title), encoding="utf-8")
    written = [path]
    if dot_bin is None or svg is False:
        return written
    svg_path = path.with_suffix(".svg")
    try:
        proc = subprocess.run(
            [dot_bin, "-Tsvg", "-o", str(svg_path), str(path)],
            capture_output=True,
            text=True,
            timeout=DOT_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"Graphviz `dot` timed out after {DOT_TIMEOUT_S:.0f} s rendering {path}") from exc
    if proc.returncode != 0:
        raise RuntimeError(f"Graphviz `dot -Tsvg` failed on {path} (exit {proc.returncode}): {proc.stderr.strip()}")
    written.append(svg_path)
    return written


__all__ = ["dot_quote", "html_escape", "ids_text", "module_to_dot", "record_escape", "svg_skipped_note", "write_dot"]

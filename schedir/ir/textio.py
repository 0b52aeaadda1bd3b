"""Reading and writing step IR text, with errors that point at file:line:column."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import ParseError, VerifyException

from schedir.dialects import make_context
from schedir.dialects.pool import PoolOp
from schedir.ir.errors import StepParseError, os_error_message

_CTX = make_context()


class _LocatingParser(Parser):
    """Remembers where each op starts, so a verifier error can name file:line:column."""

    def __init__(self, text: str, name: str) -> None:
        super().__init__(_CTX, text, name)
        self.text = text
        self.source_name = name
        self.starts: dict[int, int] = {}

    def parse_operation(self) -> Operation:
        start = self._current_token.span.start
        op = super().parse_operation()
        self.starts[id(op)] = start
        return op

    def location(self, op: Operation) -> str:
        start = self.starts.get(id(op))
        if start is None:
            return self.source_name
        line = self.text.count("\n", 0, start) + 1
        col = start - (self.text.rfind("\n", 0, start) + 1) + 1
        return f"{self.source_name}:{line}:{col}"


def parse_step_text(text: str, name: str = "<input>", *, verify: bool = True) -> ModuleOp:
    """Parse (and verify) step IR; a syntax or verifier error becomes a StepParseError."""
    try:
        parser = _LocatingParser(text, name)  # reads the first token already
        module = parser.parse_module()
    except ParseError as err:
        raise StepParseError(str(err).rstrip()) from None
    if verify:
        for op in module.walk():
            try:
                op.verify(verify_nested_ops=False)
            except VerifyException as err:
                message = verify_message(err)
                if not message.startswith(op.name):
                    message = f"{op.name}: {message}"
                raise StepParseError(f"{parser.location(op)}: {message}") from None
    return module


def parse_step_file(path: str | Path, *, verify: bool = True) -> ModuleOp:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise StepParseError(os_error_message(err, str(path), path, "read")) from None
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise StepParseError(f"{path}:{line}: not UTF-8 text (byte {err.object[err.start]:#04x})") from None
    return parse_step_text(text, str(path), verify=verify)


def verify_message(err: VerifyException) -> str:
    """xDSL may append the whole module to a verifier message; keep the first line only."""
    lines = str(err).strip().splitlines()
    return lines[0] if lines else "verification failed"


def print_ir(op: Operation, *, generic: bool = False) -> str:
    if generic:  # a live pool is written into its property only when printed
        for inner in op.walk():
            if isinstance(inner, PoolOp):
                inner.materialize()
    buf = StringIO()
    Printer(stream=buf, print_generic_format=generic).print_op(op)
    buf.write("\n")
    return buf.getvalue()

"""What every op over a request set shares: the `!req.set` type, column checks, syntax.

An op over a set has one operand (the set it decides on), a `columns` property
with an `id` column naming the requests it covers (in order), and per-request
decision columns aligned with `id`. Its custom syntax is

    [%result =] dialect.op %operand <keywords> {id = [...], col = [...]} [attributes {...}]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
from xdsl.dialects.builtin import StringAttr
from xdsl.ir import Attribute, Operation, ParametrizedAttribute, SSAValue, TypeAttribute
from xdsl.irdl import IRDLOperation, irdl_attr_definition
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.mlir_lexer import MLIRTokenKind

from schedir.dialects.columns import ColumnsAttr, columns_text, parse_column_entries


@irdl_attr_definition
class RequestSetType(ParametrizedAttribute, TypeAttribute):
    """`!req.set`: an ordered set of requests (the value of a queue or a decision)."""

    name = "req.set"


SET = RequestSetType()



# ---------------------------------------------------------------- syntax helpers
def string_literal(text: str) -> str:
    """`text` as an IR string literal: escapes quotes, backslashes and control characters,
    keeps other characters as they are (xDSL's own printer turns non-ASCII into byte
    escapes, which its string-literal parser then refuses)."""
    out = ['"']
    for ch in text:
        if ch == '"' or ch == "\\":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\{ord(ch):02X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def print_word(printer: Printer, word: str) -> None:
    bare = word.isascii() and (word[:1].isalpha() or word[:1] == "_") and all(c.isalnum() or c in "_$." for c in word)
    printer.print_string(" " + (word if bare else string_literal(word)))


def unescape(body: str) -> str | None:
    """The value of a string literal's body (MLIR escapes: \\n \\t \\" \\\\ and \\XX bytes);
    None if the bytes are not UTF-8."""
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        nxt = body[i + 1 : i + 2]
        if nxt in ('"', "\\"):
            out += nxt.encode()
            i += 2
        elif nxt == "n":
            out += b"\n"
            i += 2
        elif nxt == "t":
            out += b"\t"
            i += 2
        else:
            out.append(int(body[i + 1 : i + 3], 16))
            i += 3
    try:
        return out.decode("utf-8")
    except UnicodeDecodeError:
        return None


def parse_string(parser: Parser, what: str) -> str:
    """A string literal. xDSL 0.74's own unescaping fails on a literal that holds both an
    escape and a non-ASCII character, so the token text is unescaped here."""
    token = parser._parse_optional_token(MLIRTokenKind.STRING_LIT)
    if token is None:  # xDSL lexes a literal with an escape and non-ASCII text as bytes
        token = parser._parse_optional_token(MLIRTokenKind.BYTES_LIT)
    if token is None:
        parser.raise_error(f"string literal expected ({what})")
    value = unescape(token.span.text[1:-1])
    if value is None:
        parser.raise_error(f"string literal is not UTF-8 ({what})", token.span)
    return value


def parse_word(parser: Parser, what: str) -> str:
    word = parser.parse_optional_identifier()
    return word if word is not None else parse_string(parser, what)


def print_columns(printer: Printer, cols: ColumnsAttr) -> None:
    printer.print_string(" {" + columns_text(cols) + "}")


def parse_columns(parser: Parser) -> ColumnsAttr:
    parser.parse_punctuation("{", " to open the request columns")
    data = parse_column_entries(parser)
    parser.parse_punctuation("}", " to close the request columns")
    return ColumnsAttr(data)


def print_yield(printer: Printer, op: Operation) -> None:
    """A terminator's custom form: `<name> %a, %b [attributes {...}]`."""
    if op.operands:
        printer.print_string(" ")
        printer.print_list(op.operands, printer.print_operand)
    print_attr_dict(printer, op)


def parse_yield_operands(parser: Parser, value_type: Attribute) -> list[SSAValue]:
    """The operands of a terminator's custom form (none, or a comma-separated list)."""
    values: list[SSAValue] = []
    first = parser.parse_optional_unresolved_operand()
    if first is not None:
        values.append(parser.resolve_operand(first, value_type))
        while parser.parse_optional_punctuation(",") is not None:
            values.append(parser.parse_operand(value_type))
    return values


def print_attr_dict(printer: Printer, op: Operation) -> None:
    if op.attributes:
        printer.print_op_attributes(op.attributes, print_keyword=True)


def parse_attr_dict(parser: Parser) -> dict[str, Attribute]:
    attrs = parser.parse_optional_attr_dict_with_keyword()
    return dict(attrs.data) if attrs is not None else {}


# ---------------------------------------------------------------- column checks
class ColumnOpMixin:
    """Accessors and checks for an op with a `columns` property (`#req.cols`)."""

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = ("id",)
    NON_NEGATIVE_COLUMNS: ClassVar[tuple[str, ...]] = ()
    POSITIVE_COLUMNS: ClassVar[tuple[str, ...]] = ()

    @property
    def ids(self) -> np.ndarray:
        return self.properties["columns"].get("id")  # type: ignore[attr-defined]  (the dict: no descriptor)

    def col(self, name: str) -> np.ndarray:
        return self.properties["columns"].get(name)  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self.properties["columns"])  # type: ignore[attr-defined]

    def verify_columns(self) -> None:
        name = self.name  # type: ignore[attr-defined]
        cols = self.columns
        missing = [c for c in self.REQUIRED_COLUMNS if not cols.has(c)]
        if missing:
            raise VerifyException(f"{name}: missing column(s) {', '.join(missing)}")
        n = len(cols.raw("id")) // 8  # type: ignore[arg-type]
        for col, raw in cols.data:
            if len(raw) // 8 != n:
                raise VerifyException(
                    f"{name}: column '{col}' has {len(raw) // 8} entries, but 'id' has {n}"
                )
        ids = cols.get("id")
        if n and np.unique(ids).size != n:
            values, counts = np.unique(ids, return_counts=True)
            raise VerifyException(f"{name}: request id(s) {values[counts > 1].tolist()} appear more than once")
        for col in self.NON_NEGATIVE_COLUMNS:
            if cols.has(col) and n and cols.get(col).min() < 0:
                bad = ids[cols.get(col) < 0].tolist()
                raise VerifyException(f"{name}: column '{col}' is negative for request(s) {bad}")
        for col in self.POSITIVE_COLUMNS:
            if cols.has(col) and n and cols.get(col).min() <= 0:
                bad = ids[cols.get(col) <= 0].tolist()
                raise VerifyException(f"{name}: column '{col}' must be positive; request(s) {bad}")

    def verify_subset_of(self, operand: SSAValue, *, permutation: bool = False) -> None:
        """The op's ids must come from the set it decides on (all of them for a sort)."""
        name = self.name  # type: ignore[attr-defined]
        source = set_ids(operand)
        ids = self.ids
        outside = ids[~np.isin(ids, source)]
        if outside.size:
            raise VerifyException(f"{name}: request(s) {outside.tolist()} are not in the operand set")
        if permutation and ids.size != source.size:
            lost = source[~np.isin(source, ids)]
            raise VerifyException(f"{name}: a sort must keep every request; request(s) {lost.tolist()} are missing")


def set_ids(value: SSAValue) -> np.ndarray:
    """The ordered ids of a request-set value (its defining op's `id` column)."""
    owner = value.owner
    if not isinstance(owner, ColumnOpMixin):
        raise VerifyException("a request set must be defined by an op with request columns")
    return owner.ids


def string_value(attr: StringAttr) -> str:
    return attr.data


def check_keyword(op_name: str, what: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise VerifyException(f"{op_name}: unknown {what} '{value}' (expected one of: {', '.join(allowed)})")


class OverSetOp(ColumnOpMixin, IRDLOperation):
    """Shared syntax of ops over one operand set: `op %set <words> {columns}`."""

    def _print_words(self, printer: Printer) -> None:
        pass

    @classmethod
    def _parse_words(cls, parser: Parser) -> dict[str, object]:
        return {}

    def print(self, printer: Printer) -> None:
        printer.print_string(" ")
        printer.print_operand(self.operands[0])
        self._print_words(printer)
        print_columns(printer, self.columns)
        print_attr_dict(printer, self)

    @classmethod
    def parse(cls, parser: Parser):
        operand = parser.parse_operand(SET)
        props = cls._parse_words(parser)
        props["columns"] = parse_columns(parser)
        return cls.create(
            operands=[operand],
            properties=props,  # type: ignore[arg-type]
            attributes=parse_attr_dict(parser),
            result_types=[SET] * len(cls.get_irdl_definition().results),
        )

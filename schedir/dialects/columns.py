"""`#req.cols`: per-request columns of a request set, stored as int64 bytes.

A step op holds one entry per request of its set in each column. Measured on
this machine kind: ten 1024-entry columns cost ~2 µs as one `Data` attribute
over `(name, bytes)` pairs, against ~38 µs as a dictionary of `DenseArrayBase`.
The bytes are immutable, so equality, hashing and structural comparison work,
and `np.frombuffer` reads a column back without a copy (read-only).

Text form, in the op's custom syntax and inside `#req.cols<...>`:

    {id = [3, 7, 9], tokens = [1, 1, 1], reason = [budget, memory, budget]}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

import numpy as np
from xdsl.ir import Data
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser, BaseParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from schedir.dialects.codes import ENUM_COLUMNS, keywords

ColumnData = tuple[tuple[str, bytes], ...]
_I64 = np.dtype(np.int64)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

_ENUM_NAMES: dict[str, list[str]] = {
    col: [""] * (max(int(m) for m in enum) + 1) for col, enum in ENUM_COLUMNS.items()
}
for _col, _enum in ENUM_COLUMNS.items():
    for _member in _enum:
        _ENUM_NAMES[_col][int(_member)] = _member.name.lower()
_ENUM_CODES: dict[str, dict[str, int]] = {col: keywords(e) for col, e in ENUM_COLUMNS.items()}


_NAME_INDEX: dict[tuple[str, ...], dict[str, int]] = {}
_MATRIX_INDEX: dict[tuple[tuple[str, ...], tuple[str, ...]], np.ndarray] = {}


_NO_VALUES = np.zeros(0, dtype=np.int64)
_NO_VALUES.flags.writeable = False


def joined_columns(parts: list[np.ndarray]) -> np.ndarray:
    """Column parts (one per op, in op order) as one read-only int64 array. An op's column is a
    read-only view, so a joined one is flagged too and a single part is passed as it is: the
    kernels that read them see one array type (Numba compiles a kernel once per signature; mixed
    flags compiled the runtime's settle_step four times, one of them in the first step that
    preempts)."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return _NO_VALUES
    joined = np.concatenate(parts)
    joined.flags.writeable = False
    return joined


def as_i64(values: Iterable[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(values, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"a column must be one-dimensional, got shape {arr.shape}")
    return arr


@irdl_attr_definition
class ColumnsAttr(Data[ColumnData]):
    """Named int64 columns of equal length, one entry per request of a set."""

    name = "req.cols"

    # Set by `of_matrix` only: the columns as rows of one read-only matrix (a view over the
    # attribute's own bytes), so `get` is a row view and kernels can index the whole matrix.
    _matrix: ClassVar[np.ndarray | None] = None
    _index: ClassVar[dict[str, int] | None] = None
    _names: ClassVar[tuple[str, ...]] = ()

    # ------------------------------------------------------------ construction
    @staticmethod
    def of(columns: Mapping[str, Iterable[int] | np.ndarray]) -> ColumnsAttr:
        """Columns from arrays or lists (the fast path: one `tobytes` each)."""
        data = tuple([
            (name, (values if type(values) is np.ndarray and values.dtype is _I64 else as_i64(values)).tobytes())
            for name, values in columns.items()
        ])
        # Every entry is (str, int64 bytes) by construction, so skip the generic
        # attribute verification (it dominates the cost of a small attribute).
        attr = object.__new__(ColumnsAttr)
        object.__setattr__(attr, "data", data)
        return attr

    @staticmethod
    def of_matrix(names: tuple[str, ...], matrix: np.ndarray, *, copy: bool = True) -> ColumnsAttr:
        """Columns from the rows of an int64 matrix (one row per name). The runtime's request
        table gathers a queue's columns this way every step (`ndarray.take(rows, axis=1)` is
        C-ordered, where fancy indexing gives Fortran order and a strided, ~20x slower copy).

        The attribute keeps the matrix (read-only) and writes its `(name, bytes)` entries only
        when something asks for them (printing, equality, hashing): a step's passes read
        columns as row views and never pay for the bytes. `copy=False` hands a fresh matrix
        over instead of copying it; the caller must not write to it afterwards."""
        if matrix.ndim != 2 or matrix.shape[0] != len(names):
            raise ValueError(f"a column matrix needs one row per name ({len(names)}), got shape {matrix.shape}")
        if matrix.dtype is not _I64 or not matrix.flags.c_contiguous:
            matrix = np.ascontiguousarray(matrix, dtype=np.int64)
        elif copy:
            matrix = matrix.copy()
        matrix.flags.writeable = False
        attr = object.__new__(ColumnsAttr)
        object.__setattr__(attr, "_matrix", matrix)
        index = _NAME_INDEX.get(names)
        if index is None:
            index = _NAME_INDEX[names] = {name: i for i, name in enumerate(names)}
        object.__setattr__(attr, "_index", index)
        object.__setattr__(attr, "_names", names)
        return attr

    @property
    def data(self) -> ColumnData:  # type: ignore[override]
        """The `(name, int64 bytes)` entries (written from the matrix on first use, see `of_matrix`)."""
        entries = self.__dict__.get("_entries")
        if entries is None:
            matrix = self._matrix
            assert matrix is not None, "a ColumnsAttr holds either entries or a matrix"
            entries = tuple([(name, matrix[i].tobytes()) for i, name in enumerate(self._names)])
            self.__dict__["_entries"] = entries
        return entries

    @data.setter
    def data(self, value: ColumnData) -> None:  # Data.__init__ and `of` set the entries
        self.__dict__["_entries"] = value

    def matrix(self, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(matrix, index): column `names[k]` is row `index[k]` of `matrix`, for a kernel that
        indexes the columns itself. A read-only view of the whole matrix when the attribute
        was built by `of_matrix` (the runtime's queues: no copy), else a stacked copy."""
        index = self._index
        if index is not None:
            key = (self._names, names)
            at = _MATRIX_INDEX.get(key)
            if at is None and all(n in index for n in names):
                at = _MATRIX_INDEX[key] = np.array([index[n] for n in names], dtype=np.int64)
            if at is not None:
                return self._matrix, at  # type: ignore[return-value]
        stacked = np.stack([self.get(n) for n in names]) if names else np.zeros((0, len(self)), dtype=np.int64)
        return stacked, np.arange(len(names), dtype=np.int64)

    # ------------------------------------------------------------ access
    @property
    def names(self) -> tuple[str, ...]:
        if self._matrix is not None:
            return self._names
        return tuple(name for name, _ in self.data)

    def has(self, name: str) -> bool:
        if self._index is not None:
            return name in self._index
        return any(n == name for n, _ in self.data)

    def _view(self, name: str) -> np.ndarray | None:
        """Column `name` as a read-only array over its bytes (None if absent), made on its first
        read and kept: a pass reads the same columns several times, and `frombuffer` and the
        scan for the name cost ~0.3 µs a call."""
        views = self.__dict__.get("_column_views")
        if views is None:
            views = self.__dict__["_column_views"] = {}
        found = views.get(name)
        if found is None:
            for n, raw in self.data:
                if n == name:
                    found = views[name] = np.frombuffer(raw, dtype=np.int64)
                    break
        return found

    def get(self, name: str) -> np.ndarray:
        """The column as a read-only int64 array; KeyError names what exists."""
        index = self._index
        if index is not None:
            at = index.get(name)
            if at is not None:
                return self._matrix[at]  # type: ignore[index]
        found = self._view(name)
        if found is None:
            raise KeyError(f"no column '{name}' (columns: {', '.join(self.names) or 'none'})")
        return found

    def raw(self, name: str) -> bytes | None:
        """A column's bytes (cheap equality between columns); None if absent."""
        for n, raw in self.data:
            if n == name:
                return raw
        return None

    def get_or(self, name: str, default: np.ndarray) -> np.ndarray:
        index = self._index
        if index is not None:
            at = index.get(name)
            if at is not None:
                return self._matrix[at]  # type: ignore[index]
        found = self._view(name)
        return default if found is None else found

    def __len__(self) -> int:
        if self._matrix is not None:
            return self._matrix.shape[1]
        return len(self.data[0][1]) // 8 if self.data else 0

    def as_dict(self) -> dict[str, np.ndarray]:
        return {n: np.frombuffer(raw, dtype=np.int64) for n, raw in self.data}

    # ------------------------------------------------------------ checks
    def verify(self) -> None:
        seen: set[str] = set()
        for entry in self.data:
            if not (isinstance(entry, tuple) and len(entry) == 2):
                raise VerifyException("#req.cols entries must be (name, bytes) pairs")
            name, raw = entry
            if not isinstance(name, str) or not isinstance(raw, bytes) or len(raw) % 8:
                raise VerifyException(f"#req.cols column '{name}' must hold int64 bytes")
            if name in seen:
                raise VerifyException(f"#req.cols column '{name}' appears twice")
            seen.add(name)

    # ------------------------------------------------------------ text
    @classmethod
    def parse_parameter(cls, parser: AttrParser) -> ColumnData:
        with parser.in_angle_brackets():
            return parse_column_entries(parser)

    def print_parameter(self, printer: Printer) -> None:
        printer.print_string("<" + columns_text(self) + ">")


def columns_text(cols: ColumnsAttr) -> str:
    """`id = [3, 7], reason = [budget, memory]` (no delimiters)."""
    parts: list[str] = []
    for name, raw in cols.data:
        values = np.frombuffer(raw, dtype=np.int64).tolist()
        names = _ENUM_NAMES.get(name)
        if names is not None:
            text = ", ".join(names[v] if 0 <= v < len(names) and names[v] else str(v) for v in values)
        else:
            text = ", ".join(map(str, values))
        parts.append(f"{name} = [{text}]")
    return ", ".join(parts)


def parse_column_entries(parser: BaseParser) -> ColumnData:
    """Parse `name = [v, ...], ...` up to (not including) the closing delimiter."""
    entries: list[tuple[str, bytes]] = []
    seen: set[str] = set()

    def parse_entry() -> None:
        at = parser._current_token.span
        name = parser.parse_identifier(" (a column name)")
        if name in seen:
            parser.raise_error(f"column '{name}' appears twice", at)
        seen.add(name)
        parser.parse_punctuation("=", f" after column name '{name}'")
        codes = _ENUM_CODES.get(name)

        def parse_value() -> int:
            if codes is not None:
                at = parser._current_token.span
                word = parser.parse_optional_identifier()
                if word is not None:
                    if word not in codes:
                        parser.raise_error(
                            f"unknown {name} '{word}' (expected one of: {', '.join(codes)})", at
                        )
                    return codes[word]
            at = parser._current_token.span
            value = parser.parse_integer(allow_boolean=False, context_msg=f" in column '{name}'")
            if not INT64_MIN <= value <= INT64_MAX:
                parser.raise_error(f"value {value} in column '{name}' does not fit in int64", at)
            return value

        values = parser.parse_comma_separated_list(parser.Delimiter.SQUARE, parse_value, f" for column '{name}'")
        entries.append((name, np.asarray(values, dtype=np.int64).tobytes()))

    if parser._current_token.text in ("}", ">"):  # no columns at all: an empty attribute
        return ()
    parse_entry()
    while parser.parse_optional_punctuation(",") is not None:
        parse_entry()
    return tuple(entries)

"""CSV rows with their line numbers, after the header has been checked against the columns a format needs."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from typing import IO

from schedir.sim.workloads.errors import BadRowLog
from schedir.sim.workloads.fields import BadField


def read_header(f: IO[str], log: BadRowLog, required: tuple[str, ...]) -> tuple[csv.reader, dict[str, int]]:
    """The file's reader and every column's index; a header without the required columns refuses the file."""
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None:
        raise log.refuse(1, "empty file")
    header = [h.strip().lstrip("\ufeff") for h in header]
    missing = [c for c in required if c not in header]
    if missing:
        raise log.refuse(1, f"wrong header: expected columns {','.join(required)}, got {','.join(header)} "
                            f"(missing {','.join(missing)})")
    return reader, {c: header.index(c) for c in reversed(header)}


def rows(reader: csv.reader, log: BadRowLog, width: int) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) per non-blank row; a row with too few fields is reported and left out."""
    for row in reader:
        if not row or all(not x.strip() for x in row):
            continue
        if len(row) < width:
            log.report(reader.line_num, str(BadField(f"expected {width} fields, got {len(row)}")))
            continue
        yield reader.line_num, row

"""CSV rows with their line numbers, after the header has been checked against the columns a format needs."""

from __future__ import annotations

import csv
from collections.abc import Callable, Iterator
from os import PathLike
from pathlib import Path
from typing import IO

import numpy as np

from schedir.sim.workloads.errors import BadRowLog
from schedir.sim.workloads.fields import BadField, in_order, positive_int
from schedir.sim.workloads.workload import Workload


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


def load_timed_lengths(path: str | PathLike[str], columns: tuple[str, str, str], parse_time: Callable[[str], float],
                       on_bad_row: str, limit: int | None, block_tokens: int) -> Workload:
    """A CSV of (arrival time, prompt tokens, output tokens) per row, in arrival order (Azure, Vidur).

    `columns` names the three columns; `parse_time` turns a time cell into seconds (raising
    BadField). Prompts get fresh block ids: such files say nothing about content.
    """
    path = str(path)
    log = BadRowLog(path, on_bad_row)
    time_col, input_col, output_col = columns
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    previous: float | None = None
    previous_text = ""
    with open(path, encoding="utf-8", newline="") as f:
        reader, col = read_header(f, log, columns)
        for line_no, row in rows(reader, log, max(col[c] for c in columns) + 1):
            if limit is not None and len(times) >= limit:
                break
            try:
                text = row[col[time_col]].strip()
                t = in_order(time_col, parse_time(text), previous, text, previous_text)
                n_in = positive_int(input_col, row[col[input_col]])
                n_out = positive_int(output_col, row[col[output_col]])
            except BadField as e:
                log.report(line_no, str(e))
                continue
            previous, previous_text = t, text
            times.append(t)
            inputs.append(n_in)
            outputs.append(n_out)
    if not times:
        raise log.refuse(2, "no usable requests after the header")
    arrival = np.asarray(times) - times[0]
    return Workload.without_content(Path(path).stem, path, arrival, np.asarray(inputs), np.asarray(outputs),
                                    block_tokens=block_tokens, skipped=tuple(log.rows))

"""The request table: every live request's state as columns, one row per request slot.

Rows are recycled when a request finishes, and the table doubles when full, so
a step reads its queues with one fancy index over a (columns x rows) int64
array: no per-request Python objects on the hot path. Of the token ids, only
each row's unfinished last block is kept (`tail`, rows x block_size int32): the
prefix-cache hashes are chained, so a block's hash needs its own tokens and its
parent's hash, never the whole sequence — a 128k-token context costs one block
of memory per request, not 512 KiB.
"""

from __future__ import annotations

import bisect

import numpy as np

# Column indices of RequestTable.data; the first ones are the step IR's queue columns.
# A request's IR id is its row (unique within a step; rows are recycled across steps).
COLUMNS = (
    "id", "prompt", "computed", "total", "max_tokens", "priority", "arrival", "status", "blocks",
    "in_flight", "queued", "rank", "placeholders", "stale",
    "eos", "ignore_eos", "preemptions", "outputs", "has_stop", "serial",
)
(ID, PROMPT, COMPUTED, TOTAL, MAX_TOKENS, PRIORITY, ARRIVAL, STATUS, BLOCKS, IN_FLIGHT, QUEUED, RANK, PLACEHOLDERS,
 STALE_OUTPUTS, EOS, IGNORE_EOS, PREEMPTIONS, OUTPUTS, HAS_STOP, SERIAL) = range(len(COLUMNS))
QUEUE_COLUMN_COUNT = STALE_OUTPUTS + 1  # id .. stale go into the step IR
# Async scheduling (vLLM's AsyncScheduler), carried per request across steps:
# - `placeholders`: tokens this request will sample in steps already scheduled whose output has
#   not come back (vLLM's num_output_placeholders). `computed` counts their positions, `total`
#   does not, so a decode asks for `total + placeholders - computed` tokens. Zero without async.
# - `stale`: outputs still in flight that were scheduled before the request's last preemption.
#   Positive: their tokens are delivered when they return (the request may not resume before
#   then); negative: they are dropped (a preemption that resumes at once, e.g. a prefix-cache
#   reset). vLLM's num_stale_output_tokens / drop_stale_output, counted in outputs.

# Lifecycle (the first values match schedir.dialects.codes.Status).
WAITING, RUNNING, PREEMPTED, SWAPPED = 0, 1, 2, 3  # SWAPPED: its KV is on the host tier (vLLM v0)
FINISHED = 9  # finished or rejected, row not yet released (an output naming it is in flight)
FREE = 10


class RequestTable:
    """Columns of request state, grown by doubling; rows are request slots."""

    def __init__(self, rows: int, block_size: int) -> None:
        self.data = np.zeros((len(COLUMNS), rows), dtype=np.int64)
        self.data[STATUS] = FREE
        self.tail = np.zeros((rows, block_size), dtype=np.int32)  # tokens of each row's partial last block
        self.names = np.full(rows, None, dtype=object)  # request id per row (an array: one gather per output)
        self.prompts: list[np.ndarray | None] = [None] * rows
        self.stop_ids: dict[int, frozenset[int]] = {}
        self.row_of: dict[str, int] = {}
        self._free_rows: list[int] = list(range(rows - 1, -1, -1))
        self._sorted_names: list[str] = []
        self._serial = 0
        # Pass-declared request state (schedir.ir.state): one int64 row per name ever declared,
        # so switching pipelines back and forth keeps every value.
        self.state = np.zeros((0, rows), dtype=np.int64)
        self.state_index: dict[str, int] = {}
        self.state_defaults: list[int] = []

    def declare_state(self, name: str, default: int) -> int:
        """The state row of `name`, added (live requests start at `default`) if new."""
        index = self.state_index.get(name)
        if index is None:
            index = self.state_index[name] = len(self.state_defaults)
            self.state_defaults.append(default)
            self.state = np.vstack([self.state, np.full((1, self.capacity), default, dtype=np.int64)])
        return index

    @property
    def serial(self) -> int:
        """How many requests have taken a row (a row's SERIAL tells its occupants apart)."""
        return self._serial

    @property
    def capacity(self) -> int:
        return self.data.shape[1]

    def __len__(self) -> int:
        return len(self.row_of)

    def grow(self) -> None:
        old = self.capacity
        new = old * 2
        data = np.zeros((len(COLUMNS), new), dtype=np.int64)
        data[:, :old] = self.data
        data[STATUS, old:] = FREE
        self.data = data
        state = np.zeros((self.state.shape[0], new), dtype=np.int64)
        state[:, :old] = self.state
        self.state = state
        tail = np.zeros((new, self.tail.shape[1]), dtype=np.int32)
        tail[:old] = self.tail
        self.tail = tail
        names = np.full(new, None, dtype=object)
        names[:old] = self.names
        self.names = names
        self.prompts.extend([None] * old)
        self._free_rows = list(range(new - 1, old - 1, -1)) + self._free_rows

    def take_row(self, name: str) -> int:
        """A free row for a new request (the caller fills its columns)."""
        if not self._free_rows:
            self.grow()
        row = self._free_rows.pop()
        self.names[row] = name
        self.row_of[name] = row
        self._serial += 1
        self.data[ID, row] = row
        if self.state_defaults:
            self.state[:, row] = self.state_defaults
        return row

    def assign_rank(self, row: int, name: str) -> None:
        """Place `name` in string order among live requests (vLLM's priority heap breaks ties by id)."""
        at = bisect.bisect_left(self._sorted_names, name)
        if at < len(self._sorted_names):
            successor = self.row_of[self._sorted_names[at]]
            rank = int(self.data[RANK, successor])
            live = self.data[STATUS] != FREE
            self.data[RANK, live & (self.data[RANK] >= rank)] += 1
        else:
            rank = int(self.data[RANK, self.row_of[self._sorted_names[-1]]]) + 1 if self._sorted_names else 0
        self._sorted_names.insert(at, name)
        self.data[RANK, row] = rank

    def release(self, row: int) -> None:
        name = self.names[row]
        if name is not None:
            del self.row_of[name]
            at = bisect.bisect_left(self._sorted_names, name)
            if at < len(self._sorted_names) and self._sorted_names[at] == name:
                del self._sorted_names[at]
        self.names[row] = None
        self.prompts[row] = None
        self.stop_ids.pop(row, None)
        self.data[STATUS, row] = FREE
        self._free_rows.append(row)

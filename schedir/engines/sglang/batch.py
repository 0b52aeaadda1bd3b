"""One schedir step as SGLang's `ScheduleBatch` -> `ModelWorkerBatch` fields.

SGLang's model side reads a batch as: a forward mode (`EXTEND` for prefill chunks, `DECODE`
when every request decodes one token, `MIXED` when a chunked prefill runs with the running
decodes: `ScheduleBatch.mix_with_running` puts the extend requests first, the decodes after),
`req_pool_indices` (each request's row in the req_to_token pool), `seq_lens` (tokens in context
after this step), `prefix_lens` (tokens already in KV), `extend_lens` (tokens computed now),
`extend_num_tokens`, `seq_lens_sum` and `out_cache_loc` (the KV slot of every new token, in batch
order). schedir's runtime row is the pool index and its block table gives the slots
(block id * block size + offset, the batch plan's slot mapping).
"""

from __future__ import annotations

from enum import Enum

import attrs
import numpy as np

from schedir.runtime import table as T


class ForwardMode(Enum):
    """SGLang's `ForwardMode` values a scheduler step can produce."""

    EXTEND = "extend"
    DECODE = "decode"
    MIXED = "mixed"
    IDLE = "idle"


EXTEND_FIRST = True
"""SGLang orders a mixed batch extend requests first, then the running decodes."""


@attrs.frozen
class SGLangBatch:
    """A step in SGLang's batch fields (arrays in SGLang's batch order)."""

    forward_mode: ForwardMode
    rids: tuple[str, ...]
    req_pool_indices: np.ndarray  # int64[b]
    seq_lens: np.ndarray  # int64[b]: context after this step
    prefix_lens: np.ndarray  # int64[b]: tokens already in KV (prefix hits included)
    extend_lens: np.ndarray  # int64[b]: tokens computed now (1 for a decode)
    out_cache_loc: np.ndarray  # int64[sum(extend_lens)]: KV slot of each new token
    order: np.ndarray  # int64[b]: position of each of these requests in schedir's batch
    prompt_lens: np.ndarray  # int64[b]: each request's prompt length

    @property
    def batch_size(self) -> int:
        return int(self.req_pool_indices.size)

    @property
    def seq_lens_sum(self) -> int:
        return int(self.seq_lens.sum())

    @property
    def extend_num_tokens(self) -> int | None:
        """Tokens an extend or mixed batch computes (`mix_with_running` adds one per decode);
        None for a decode batch, as in SGLang."""
        return None if self.forward_mode is ForwardMode.DECODE else int(self.extend_lens.sum())


def sglang_batch(scheduler: object, output: object) -> SGLangBatch:
    """Lower `output` (a `schedir.Scheduler.schedule()` result) to SGLang's batch fields.

    A request decodes when its whole prompt was computed before this step (SGLang's decode
    batch); the others extend (a prompt chunk, a prefix hit's remainder, a resumed request's
    recompute). Only extends: EXTEND; only decodes: DECODE; both: MIXED, extends first."""
    rows = np.asarray(output.rows, dtype=np.int64)  # type: ignore[attr-defined]
    n = rows.size
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return SGLangBatch(ForwardMode.IDLE, (), empty, empty, empty, empty, empty, empty, empty)
    prompt = scheduler.table.data[T.PROMPT, rows]  # type: ignore[attr-defined]
    prefix = np.asarray(output.computed, dtype=np.int64)  # type: ignore[attr-defined]
    extend = np.asarray(output.num_tokens, dtype=np.int64)  # type: ignore[attr-defined]
    decoding = prefix >= prompt
    if decoding.all():
        mode, order = ForwardMode.DECODE, np.arange(n, dtype=np.int64)
    elif not decoding.any():
        mode, order = ForwardMode.EXTEND, np.arange(n, dtype=np.int64)
    else:
        mode = ForwardMode.MIXED
        order = np.concatenate([np.flatnonzero(~decoding), np.flatnonzero(decoding)]).astype(np.int64)
    qsl = np.asarray(output.batch.query_start_loc, dtype=np.int64)  # type: ignore[attr-defined]
    slots = np.asarray(output.batch.slot_mapping, dtype=np.int64)  # type: ignore[attr-defined]
    if mode is ForwardMode.MIXED:
        loc = np.concatenate([slots[qsl[i]: qsl[i + 1]] for i in order.tolist()])
    else:
        loc = slots.copy()
    names = output.req_ids  # type: ignore[attr-defined]
    return SGLangBatch(
        forward_mode=mode,
        rids=tuple(names[i] for i in order.tolist()),
        req_pool_indices=rows[order],
        seq_lens=(prefix + extend)[order],
        prefix_lens=prefix[order],
        extend_lens=extend[order],
        out_cache_loc=loc,
        order=order,
        prompt_lens=prompt[order],
    )

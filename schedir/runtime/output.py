"""`SchedulerOutput`: one step's decisions in the form an engine consumes.

Arrays first (batch order: running requests, then admitted ones), with the
per-request records an engine keeps incrementally: a new request is sent whole
once (prompt and every block id); a running one sends only its new block ids.
"""

from __future__ import annotations

from functools import cached_property

import attrs
import numpy as np

from schedir.lowering.batch_plan import POSITIONS, SLOTS


@attrs.frozen
class NewRequest:
    """A request the engine has not seen (or sees again after preemption in `cached_reqs`)."""

    req_id: str
    prompt_token_ids: np.ndarray
    block_ids: np.ndarray
    num_computed_tokens: int  # prefix-cache hit tokens


@attrs.frozen
class CachedRequest:
    """A request the engine already holds: only what changed."""

    req_id: str
    resumed: bool  # back after preemption: its blocks are all new (`new_block_ids` is the whole table)
    new_block_ids: np.ndarray
    num_computed_tokens: int


@attrs.frozen
class BatchPlan:
    """The flattened batch: what the model runner's input preparation builds."""

    query_start_loc: np.ndarray  # int32[n+1]: request i's tokens are [qsl[i], qsl[i+1])
    positions: np.ndarray  # int64[T]: position of each scheduled token in its sequence
    slot_mapping: np.ndarray  # int64[T]: KV slot (block id * block_size + offset) of each token
    seq_lens: np.ndarray  # int32[n]: tokens in context after this step
    block_table: np.ndarray  # int32[n, max blocks]: block ids per request, 0-padded


# rows of `settle_step`'s per-request matrix (`SchedulerOutput.per_request`)
STEP_COMPUTED, STEP_BLOCKS_BEFORE, STEP_KIND, STEP_BLOCKS_AFTER, STEP_GENERATION = range(5)
_NO_PAIRS = np.zeros((0, 2), dtype=np.int64)
_NO_PAIRS.flags.writeable = False


@attrs.define(eq=False)
class SchedulerOutput:
    """One step's decisions: arrays in batch order, plus vLLM-style per-request records on demand.

    Built from the settle kernel's results as they come (one int64 matrix of per-request
    columns, one per-token matrix): the per-request columns (`computed`, `kind`, ...) are views
    of it and the `batch` plan is assembled on first use, so a step whose engine reads only
    part of it pays for no more (a one-request step's output was a third of its cost)."""

    step: int
    names: np.ndarray  # object array of the request ids, in batch order (`req_ids` lists them)
    rows: np.ndarray  # the runtime's row of each request (internal; `update` uses it)
    num_tokens: np.ndarray
    per_request: np.ndarray  # int64[5, n]: rows STEP_COMPUTED .. STEP_GENERATION (see the properties)
    sampled: np.ndarray  # bool: the chunk reaches the end of the known tokens, so one is sampled
    block_table: np.ndarray | None  # int32[n, max blocks] (batch.block_table); None: no batch plan
    new_prompts: list[np.ndarray]  # prompt ids of the new requests, in batch order
    preempted_req_ids: frozenset[str]
    # finished since the previous output (as in vLLM), plus this output's rejected requests: an
    # engine that saw one before (scheduled, then preempted) must free its state
    finished_req_ids: frozenset[str]
    rejected: dict[str, str]  # request id -> reason (too long for the model, larger than the cache)
    total_num_scheduled_tokens: int  # the sum of num_tokens (vLLM's name)
    # the batch plan's parts (`batch` assembles them): query_start_loc int32[n+1], the per-token
    # matrix int64[2, T] (rows POSITIONS, SLOTS), seq_lens int32[n]; all None without a batch plan
    query_start_loc: np.ndarray | None = None
    per_token: np.ndarray | None = None
    seq_lens: np.ndarray | None = None
    applied: bool = False  # set by Scheduler.update: an output is applied once
    # Preemption by swap (vLLM v0; a pipeline with a swapped queue): requests whose KV moved to host
    # blocks this step (the engine keeps their state; they come back as resumed requests), and the
    # block copies the engine's cache engine makes before the forward pass, as (source, destination)
    # rows: device -> host for swap-out, host -> device for swap-in (v0's SchedulerOutputs fields).
    swapped_out_req_ids: frozenset[str] = frozenset()
    blocks_to_swap_out: np.ndarray = _NO_PAIRS
    blocks_to_swap_in: np.ndarray = _NO_PAIRS

    @property
    def computed(self) -> np.ndarray:
        """Tokens computed before this step (prefix hits included)."""
        return self.per_request[STEP_COMPUTED]

    @property
    def kind(self) -> np.ndarray:
        """0 running, 1 new, 2 resumed after preemption."""
        return self.per_request[STEP_KIND]

    @property
    def nblk_before(self) -> np.ndarray:
        """Blocks the engine already knows for each request."""
        return self.per_request[STEP_BLOCKS_BEFORE]

    @property
    def nblk_after(self) -> np.ndarray:
        return self.per_request[STEP_BLOCKS_AFTER]

    @property
    def generation(self) -> np.ndarray:
        """Per request: who held the row when scheduled (guards recycled rows)."""
        return self.per_request[STEP_GENERATION]

    @cached_property
    def batch(self) -> BatchPlan | None:
        """The flattened batch, or None when the scheduler builds no batch plan
        (`SchedulerConfig.batch_plan`)."""
        if self.per_token is None:
            return None
        return BatchPlan(query_start_loc=self.query_start_loc, positions=self.per_token[POSITIONS],
                         slot_mapping=self.per_token[SLOTS], seq_lens=self.seq_lens, block_table=self.block_table)

    @cached_property
    def req_ids(self) -> list[str]:
        """The scheduled request ids in batch order (listed on first use: one gather per step)."""
        return self.names.tolist()

    @cached_property
    def num_scheduled_tokens(self) -> dict[str, int]:
        return dict(zip(self.req_ids, self.num_tokens.tolist(), strict=True))

    @cached_property
    def new_reqs(self) -> list[NewRequest]:
        """Requests sent whole, once: prompt and every block id (prefix-hit blocks included)."""
        self._need_block_table("new_reqs")
        out = []
        prompts = iter(self.new_prompts)
        for i in np.flatnonzero(self.kind == 1).tolist():
            out.append(NewRequest(self.req_ids[i], next(prompts), self.block_table[i, : self.nblk_after[i]].copy(),
                                  int(self.computed[i])))
        return out

    @cached_property
    def cached_reqs(self) -> list[CachedRequest]:
        """Requests the engine holds: only their new block ids (all of them after a preemption)."""
        self._need_block_table("cached_reqs")
        out = []
        for i in np.flatnonzero(self.kind != 1).tolist():
            out.append(CachedRequest(self.req_ids[i], bool(self.kind[i] == 2),
                                     self.block_table[i, self.nblk_before[i]: self.nblk_after[i]].copy(),
                                     int(self.computed[i])))
        return out

    def _need_block_table(self, field: str) -> None:
        if self.block_table is None:
            raise ValueError(f"SchedulerOutput.{field} lists block ids, and this scheduler builds no batch plan "
                             "or block table (SchedulerConfig.batch_plan=False)")

    def __len__(self) -> int:
        return len(self.rows)

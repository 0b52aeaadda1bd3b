"""What v0's chunked-prefill passes share: the partial-prefill metadata and the prefill slot budget."""

from __future__ import annotations

import numpy as np

from schedir.ir.step import Step
from schedir.passes import v0_kernels as K
from schedir.passes.v0_state import PREFILL_END

_NONE = np.zeros(0, dtype=np.int64)


def long_threshold(max_partial: int, given: int, max_model_len: int) -> int:
    """v0's `long_prefill_token_threshold`: 4% of max_model_len when several partial prefills
    run and none is given (vllm/config.py SchedulerConfig.__post_init__, 0.8.5)."""
    return int(max_model_len * 0.04) if max_partial > 1 and given == 0 else given


def slot_budget(step: Step, max_partial: int, threshold: int, max_long: int) -> tuple[int, int]:
    """(token budget of one prefill slot, long prefills running) from the queues as the step began:
    v0's `PartialPrefillMetadata.from_queues` and `partial_prefill_budget_lookup_list`
    (budget // schedulable prefills; the whole budget when there are none)."""
    budget = step.facts.token_budget
    running = step.queue("running")
    waiting = step.queue("waiting")
    if running is not None and len(running):
        r = running.results[0]
        computed, total = step.columns(r, ("computed", "total"))
        end = step.state_column(r, PREFILL_END.name, PREFILL_END.default)
    else:
        computed = total = end = _NONE
    if waiting is not None and len(waiting):
        w = step.pending("waiting")
        wc, wt = step.columns(w, ("computed", "total")) if w is not None else (_NONE, _NONE)
        new = wt - wc
    else:
        new = _NONE
    schedulable, long_running = K.partial_prefills(computed, end, total, new, max_partial, threshold, max_long)
    return (budget // schedulable if schedulable else budget), long_running

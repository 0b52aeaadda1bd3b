"""The state FastServe's skip-join MLFQ keeps per request, shared by the `mlfq-*` passes.

FastServe (Wu et al., "Fast Distributed Inference Serving for Large Language Models", 2023,
§4.1) gives every job a queue level that persists across iterations. schedir carries it as
declared request state (`schedir.ir.state`), so each step's IR shows every request's level and
service, and a dumped step replays alone.

Service is counted in *iteration units*: a decode token is one unit, and a prefill of `t`
tokens is `ceil(t / prefill-cost)` units (FastServe profiles the first iteration's time; the
option stands in for that profile: how many prompt tokens cost about one decode iteration).
"""

from __future__ import annotations

from schedir.ir.state import RequestState

LEVEL = RequestState("mlfq_level", default=-1, doc="MLFQ queue level, 0 = highest priority; -1: not placed yet")
SERVED_PREFILL = RequestState("mlfq_prefill", default=0, doc="prompt tokens served so far (all levels)")
SERVED_DECODE = RequestState("mlfq_decode", default=0, doc="decode tokens served so far (all levels)")
LEVEL_START = RequestState("mlfq_level_start", default=0,
                           doc="service (iteration units) the request had when it entered its level")
LAST_RUN = RequestState("mlfq_last_run", default=-1, doc="step it last ran in (or was placed in): starvation clock")

MLFQ_STATE = (LEVEL, SERVED_PREFILL, SERVED_DECODE, LEVEL_START, LAST_RUN)

"""The state vLLM v0's scheduler keeps between steps for its delay rule (`delay_factor`).

`Scheduler._passed_delay` (vllm/core/scheduler.py:1833, 0.8.5; the same in 0.6.3) remembers
when the last step that scheduled prompts ran (`prev_time`, `prev_prompt`) and how long that
prompt step took (`last_prompt_latency`, measured at the next call). While requests run, a
waiting request is admitted only once the oldest waiting one has waited longer than
`delay_factor * last_prompt_latency`, so prompts are batched instead of trickling in.
Declared here (`schedir.ir.state`), so every step's IR shows it and a dumped step replays.
"""

from __future__ import annotations

from schedir.ir.state import SchedulerState

PREV_TIME = SchedulerState("v0_prev_time_us", default=0.0, doc="the clock at the last _passed_delay call (µs)")
PREV_PROMPT = SchedulerState("v0_prev_prompt", default=0.0, doc="1: the last prefill pass scheduled prompts")
LAST_LATENCY = SchedulerState("v0_last_prompt_latency_us", default=0.0,
                              doc="time from the last prompt step to the next prefill pass (µs)")

SCHEDULER_STATE = (PREV_TIME, PREV_PROMPT, LAST_LATENCY)

"""The state vLLM v0's scheduler keeps between steps for its delay rule (`delay_factor`).

`Scheduler._passed_delay` (vllm/core/scheduler.py:1833, 0.8.5; the same in 0.6.3) remembers
when the last step that scheduled prompts ran (`prev_time`, `prev_prompt`) and how long that
prompt step took (`last_prompt_latency`, measured at the next call). While requests run, a
waiting request is admitted only once the oldest waiting one has waited longer than
`delay_factor * last_prompt_latency`, so prompts are batched instead of trickling in.
Declared here (`schedir.ir.state`), so every step's IR shows it and a dumped step replays.
"""

from __future__ import annotations

from types import MappingProxyType

from schedir.ir.state import RequestState, SchedulerState

PREV_TIME = SchedulerState("v0_prev_time_us", default=0.0, doc="the clock at the last _passed_delay call (µs)")
PREV_PROMPT = SchedulerState("v0_prev_prompt", default=0.0, doc="1: the last prefill pass scheduled prompts")
LAST_LATENCY = SchedulerState("v0_last_prompt_latency_us", default=0.0,
                              doc="time from the last prompt step to the next prefill pass (µs)")

SCHEDULER_STATE = (PREV_TIME, PREV_PROMPT, LAST_LATENCY)

# Chunked prefill (`_schedule_chunked_prefill`): a request's stage, and the running queue's order,
# which v0 rebuilds every step (requests it did not reach first, then those swapped in, the
# decodes, the prefills that finish, those that do not, and the new ones).
PREFILL_END = RequestState("v0_prefill_end", default=-1,
                           doc="tokens the request was admitted with: in its prefill while computed is below it")
RUN_POS = RequestState("v0_run_pos", default=-1, doc="place in v0's running queue (chunked prefill)")
NEXT_RUN_POS = SchedulerState("v0_next_run_pos", default=0.0, doc="the first free place in v0's running queue")
RUN_BANDS = 6  # places are handed out in bands: swapped-in decodes, swapped-in prefills, decodes,
#                finishing prefills, other prefills, new prefills (each band holds any number)
BAND = 1 << 24  # a band's width; a step never places more requests than this

# The priority policy (`_schedule_priority_preemption`, scheduler.py:967): every step that schedules
# no prefill sorts v0's waiting deque by (priority, arrival); between such steps new arrivals join
# its back and the requests `_schedule_running` preempts its front. The deque is then three runs
# (order-v0-priority): those preempted in the last sorting step, the sorted block, the arrivals
# since. The sorted block is told from the runtime's FCFS places (`queued`: the front counts down
# below 0, arrivals count up from 0): the places it held when sorted, and the victims of the
# priority rule itself, which join it (marked with the step).
SORT_STEP = SchedulerState("v0_sort_step", default=-1.0, doc="the last step that sorted the waiting deque (-1: none)")
SORT_LO = SchedulerState("v0_sort_lo", default=0.0, doc="the lowest FCFS place (`queued`) in the sorted block")
SORT_HI = SchedulerState("v0_sort_hi", default=-1.0, doc="the highest FCFS place (`queued`) in the sorted block")
SORTED_AT = RequestState("v0_sorted_at", default=-1,
                         doc="the step whose priority rule preempted it into the sorted block (-1: none)")
PRIORITY_STATE = (SORT_STEP, SORT_LO, SORT_HI)
# what v0's default-path passes need before them under the priority policy (StepPass.policy_requires)
ORDER_UNDER_PRIORITY = MappingProxyType({"priority": frozenset({"v0-priority-order"})})
PREEMPTION_UNDER_PRIORITY = MappingProxyType({"priority": frozenset({"v0-priority-order", "v0-priority-preemption"})})

"""`StepPass`: a scheduling pass over step IR, with its declared dependencies.

A pass is an xDSL `ModulePass` (a frozen dataclass whose fields are its
options, `name{opt=v}` on the command line) that also declares

- `requires`: facts that must hold before it runs (provided by an earlier pass,
  or recorded in the input step's `facts`),
- `provides`: facts that hold after it runs,
- `invalidates`: facts it breaks (a later pass needing them must re-establish them),
- `request_state` / `scheduler_state`: state it keeps across steps, carried by the runtime
  and shown in the step IR (see `schedir.ir.state`).

The pass manager checks these before running anything; see `schedir.ir.pipeline`.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from types import MappingProxyType
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from schedir.ir.state import RequestState, SchedulerState
from schedir.ir.step import Step, steps_of

if TYPE_CHECKING:
    from schedir.ir.array_step import ArrayStep
    from schedir.ir.running_step import RunningDecision, RunningStep
    from schedir.ir.window import RankColumn, WindowContext

_NO_WRITES: Mapping[str, float] = MappingProxyType({})  # a steady step that writes no state


@dataclass(frozen=True)
class StepPass(ModulePass):
    """Base of every schedir pass: override `run(step)`."""

    name: ClassVar[str] = ""
    # options whose value names a queue of the step; one set explicitly to a queue the step
    # lacks is an error when the pass runs (a misspelt name would otherwise decide nothing)
    queue_options: ClassVar[tuple[str, ...]] = ("queue", "running")
    requires: ClassVar[frozenset[str]] = frozenset()
    provides: ClassVar[frozenset[str]] = frozenset()
    invalidates: ClassVar[frozenset[str]] = frozenset()
    request_state: ClassVar[tuple[RequestState, ...]] = ()
    scheduler_state: ClassVar[tuple[SchedulerState, ...]] = ()
    # reads the step's clock (`now_us`): the runtime records it only for pipelines that do
    reads_clock: ClassVar[bool] = False
    # decides without the prefix cache (its engine's cache is not reproduced): the runtime refuses
    # it with prefix caching on rather than silently not caching, saying `prefix_cache_refusal`
    no_prefix_cache: ClassVar[bool] = False
    prefix_cache_refusal: ClassVar[str] = "its engine's prefix caching is not reproduced yet"
    # decides against vLLM v0's prefix-caching allocator (`kv_pool.CACHE_V0`: its evictor order,
    # its content sharing, hits counted once computed): with prefix caching on, the runtime's pool
    # runs v0's rules; v0's engine default is caching off, so simulations start without it
    v0_prefix_cache: ClassVar[bool] = False
    # the config policies it reproduces (empty: any); the runtime refuses the others
    policies: ClassVar[tuple[str, ...]] = ()
    # under a policy, facts an earlier pass of the pipeline must provide for it to reproduce that
    # policy (vLLM v0's passes under priority: v0's deque order and its priority preemption); the
    # runtime refuses a pipeline without them, naming the passes that provide them
    policy_requires: ClassVar[Mapping[str, frozenset[str]]] = MappingProxyType({})
    # its engine stops a request once it holds more than max_model_len tokens (vLLM v0's
    # StopChecker: len > max_model_len), not once it reaches max_model_len (vLLM v1)
    stops_past_max_model_len: ClassVar[bool] = False
    # the option values under which it decides steady decode steps as `decodes_steadily` says
    # ({} for any options); None (the default): it does not declare them
    steady_when: ClassVar[dict[str, str] | None] = None
    # the option values under which it decides a running step as `decides_running_steps` says
    # ({} for any options); None (the default): it does not declare them
    running_step_when: ClassVar[dict[str, str] | None] = None
    # the option values under which `run_arrays` decides an array step as `run` decides the IR
    # ({} for any options); None (the default): it does not declare them (`decides_array_steps`)
    array_step_when: ClassVar[dict[str, str] | None] = None
    # the scheduler state its `steady_state` / `steady_order` answers read (see `steady_reads`
    # below); None (the default): undeclared, asked every steady step
    steady_reads: ClassVar[frozenset[str] | None] = None
    # its steady answers hold with requests swapped out too: it decides nothing about the swapped
    # queue in a steady step, or its `steady_state` judges `ctx.swapped`; a pipeline takes steady
    # steps while requests are swapped out only when every pass says so (FastServe parks jobs there)
    steady_swapped: ClassVar[bool] = False
    # its steady answer lowered: a Numba function beside `steady_state` / `steady_order`, written
    # rule for rule after them, that the runtime runs with the pipeline's other lowered answers in
    # one kernel call per steady step (`schedir.lowering.steady_program`); None: asked in Python
    steady_lowered: ClassVar[object] = None
    # the declared request state its lowered answer writes for the batch's rows, in order
    steady_lowered_writes: ClassVar[tuple[str, ...]] = ()

    def steady_lowered_options(self, layout: object) -> tuple[float, ...]:
        """Its options and where its lowered answer finds what it reads, as numbers: `layout`
        (`schedir.lowering.steady_layout.SteadyLayout`) names the table's rows (`column(name)`,
        `state(name)`)."""
        return ()

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for step_op in steps_of(op):
            self.run(Step(step_op))

    @abstractmethod
    def run(self, step: Step) -> None:
        """Read the step's columns, append this pass's decisions."""

    def waiting_window(self, ctx: WindowContext) -> np.ndarray | None:
        """The waiting requests this pass could act on in a step built now: their positions in
        `ctx.waiting`, or None for every one (the default: a runtime puts the whole queue in the
        step unless every pass of its pipeline answers; see `schedir.ir.window`)."""
        return None

    def swapped_window(self, ctx: WindowContext) -> np.ndarray | None:
        """The swapped requests this pass could act on in a step built over a ranked window
        (`walks_ranked`): their positions in `ctx.swapped`, or None for every one (the default). A
        ranked walker's None stands for the head of the swapped queue by rank, which the runtime
        adds (its walk resumes a swapped request only into a free seat, so it stops within the
        first max_num_seqs + 1 of them); any other pass's None keeps the whole swapped queue."""
        return None

    # it walks the waiting (and swapped) queue in the step's rank order (`waiting_rank`), acting on
    # a request only while a sequence slot and token budget remain (admit-greedy, mlfq-swap-in):
    # where its window is the whole queue, the runtime may build the step over a prefix of that
    # order and check afterwards that the slots or the budget ran out within it (else it builds
    # the step again over the whole queue; see `schedir.ir.window`, "ranked window")
    walks_ranked: ClassVar[bool] = False

    def waiting_rank(self, ctx: WindowContext) -> tuple[np.ndarray, np.ndarray] | None:
        """The keys this pass's order ranks the waiting and the swapped requests by this step
        (int64, ascending: first; equal keys in queue order, swapped ahead of waiting), aligned
        with `ctx.waiting` and `ctx.swapped`; None when it orders by no such key (the default)."""
        return None

    def rank_columns(self, ctx: WindowContext) -> list[RankColumn] | None:
        """This pass's sort key over `ctx.waiting` as dense columns (`schedir.ir.window.RankColumn`,
        the most significant first; arrival as `ctx.arrival_rank()`), so that its rank composes
        with other order passes' in one pipeline (`WindowContext.composed_rank`); None when it
        declares none (the default: a pipeline with it and another order pass has no rank)."""
        return None

    def decodes_steadily(self) -> bool:
        """Whether, in a steady decode step, this pass decides nothing or exactly the steady decision.

        A steady decode step: nothing in the step's waiting queue, nothing swapped out, every
        running request decoding (its prompt computed, its last token back) and asking for
        exactly one token below max_model_len, all of them within the token budget, and the
        free blocks covering every block their tokens need. The steady decision: every running
        request scheduled for its one token, in running order, with the blocks that token
        needs (its newly full blocks registered in the prefix cache), nobody preempted, no
        state written, the step's facts left as they are (a pass that lowers the token budget
        says to what in `steady_token_budget`: the step is steady only within it).

        When every pass of a block-pool pipeline answers True, the runtime lowers such steps
        straight from its tables instead of building, running and reading their IR (the
        decisions are the same, tested; dumps and `keep_ir` still build it). The default is
        False: a pass that writes state every step (a decaying ratio, attained service, a
        tenant's counter) or could reorder, cap or preempt a pure decode batch must not say
        True. A pass declares it with `steady_when`, the option values it holds under (a queue
        option pointed elsewhere may make it act on a steady step)."""
        when = self.steady_when
        return when is not None and all(getattr(self, option) == value for option, value in when.items())

    def steady_state(self, ctx: WindowContext) -> Mapping[str, float] | None:
        """For a pass that keeps scheduler state: the values it writes in this step if the step is
        steady, `{}` for none, or None when it would decide this step otherwise (the runtime then
        builds its IR). Asked before the step, only of a pipeline whose passes all declare
        `decodes_steadily` and one of which overrides this or `steady_order`, only when the
        runtime found the running requests steady (`ctx.steady`), with the whole waiting queue
        in `ctx.waiting`: such a pass judges the waiting requests itself (SGLang's admission
        gate skips a prefill batch with requests waiting), where the others leave them to their
        `waiting_window`. The default: `{}` when nobody waits or the pass's window answers
        nobody, else None. The runtime writes the passes' values in pipeline order (a later
        pass's value wins, as its `sched.set_state` would) after the step is lowered. A value
        for one of the pass's declared request state is an int64 array aligned with
        `ctx.running`: the batch's rows' new values (when each last ran), written as its
        `sched.set_request_state` would (such answers are asked again every step). Pure: it
        reads `ctx` and changes nothing (an array it writes is a new one), as the runtime may
        still find the step unsteady and build its IR."""
        if not ctx.waiting.size:
            return _NO_WRITES
        window = self.waiting_window(ctx)
        return _NO_WRITES if window is not None and not window.size else None

    def steady_order(self, ctx: WindowContext) -> np.ndarray | None:
        """The batch order of a steady decode step as positions in `ctx.running` (SGLang decodes
        its running batch in join order), or None: running order (the default).

        Both answers may be declared to hold over a run of steady steps: a pass whose
        `steady_reads` names the scheduler state they read promises that they read nothing
        else of `ctx` but the queues (ids and order), declared request state and the fixed
        facts (`max_seqs`, `token_budget`, `block_size`, `max_model_len`, `oversized`; not
        `free_blocks`, `now_us` or table columns, which change every step), and that a value it
        writes from one it does not read (a ratio decaying every step) is written as a
        transition (`schedir.ir.state.Decay`). When every pass of the pipeline declares, the
        runtime asks them again only when the queues are other arrays, request state was
        written, or a value they read changed (`schedir.runtime.steady_answers`); else it
        applies the answers it holds, transitions included."""
        return None

    def decides_running_steps(self) -> bool:
        """Whether, in a running step, this pass decides nothing, or (when it overrides
        `decide_running`) exactly what `decide_running` answers.

        A running step: nobody in the step's waiting queue (the runtime's admission window left
        nobody a pass could admit, or nobody waits), nothing swapped out, requests running (see
        `schedir.ir.running_step`). When every pass of a block-pool pipeline answers True and
        exactly one of them overrides `decide_running`, the runtime asks that pass for the step's
        decisions instead of building, running and reading the IR (the decisions are the same,
        tested; dumps and `keep_ir` still build it). A pass that only reads the waiting queue
        declares it as `running_step_when`; one that acts on the running queue overrides
        `decide_running` too, or must not declare."""
        when = self.running_step_when
        return when is not None and all(getattr(self, option) == value for option, value in when.items())

    def decide_running(self, step: RunningStep) -> RunningDecision | None:
        """The decisions of a running step (see `decides_running_steps`): the running requests
        scheduled and preempted, their block effects committed to `step.pool` as the IR run
        commits them. None (the default): this pass does not decide running steps; a pass that
        overrides it answers None only before it changed anything (the runtime then builds the IR)."""
        return None

    def decides_array_steps(self) -> bool:
        """Whether `run_arrays` decides an array step as `run` decides the step's IR, under this
        pass's options (`array_step_when`: the option values it holds under, {} for any; None,
        the default: it does not declare). When every pass of a count-level pipeline declares,
        the runtime takes its IR steps over arrays (`schedir.ir.array_step`): the same
        decisions (tested step by step), without building and reading the IR's ops."""
        when = self.array_step_when
        return when is not None and all(getattr(self, option) == value for option, value in when.items())

    def run_arrays(self, step: ArrayStep) -> None:
        """`run`, rule for rule, over an `ArrayStep` (see `decides_array_steps`)."""
        raise NotImplementedError(f"pass '{self.name}' does not decide array steps")

    def steady_token_budget(self, budget: int) -> int:
        """The token budget this pass leaves a steady decode step whose budget is `budget` (the
        default: unchanged; see `decodes_steadily`)."""
        return budget

    @classmethod
    def summary(cls) -> str:
        doc = (cls.__doc__ or "").strip()
        return doc.splitlines()[0] if doc else ""

    @classmethod
    def options(cls) -> list[tuple[str, str, object]]:
        """(name, type, default) of each option, for `schedir passes`."""
        out = []
        for f in fields(cls):
            type_name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
            default = "(required)" if f.default is MISSING else f.default
            out.append((f.name.replace("_", "-"), str(type_name), default))
        return out

    @classmethod
    def options_text(cls) -> str:
        """`chunk: bool = true, queue: str = waiting`: the options as a user writes them."""
        return ", ".join(f"{n}: {t} = {str(d).lower() if isinstance(d, bool) else d}" for n, t, d in cls.options())

    def named_queues(self) -> list[tuple[str, str]]:
        """(option, queue) for each queue option set to something other than its default.

        A default queue the step lacks means the step has no such requests; a queue named
        explicitly must exist (see `queue_options`)."""
        out = []
        for f in fields(self):
            if f.name in self.queue_options:
                value = getattr(self, f.name)
                if value != f.default:
                    out.append((f.name.replace("_", "-"), value))
        return out

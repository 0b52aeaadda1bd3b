"""The pass manager: parse a pipeline, check its dependencies, run it, instrument it.

A pipeline is refused before anything runs when a pass is unknown, an option
is bad, or a pass requires a fact that no earlier pass provides (or that an
earlier pass invalidated). Passes are never reordered silently: the message
says which pass to move where.
"""

from __future__ import annotations

import dataclasses
import difflib
import time
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, TextIO

import attrs
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.arg_spec import ArgSpec, ArgSpecParseError, parse_pipeline
from xdsl.utils.exceptions import VerifyException

from schedir.dialects.sched import StepOp
from schedir.ir.errors import PassFailure, PipelineError, QueueOptionError
from schedir.ir.pass_base import StepPass
from schedir.ir.state import DeclaredState, StateConflict, declared_state
from schedir.ir.step import Step, steps_of
from schedir.ir.textio import print_ir, verify_message

Registry = Mapping[str, type[StepPass]]


@attrs.define
class Instrumentation:
    """What to record around each pass: IR text (stream or folder) and Graphviz dumps."""

    print_ir_after_all: TextIO | None = None  # IR text after every pass, to this stream
    dump_dir: Path | None = None  # IR text after every pass, one file each: 01-order-fcfs.mlir
    dot_dir: Path | None = None  # DOT (and SVG when Graphviz is installed) after every pass
    svg: bool | None = None  # None: SVG when `dot` is on PATH
    prefix: str = ""  # file-name prefix, e.g. "step-42-" for dumps from a live run
    written: list[Path] = attrs.field(factory=list)
    svg_skipped: bool = False  # DOT written without its SVG: `svg` is None and Graphviz is not installed

    def record(self, index: int, label: str, module: ModuleOp) -> None:
        stem = f"{self.prefix}{index:02d}-{label}"
        if self.print_ir_after_all is not None:
            self.print_ir_after_all.write(f"// -----// IR after {label} //----- //\n")
            self.print_ir_after_all.write(print_ir(module))
        if self.dump_dir is not None:
            self.dump_dir.mkdir(parents=True, exist_ok=True)
            path = self.dump_dir / f"{stem}.mlir"
            path.write_text(print_ir(module))
            self.written.append(path)
        if self.dot_dir is not None:
            from schedir.ir.dot import write_dot

            self.dot_dir.mkdir(parents=True, exist_ok=True)
            written = write_dot(module, self.dot_dir / f"{stem}.dot", title=label, svg=self.svg)
            self.written.extend(written)
            if self.svg is None and len(written) == 1:
                self.svg_skipped = True


class PassTiming(NamedTuple):
    name: str
    seconds: float


def default_registry() -> Registry:
    from schedir.passes import PASSES

    return PASSES


def default_presets() -> Mapping[str, str]:
    from schedir.passes.presets import PRESETS

    return PRESETS


def _suggest(name: str, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def parse_passes(spec: str, registry: Registry | None = None, presets: Mapping[str, str] | None = None) -> list[StepPass]:
    """`"a,b{x=1}"` -> pass instances; a preset name expands to its pipeline."""
    registry = registry if registry is not None else default_registry()
    presets = presets if presets is not None else default_presets()
    spec = spec.strip()
    if not spec:
        return []
    try:
        specs = list(parse_pipeline(spec))
    except ArgSpecParseError as err:
        raise PipelineError(f"cannot parse pipeline '{spec}': {str(err).strip()}") from None
    passes: list[StepPass] = []
    for item in specs:
        if item.name in presets and item.name not in registry:
            if item.parameters:
                raise PipelineError(f"preset '{item.name}' takes no options; give them to its passes instead")
            others = {k: v for k, v in presets.items() if k != item.name}  # no preset includes itself
            passes.extend(parse_passes(presets[item.name], registry, others))
            continue
        cls = registry.get(item.name)
        if cls is None:
            known = sorted(registry)
            raise PipelineError(
                f"unknown pass '{item.name}'{_suggest(item.name, [*known, *presets])} "
                f"(passes: {', '.join(known)}; presets: {', '.join(sorted(presets))})"
            )
        _check_options(cls, item)
        try:
            passes.append(cls.from_spec(item))
        except (ValueError, TypeError) as err:  # a pass's own check of its options' values
            raise PipelineError(f"pass '{item.name}': bad option: {err} (options: {cls.options_text() or 'none'})") from None
    return passes


_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a name"}


def _check_options(cls: type[StepPass], item: ArgSpec) -> None:
    """Refuse an unknown option or a value of the wrong kind, in the pipeline's own words."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    options = f"(options: {cls.options_text() or 'none'})"
    for key, values in item.parameters.items():
        attr = key.replace("-", "_")
        if attr not in fields:
            close = _suggest(key, [f.replace("_", "-") for f in fields])
            raise PipelineError(f"pass '{item.name}': bad option '{key}': no such option{close} {options}")
        kind = hints.get(attr)
        expected = _EXPECTED.get(kind)  # type: ignore[arg-type]
        if expected is None:
            continue  # an option of another type: the pass's own from_spec checks it
        given = ",".join(_spec_value(v) for v in values)
        if len(values) != 1:
            raise PipelineError(f"pass '{item.name}': bad option {key}={given}: expected one value, {expected} {options}")
        value = values[0]
        ok = (type(value) is kind if kind is not float else type(value) in (int, float))
        if not ok:
            noun = "a queue name" if attr in cls.queue_options else expected
            what = f"{noun}, such as {fields[attr].default}" if kind is str else expected
            raise PipelineError(f"pass '{item.name}': bad option {key}={given}: expected {what} {options}")
        if kind is float and type(value) is int:  # `slack=0` for a number: xDSL's from_spec wants a float
            item.parameters[key] = (float(value),)  # type: ignore[index]


def _spec_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def check_pipeline(passes: Sequence[StepPass], initial: frozenset[str] = frozenset(), registry: Registry | None = None) -> frozenset[str]:
    """Refuse a pipeline whose requirements are not met in order; return the facts after it."""
    registry = registry if registry is not None else default_registry()
    available = set(initial)
    provided_by: dict[str, str] = {f: "the input step" for f in initial}
    invalidated_by: dict[str, str] = {}
    for index, p in enumerate(passes):
        for fact in sorted(p.requires):
            if fact in available:
                continue
            where = f"pass '{p.name}' (#{index + 1})"
            if fact in invalidated_by:
                raise PipelineError(
                    f"{where} requires '{fact}', but '{invalidated_by[fact]}' invalidated it after "
                    f"{provided_by[fact]} provided it; run a pass that provides '{fact}' after '{invalidated_by[fact]}'"
                )
            later = [f"'{q.name}' (#{j + 1})" for j, q in enumerate(passes) if j > index and fact in q.provides]
            if later:
                raise PipelineError(
                    f"{where} requires '{fact}', which is provided only later, by {later[0]}: "
                    f"move it before '{p.name}'"
                )
            providers = sorted(name for name, cls in registry.items() if fact in cls.provides and name != p.name)
            hint = f"add one of: {', '.join(providers)} before it" if providers else "no known pass provides it"
            raise PipelineError(f"{where} requires '{fact}', which no earlier pass provides; {hint}")
        for fact in p.invalidates:
            available.discard(fact)
            invalidated_by[fact] = p.name
        for fact in p.provides:
            available.add(fact)
            provided_by[fact] = f"'{p.name}'"
            invalidated_by.pop(fact, None)
    return frozenset(available)


def policy_refusal(passes: Sequence[StepPass], policy: str, registry: Registry | None = None) -> str | None:
    """Why a pipeline does not reproduce the config's `policy` (None: it does): a pass that
    reproduces other policies only (`StepPass.policies`), or one whose facts under it
    (`StepPass.policy_requires`) no earlier pass provides, naming the passes that do."""
    provided: set[str] = set()
    for p in passes:
        missing = sorted(p.policy_requires.get(policy, frozenset()) - provided)
        if missing:
            registry = registry if registry is not None else default_registry()
            names = sorted(n for n, cls in registry.items() if set(missing) <= cls.provides)
            presets = sorted(n for n, spec in default_presets().items() if any(x in spec.split(",") for x in names))
            where = (f"provided by {', '.join(names)}" + (f": the {', '.join(presets)} preset" if presets else "")
                     if names else "no known pass provides them")
            return (f"pass '{p.name}' reproduces policy '{policy}' only after a pass that provides "
                    f"{', '.join(missing)} ({where})")
        if p.policies and policy not in p.policies:
            return f"pass '{p.name}' reproduces policy {' or '.join(p.policies)} only, not '{policy}'"
        provided |= p.provides
    return None


@attrs.define
class PassManager:
    """Runs an ordered, checked pipeline of passes over step IR.

    `verify_each` runs the IR verifier after every pass (debug, dumps, tests);
    production runs leave it off (it costs ~60-100 µs a call).
    """

    passes: list[StepPass]
    verify_each: bool = False
    instrument: Instrumentation | None = None
    registry: Registry | None = None
    _checked: dict[frozenset[str], frozenset[str]] = attrs.field(factory=dict)
    # per step policy met: why the pipeline does not reproduce it (None: it does), see `_check_policies`
    _policy_refusals: dict[str, str | None] = attrs.field(factory=dict)
    _transitions: dict[tuple[frozenset[str], int], frozenset[str]] = attrs.field(factory=dict)
    # per checked input fact set: (pass, facts before it, facts after it or None if unchanged)
    _chains: dict[frozenset[str], tuple[tuple[StepPass, frozenset[str], frozenset[str] | None], ...]] = attrs.field(
        factory=dict)
    # perf_counter before and after each pass of the last run that finished, flat
    _marks: list[float] = attrs.field(factory=list)
    # (pass, option, queue) for every queue an option names explicitly; built on the first run
    _named_queues: list[tuple[StepPass, str, str]] | None = None
    state: DeclaredState = attrs.field(init=False)
    _has_state: bool = attrs.field(init=False, default=False)
    _routes: bool = attrs.field(init=False, default=False)
    _routes_only: bool = attrs.field(init=False, default=False)
    """The state the passes declare (`schedir.ir.state`), checked for conflicts at construction."""

    def __attrs_post_init__(self) -> None:
        try:
            self.state = declared_state(self.passes)
        except StateConflict as err:
            raise PipelineError(str(err)) from None
        # computed once: `run` is the runtime's per-step path
        self._has_state = bool(self.state)
        self._routes = any(getattr(p, "over", "") == "cluster.route_step" for p in self.passes)
        self._routes_only = bool(self.passes) and all(getattr(p, "over", "") == "cluster.route_step"
                                                      for p in self.passes)

    def _state_defaults(self) -> tuple[dict[str, float], dict[str, int]]:
        return ({s.name: s.initial() for s in self.state.scheduler}, {s.name: s.default for s in self.state.requests})

    @property
    def timings(self) -> list[PassTiming]:
        """Wall time of each pass of the last run, in order (built on demand from clock marks:
        the runtime runs the pipeline every step and rarely asks)."""
        marks = self._marks
        return [PassTiming(p.name, marks[2 * i + 1] - marks[2 * i]) for i, p in enumerate(self.passes[: len(marks) // 2])]

    @classmethod
    def parse(cls, spec: str, **kwargs: object) -> PassManager:
        registry = kwargs.get("registry")
        return cls(parse_passes(spec, registry), **kwargs)  # type: ignore[arg-type]

    @property
    def spec(self) -> str:
        return ",".join(str(p.spec()) for p in self.passes)

    def check(self, initial: frozenset[str] = frozenset()) -> frozenset[str]:
        after = self._checked.get(initial)
        if after is None:
            after = self._checked[initial] = check_pipeline(self.passes, initial, self.registry)
        return after

    def run(self, module: ModuleOp, on_pass: Callable[[StepPass, ModuleOp], None] | None = None, *,
            complete_state: bool = False) -> None:
        """Check, then run every pass in order over every step of `module` (in place).
        `complete_state`: the caller built every step with all the state the passes declare (the
        runtime does), so the steps are not searched for missing state to fill with defaults."""
        marks = self._marks
        marks.clear()
        steps = steps_of(module)
        route_views = self._route_views(module, bool(steps)) if self._routes or not steps else None
        if route_views is None and not steps:
            raise PipelineError("the input holds no sched.step op")
        if route_views is None and not complete_state:  # (the runtime checks its config's policy once)
            self._check_policies(steps)
        if (((route_views is None and len(steps) == 1) or (route_views is not None and len(route_views) == 1))
                and self._named_queues == [] and not self.verify_each and self.instrument is None and on_pass is None):
            self._run_one(Step(steps[0]) if route_views is None else route_views[0], marks,
                          complete_state)  # one step, unobserved
            return
        views = route_views if route_views is not None else [Step(op) for op in steps]
        for view in views:
            self.check(view.fact_set)
        if self.state and not complete_state:
            for view in views:
                view.ensure_state(*self._state_defaults())
        named = self._named_queues
        if named is None:
            named = self._named_queues = [(p, option, queue) for p in self.passes for option, queue in p.named_queues()]
        if named:
            self._check_queues(views, named)
        observe = self.verify_each or self.instrument is not None or on_pass is not None
        if self.instrument is not None:
            self.instrument.record(0, "input", module)
        clock = time.perf_counter
        for index, p in enumerate(self.passes):
            start = clock()
            for view in views:
                p.run(view)
            if p.provides or p.invalidates:
                for view in views:
                    before = view.fact_set
                    after = self._transitions.get((before, index))
                    if after is None:
                        after = self._transitions[(before, index)] = (before - p.invalidates) | p.provides
                    view.set_facts(after, write=observe)
            marks += (start, clock())
            if self.verify_each:
                self._verify(module, p)
            if self.instrument is not None:
                self.instrument.record(index + 1, p.name, module)
            if on_pass is not None:
                on_pass(p, module)
        if not observe:
            for view in views:
                view.write_facts()

    def _check_policies(self, steps: Sequence[StepOp]) -> None:
        """Refuse steps whose `policy` fact this pipeline does not reproduce (`policy_refusal`,
        once per policy): a hand-written or dumped step run by `schedir opt` is judged as the
        runtime judges its config."""
        for op in steps:
            policy = Step(op).facts.policy
            if policy not in self._policy_refusals:
                self._policy_refusals[policy] = policy_refusal(self.passes, policy, self.registry)
            refusal = self._policy_refusals[policy]
            if refusal:
                raise PipelineError(f"{refusal}; the step's policy is '{policy}'")

    def run_view(self, view: object) -> None:
        """Run a routing pipeline over one routing step held as arrays (`RouteArrays`), unobserved:
        the passes as `run` runs them over the step's IR, with the same fact transitions, and
        nothing to walk or write (the fleet simulator's routing; `view.to_module()` gives the IR)."""
        if not self._routes_only:
            raise PipelineError("run_view takes a routing pipeline (passes over cluster.route_step)")
        marks = self._marks
        marks.clear()
        self._run_one(view, marks)  # type: ignore[arg-type]

    def _route_views(self, module: ModuleOp, has_steps: bool) -> list | None:
        """`RouteStep` views when the pipeline routes (`cluster.route_step` input), else None;
        a pipeline mixing routing and step passes, or one that does not fit the input, is refused."""
        routing = [p.name for p in self.passes if getattr(p, "over", "") == "cluster.route_step"]
        if not routing:
            if not has_steps and self.passes:
                from schedir.ir.route_step import route_steps_of

                if route_steps_of(module):
                    raise PipelineError(f"pass '{self.passes[0].name}' runs on sched.step, but the input holds "
                                        "cluster.route_step ops: use routing passes or a router preset")
            return None
        if len(routing) != len(self.passes):
            other = next(p.name for p in self.passes if p.name not in routing)
            raise PipelineError(f"pass '{other}' runs on sched.step and '{routing[0]}' on cluster.route_step: "
                                "a pipeline cannot mix them")
        from schedir.ir.route_step import RouteStep, route_steps_of

        ops = route_steps_of(module)
        if not ops:
            raise PipelineError(f"pass '{routing[0]}' routes, but the input holds no cluster.route_step op")
        return [RouteStep(op) for op in ops]

    def _run_one(self, view: Step, marks: list[float], complete_state: bool = False) -> None:
        """`run` for one step, unobserved, with no queue named by an option (the runtime's path):
        the pipeline's fact transitions from this input are computed once, then each pass runs."""
        initial = view.fact_set
        if self._has_state and not complete_state:
            view.ensure_state(*self._state_defaults())
        chain = self._chains.get(initial)
        if chain is None:
            self.check(initial)
            links = []
            facts = initial
            for p in self.passes:
                after = (facts - p.invalidates) | p.provides if p.provides or p.invalidates else None
                links.append((p, facts, after))
                facts = after if after is not None else facts
            chain = self._chains[initial] = tuple(links)
        clock = time.perf_counter
        for p, before, after in chain:
            start = clock()
            p.run(view)
            if after is not None:
                if view._fact_set is before:
                    view._fact_set = after
                else:  # the pass changed the live facts itself: the general rule
                    view._fact_set = (view.fact_set - p.invalidates) | p.provides
            marks += (start, clock())
        view.write_facts()

    @staticmethod
    def _check_queues(views: Sequence[Step], named: Sequence[tuple[StepPass, str, str]]) -> None:
        """A queue an option names must be a queue of the input (of at least one of its steps:
        a file of several steps may leave a queue out of those that have no such requests)."""
        present = {q.queue.data for view in views for q in view.queues()}  # type: ignore[attr-defined]
        for p, option, queue in named:
            if queue not in present:
                where = f"step {views[0].facts.step}: " if len(views) == 1 else ""
                raise QueueOptionError(
                    f"{where}pass '{p.name}': option {option}={queue} names no queue of the step"
                    f"{_suggest(queue, sorted(present))} (its queues: {', '.join(sorted(present)) or 'none'})"
                )

    @staticmethod
    def _verify(module: ModuleOp, after: StepPass) -> None:
        try:
            module.verify()
        except VerifyException as err:
            raise PassFailure(after.name, f"left invalid IR: {verify_message(err)}") from None


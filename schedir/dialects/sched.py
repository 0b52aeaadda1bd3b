"""The `sched` dialect: one scheduling step and the batch it yields.

`sched.step` carries every fact a pass may read about the engine this step
(budgets, pool counts, model length, the policy) and the analysis facts already
established (`facts`), so a dumped step is self-contained and replays alone.

    sched.step 42 {token_budget = 8192, max_seqs = 256, block_size = 16,
                   free_blocks = 1200, cached_free_blocks = 30, total_blocks = 2000,
                   max_model_len = 4096, policy = "fcfs", facts = []} {
      %run = req.queue running {...}
      ...
      sched.yield %dec, %adm
    }

`sched.yield` lists the scheduled sets in batch order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar

import attrs
import numpy as np
from immutabledict import immutabledict
from xdsl.dialects.builtin import (
    I64, ArrayAttr, BytesAttr, DictionaryAttr, FloatAttr, FloatData, IntAttr, IntegerAttr, StringAttr, f64, i64,
)
from xdsl.ir import Attribute, Block, Dialect
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.traits import IsTerminator, SingleBlockImplicitTerminator
from xdsl.utils.exceptions import VerifyException

from schedir.dialects.base import (
    SET,
    RequestSetType,
    parse_attr_dict,
    parse_string,
    parse_yield_operands,
    print_attr_dict,
    print_yield,
    string_literal,
)
from schedir.dialects.req import QueueOp, ScheduleOp

INT_FACTS = (
    "token_budget",
    "max_seqs",
    "block_size",
    "free_blocks",
    "cached_free_blocks",
    "total_blocks",
    "max_model_len",
)


@attrs.frozen
class StepFacts:
    """The engine facts of one step, as plain Python values."""

    step: int
    token_budget: int
    max_seqs: int
    block_size: int
    free_blocks: int
    cached_free_blocks: int
    total_blocks: int
    max_model_len: int
    policy: str = "fcfs"
    facts: tuple[str, ...] = ()  # analysis facts when the step was built; live ones: Step.fact_set
    now_us: int = -1  # the engine's clock when the step was built (µs, as `arrival`); -1: not given
    host_free_blocks: int = -1  # free blocks of the KV pool's host tier (swap space); -1: the step has none
    # the runtime's waiting requests when the step holds only some of them (a window); -1: it holds them all
    waiting_count: int = -1


_INT_CACHE: dict[int, IntegerAttr] = {}
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def _fast_i64(value: int) -> IntegerAttr:
    """`IntegerAttr(value, i64)` without xDSL's generic construction and verification (~0.4 µs
    instead of ~4.6): the value is a Python int already checked to fit in 64 bits. The step
    number and the free-block counts change every step, so they miss the cache."""
    inner = object.__new__(IntAttr)
    object.__setattr__(inner, "data", value)
    attr = object.__new__(IntegerAttr)
    object.__setattr__(attr, "value", inner)
    object.__setattr__(attr, "type", i64)
    return attr


def i64_attr(value: int) -> IntegerAttr:
    """A cached `IntegerAttr<i64>`: building one costs more than looking it up."""
    attr = _INT_CACHE.get(value)
    if attr is None:
        attr = _fast_i64(value) if type(value) is int and _I64_MIN <= value <= _I64_MAX else IntegerAttr(value, i64)
        if len(_INT_CACHE) < 65536:
            _INT_CACHE[value] = attr
    return attr


_POLICIES: dict[str, StringAttr] = {}
_FIXED_INT_FACTS = ("token_budget", "max_seqs", "block_size", "total_blocks", "max_model_len")
_FIXED_PROPS: dict[tuple, dict[str, Attribute]] = {}
_FACTS_CACHE: dict[tuple[str, ...] | frozenset[str], ArrayAttr[StringAttr]] = {}


def facts_attr(facts: Iterable[str]) -> ArrayAttr[StringAttr]:
    """A cached, sorted `facts` array (keyed by the given tuple or set as is: the common
    inputs repeat every step)."""
    raw = facts if isinstance(facts, (tuple, frozenset)) else tuple(facts)
    attr = _FACTS_CACHE.get(raw)  # type: ignore[arg-type]
    if attr is None:
        key = tuple(sorted(set(raw)))
        attr = _FACTS_CACHE.get(key)
        if attr is None:
            attr = _FACTS_CACHE[key] = ArrayAttr([StringAttr(f) for f in key])
        if len(_FACTS_CACHE) < 4096:
            _FACTS_CACHE[raw] = attr  # type: ignore[index]
    return attr


def _parse_i64(parser: Parser, context: str) -> int:
    at = parser._current_token.span
    value = parser.parse_integer(allow_boolean=False, context_msg=context)
    if not -(2**63) <= value < 2**63:
        parser.raise_error(f"{value} does not fit in int64{context}", at)
    return value


@irdl_op_definition
class YieldOp(IRDLOperation):
    """Ends a step: the scheduled sets, in the order the batch runs them.

        sched.yield %dec, %adm
    """

    name = "sched.yield"
    sets = var_operand_def(RequestSetType)
    traits = traits_def(IsTerminator())

    def verify_(self) -> None:
        if not isinstance(self.parent_op(), StepOp):
            raise VerifyException("sched.yield must end a sched.step")
        for value in self.sets:
            if not isinstance(value.owner, ScheduleOp):
                raise VerifyException("sched.yield: every operand must be a req.schedule result")
        if len(set(self.sets)) != len(self.sets):
            raise VerifyException("sched.yield: a scheduled set appears more than once in the batch")

    def print(self, printer: Printer) -> None:
        print_yield(printer, self)

    @classmethod
    def parse(cls, parser: Parser) -> YieldOp:
        return cls.create(operands=parse_yield_operands(parser, SET), attributes=parse_attr_dict(parser))


@irdl_op_definition
class StepOp(IRDLOperation):
    """One scheduling step: the engine's facts and a single block of decisions."""

    name = "sched.step"
    step = prop_def(IntegerAttr[I64])
    token_budget = prop_def(IntegerAttr[I64])
    max_seqs = prop_def(IntegerAttr[I64])
    block_size = prop_def(IntegerAttr[I64])
    free_blocks = prop_def(IntegerAttr[I64])
    cached_free_blocks = prop_def(IntegerAttr[I64])
    total_blocks = prop_def(IntegerAttr[I64])
    max_model_len = prop_def(IntegerAttr[I64])
    policy = prop_def(StringAttr)
    facts = prop_def(ArrayAttr[StringAttr])
    now_us = opt_prop_def(IntegerAttr[I64])
    host_free_blocks = opt_prop_def(IntegerAttr[I64])
    waiting_count = opt_prop_def(IntegerAttr[I64])
    body = region_def("single_block")
    traits = traits_def(SingleBlockImplicitTerminator(YieldOp))

    FACT_NAMES: ClassVar[tuple[str, ...]] = INT_FACTS + ("policy", "facts", "now_us", "host_free_blocks",
                                                         "waiting_count")
    OPTIONAL_INT_FACTS: ClassVar[tuple[str, ...]] = ("now_us", "host_free_blocks", "waiting_count")  # absent: -1

    @staticmethod
    def build(facts: StepFacts, ops: Iterable[IRDLOperation] = ()) -> StepOp:
        from schedir.ir.fastop import new_op, region_of  # the fast constructors live with the IR machinery

        op = new_op(StepOp, (), {}, (), (region_of(list(ops)),))
        op.set_facts(facts)
        return op

    def set_facts(self, facts: StepFacts) -> None:
        """Write `facts` into the properties (a recycled step op takes each step's facts this way)."""
        # An engine's budgets, model length and policy repeat every step: their attributes
        # are built once per combination; the step number and pool counts are new each step.
        key = (facts.token_budget, facts.max_seqs, facts.block_size, facts.total_blocks, facts.max_model_len,
               facts.policy, facts.facts)
        fixed = _FIXED_PROPS.get(key)
        if fixed is None:
            policy = _POLICIES.get(facts.policy)
            if policy is None:
                policy = _POLICIES[facts.policy] = StringAttr(facts.policy)
            canonical = len(facts.facts) < 2 or list(facts.facts) == sorted(set(facts.facts))  # as `read_facts` reads them
            fixed = (*(i64_attr(getattr(facts, name)) for name in _FIXED_INT_FACTS), policy, facts_attr(facts.facts),
                     canonical)
            if len(_FIXED_PROPS) < 256:
                _FIXED_PROPS[key] = fixed
        budget, seqs, block_size, total, model_len, policy, facts_prop, canonical = fixed
        props: dict[str, Attribute] = {
            "step": i64_attr(facts.step), "token_budget": budget, "max_seqs": seqs, "block_size": block_size,
            "free_blocks": i64_attr(facts.free_blocks), "cached_free_blocks": i64_attr(facts.cached_free_blocks),
            "total_blocks": total, "max_model_len": model_len, "policy": policy, "facts": facts_prop,
        }
        if facts.now_us >= 0:
            props["now_us"] = i64_attr(facts.now_us)
        if facts.host_free_blocks >= 0:
            props["host_free_blocks"] = i64_attr(facts.host_free_blocks)
        if facts.waiting_count >= 0:
            props["waiting_count"] = i64_attr(facts.waiting_count)
        self.properties = props
        if canonical:
            self._built = (facts, props["step"], props["free_blocks"], props["cached_free_blocks"], facts_prop)
        else:
            self._built = None

    @property
    def block(self) -> Block:
        return self.body.block

    def read_facts(self) -> StepFacts:
        built = getattr(self, "_built", None)
        if built is not None:  # the facts it was built from, unless a property was replaced since
            props = self.properties
            if (props["step"] is built[1] and props["free_blocks"] is built[2]
                    and props["cached_free_blocks"] is built[3] and props["facts"] is built[4]):
                return built[0]
        props = self.properties
        optional = {name: props[name].value.data if name in props else -1  # type: ignore[attr-defined]
                    for name in self.OPTIONAL_INT_FACTS}
        return StepFacts(
            step=self.step.value.data,
            policy=self.policy.data,
            facts=tuple(f.data for f in self.facts.data),
            **optional,
            **{name: getattr(self, name).value.data for name in INT_FACTS},
        )

    def fact_set(self) -> frozenset[str]:
        return frozenset(f.data for f in self.facts.data)

    def verify_(self) -> None:
        if self.step.value.data < 0:
            raise VerifyException(f"sched.step: step index {self.step.value.data} is negative")
        for name in INT_FACTS:
            value = getattr(self, name).value.data
            if value < 0:
                raise VerifyException(f"sched.step: {name} = {value} is negative")
        for name in ("token_budget", "max_seqs", "block_size", "max_model_len"):
            if getattr(self, name).value.data == 0:
                raise VerifyException(f"sched.step: {name} must be positive")
        for name in self.OPTIONAL_INT_FACTS:
            value = self.properties.get(name)
            if value is not None and value.value.data < 0:  # type: ignore[attr-defined]
                raise VerifyException(f"sched.step: {name} = {value.value.data} is negative")  # type: ignore[attr-defined]
        free, cached, total = (getattr(self, n).value.data for n in ("free_blocks", "cached_free_blocks", "total_blocks"))
        if free > total:
            raise VerifyException(f"sched.step: free_blocks = {free} exceeds total_blocks = {total}")
        if cached > free:
            raise VerifyException(f"sched.step: cached_free_blocks = {cached} exceeds free_blocks = {free}")
        seen: set[str] = set()
        queue_ids = []
        for op in self.body.block.ops:
            if isinstance(op, QueueOp):
                name = op.queue.data
                if name in seen:
                    raise VerifyException(f"sched.step: queue '{name}' appears twice (one req.queue per queue)")
                seen.add(name)
                queue_ids.append(op.ids)
        if len(queue_ids) > 1:
            ids, counts = np.unique(np.concatenate(queue_ids), return_counts=True)
            if (counts > 1).any():
                raise VerifyException(f"sched.step: request(s) {ids[counts > 1][:10].tolist()} are in more than one queue")

    def print(self, printer: Printer) -> None:
        f = self.read_facts()
        ints = ", ".join(f"{name} = {getattr(f, name)}" for name in INT_FACTS)
        facts = ", ".join(string_literal(fact) for fact in f.facts)
        now = f", now_us = {f.now_us}" if f.now_us >= 0 else ""
        if f.host_free_blocks >= 0:
            now += f", host_free_blocks = {f.host_free_blocks}"
        if f.waiting_count >= 0:
            now += f", waiting_count = {f.waiting_count}"
        printer.print_string(f" {f.step} {{{ints}{now}, policy = {string_literal(f.policy)}, facts = [{facts}]}}")
        print_attr_dict(printer, self)
        printer.print_string(" ")
        printer.print_region(self.body, print_entry_block_args=False, print_empty_block=False)

    @classmethod
    def parse(cls, parser: Parser) -> StepOp:
        step = _parse_i64(parser, " (the step index)")
        values: dict[str, object] = {}

        def parse_fact() -> None:
            at = parser._current_token.span
            key = parser.parse_identifier(" (a step fact)")
            if key not in cls.FACT_NAMES:
                parser.raise_error(f"unknown step fact '{key}' (expected: {', '.join(cls.FACT_NAMES)})", at)
            if key in values:
                parser.raise_error(f"step fact '{key}' given twice", at)
            parser.parse_punctuation("=")
            if key == "policy":
                values[key] = parse_string(parser, "the policy name")
            elif key == "facts":
                values[key] = tuple(
                    parser.parse_comma_separated_list(parser.Delimiter.SQUARE, lambda: parse_string(parser, "a fact"), " (facts)")
                )
            else:
                values[key] = _parse_i64(parser, f" for {key}")

        opening = parser._current_token.span
        parser.parse_comma_separated_list(parser.Delimiter.BRACES, parse_fact, " (the step facts)")
        missing = [k for k in INT_FACTS if k not in values]
        if missing:
            parser.raise_error(f"sched.step is missing fact(s): {', '.join(missing)}", opening)
        attributes = parse_attr_dict(parser)
        region = parser.parse_region()
        facts = StepFacts(step=step, **values)  # type: ignore[arg-type]
        op = StepOp.build(facts)
        op.body.detach_block(0)
        for block in list(region.blocks):
            region.detach_block(block)
            op.body.add_block(block)
        op.attributes.update(attributes)
        if not op.body.blocks:
            op.body.add_block(Block())
        if not isinstance(op.body.block.last_op, YieldOp):
            op.body.block.add_op(YieldOp.create())
        return op


class _StateValuesOp(IRDLOperation):
    """Shared by `sched.state` and `sched.set_state`: named numbers or vectors of numbers,
    `{name = 0.7, counters = [0.0, 12.5]}`."""

    values = prop_def(DictionaryAttr)

    @classmethod
    def of(cls, values: Mapping[str, StateValue]) -> _StateValuesOp:
        from schedir.ir.fastop import new_op

        return new_op(cls, (), {"values": state_values_attr(values)})

    def as_dict(self) -> dict[str, StateValue]:
        """The values (vectors as fresh copies); decoded once per attribute (`decoded_state_values`)."""
        values = decoded_state_values(self.properties["values"])  # type: ignore[arg-type]
        return dict(values)

    def verify_(self) -> None:
        for key, value in self.values.data.items():
            ok = isinstance(value, FloatAttr) or (isinstance(value, BytesAttr) and len(value.data) % 8 == 0)
            if not ok:
                raise VerifyException(f"{self.name}: value of '{key}' must be a number or a list of numbers")
        if not isinstance(self.parent_op(), StepOp):
            raise VerifyException(f"{self.name} must be inside a sched.step")

    def print(self, printer: Printer) -> None:
        items = ", ".join(f"{k} = {_number_text(v)}" for k, v in self.as_dict().items())
        printer.print_string(f" {{{items}}}")
        print_attr_dict(printer, self)

    @classmethod
    def parse(cls, parser: Parser) -> _StateValuesOp:
        values: dict[str, StateValue] = {}

        def parse_entry() -> None:
            at = parser._current_token.span
            key = parser.parse_identifier(" (a state name)")
            if key in values:
                parser.raise_error(f"state '{key}' given twice", at)
            parser.parse_punctuation("=")
            context = f" (the value of state '{key}')"
            if parser._current_token.text == "[":
                values[key] = np.array(parser.parse_comma_separated_list(
                    parser.Delimiter.SQUARE, lambda: float(parser.parse_number(context_msg=context)), context),
                    dtype=np.float64)
            else:
                values[key] = float(parser.parse_number(context_msg=context))

        parser.parse_comma_separated_list(parser.Delimiter.BRACES, parse_entry, " (state values)")
        return cls.create(properties={"values": state_values_attr(values)}, attributes=parse_attr_dict(parser))


StateValue = float | np.ndarray
"""A scheduler-level state value: a number, or a vector of numbers (e.g. one per tenant)."""


def _value_of(attr: Attribute) -> StateValue:
    if type(attr) is BytesAttr:  # a vector: its float64 bytes (one attribute, not one per entry)
        return np.frombuffer(attr.data, dtype=np.float64).copy()
    return attr.value.data  # type: ignore[attr-defined]


_DECODED: dict[int, tuple[DictionaryAttr, dict[str, StateValue], bool]] = {}


def _decoded(attr: DictionaryAttr) -> tuple[DictionaryAttr, dict[str, StateValue], bool]:
    """A state dictionary's (attr, decoded values, any vector), decoded once per attribute."""
    hit = _DECODED.get(id(attr))
    if hit is None or hit[0] is not attr:
        values = {k: _value_of(v) for k, v in attr.data.items()}
        hit = (attr, values, any(type(v) is np.ndarray for v in values.values()))
        if len(_DECODED) >= 4096:
            _DECODED.clear()
        _DECODED[id(attr)] = hit  # holds `attr`: its id is not reused while the entry lives
    return hit


def decoded_state_values(attr: DictionaryAttr) -> dict[str, StateValue]:
    """A state dictionary's values, decoded once per attribute (most steps carry the last step's
    attribute again, and several passes read it per step). Read-only for scalars; vectors come
    back as fresh copies, as `_value_of` gives them."""
    hit = _decoded(attr)
    if hit[2]:
        return {k: v.copy() if type(v) is np.ndarray else v for k, v in hit[1].items()}
    return hit[1]


def decoded_state_value(attr: DictionaryAttr, name: str) -> StateValue | None:
    """One value of a state dictionary (None: it has none), from its decoded values
    (`decoded_state_values`) without writing its entries: a vector comes back a fresh copy."""
    value = _decoded(attr)[1].get(name)
    return value.copy() if type(value) is np.ndarray else value


def _number_text(value: StateValue) -> str:
    if isinstance(value, np.ndarray):
        return "[" + ", ".join(repr(float(v)) for v in value) + "]"
    return repr(float(value))


_STATE_ATTRS: dict[tuple, DictionaryAttr] = {}


def _key_part(value: StateValue | list | tuple) -> float | bytes:
    """A state value as a hashable cache key: a float, or a vector's float64 bytes (exact types
    first: this runs for every value of every `sched.set_state` a step writes)."""
    kind = type(value)
    if kind is float:
        return value  # type: ignore[return-value]
    if kind is np.ndarray or kind is list or kind is tuple or isinstance(value, np.ndarray):
        return np.asarray(value, dtype=np.float64).tobytes()
    return float(value)  # type: ignore[arg-type]


class _LazyStateEntries(immutabledict):
    """A state dictionary's `{name = value : f64}` entries, written only when something asks for
    them (printing, equality, verification), as `ColumnsAttr.of_matrix` writes its bytes: the
    passes read the decoded values registered at creation (`decoded_state_values`), and a ratio
    that moves every step (SGLang's new_token_ratio) would otherwise cost a FloatAttr and an
    immutabledict per write. `_key` holds the values as `state_values_attr`'s key parts.
    (xDSL's DictionaryAttr is final; its entries mapping is what can be lazy.)"""

    @property
    def _dict(self) -> dict[str, Attribute]:  # type: ignore[override]
        entries = self.__dict__.get("_entries")
        if entries is None:
            entries = self.__dict__["_entries"] = {
                k: BytesAttr(v) if type(v) is bytes else _float_attr(v) for k, v in self.__dict__["_key"]}
        return entries

    @_dict.setter
    def _dict(self, value: dict[str, Attribute]) -> None:
        self.__dict__["_entries"] = value


def state_values_attr(values: Mapping[str, StateValue]) -> DictionaryAttr:
    """A cached `{name = value : f64}` dictionary (most steps repeat the last values); a vector
    value is kept as the bytes of a float64 array (building one FloatAttr per entry costs
    microseconds each: a 64-tenant vector would cost more than the rest of the step). Its
    entries are written lazily (`_LazyStateEntries`); its decoded values are registered now,
    so the passes that read it never decode it."""
    try:  # scalars only (the usual case): the items are the key
        key = tuple(values.items())
        attr = _STATE_ATTRS.get(key)
        if attr is not None:
            return attr
        if not all(type(v) is float for _, v in key):
            raise TypeError  # ints, numpy scalars: normalised below, so equal states share one key
    except TypeError:  # a vector (unhashable) or a value to normalise
        key = tuple((k, _key_part(v)) for k, v in values.items())
        attr = _STATE_ATTRS.get(key)
        if attr is not None:
            return attr
    entries = object.__new__(_LazyStateEntries)
    entries.__dict__["_key"] = key
    entries.__dict__["_hash"] = None
    attr = object.__new__(DictionaryAttr)
    object.__setattr__(attr, "data", entries)
    if len(_STATE_ATTRS) < 4096:
        _STATE_ATTRS[key] = attr
    vectors = any(type(v) is bytes for _, v in key)
    decoded = ({k: np.frombuffer(v, dtype=np.float64).copy() if type(v) is bytes else v for k, v in key} if vectors
               else dict(key))
    if len(_DECODED) >= 4096:
        _DECODED.clear()
    _DECODED[id(attr)] = (attr, decoded, vectors)
    return attr


def _dictionary(entries: dict[str, Attribute]) -> DictionaryAttr:
    """A DictionaryAttr of attributes known to be valid, built without xDSL's checks (the state
    dictionary changes every step while a ratio moves: its construction is on the hot path)."""
    attr = object.__new__(DictionaryAttr)
    object.__setattr__(attr, "data", immutabledict(entries))
    return attr


_FLOAT_ATTRS: dict[float, FloatAttr] = {}


def _float_attr(value: float) -> FloatAttr:
    """One `value : f64` attribute per number (counters and flags repeat across steps even when
    the dictionary around them, with a ratio that moves every step, does not)."""
    attr = _FLOAT_ATTRS.get(value)
    if attr is None:  # FloatAttr(value, f64) without its checks (~0.7 µs instead of ~6): equal, same hash
        attr = object.__new__(FloatAttr)
        data = object.__new__(FloatData)
        object.__setattr__(data, "data", float(value))
        object.__setattr__(attr, "value", data)
        object.__setattr__(attr, "type", f64)
        if len(_FLOAT_ATTRS) < 65536:
            _FLOAT_ATTRS[value] = attr
    return attr


@irdl_op_definition
class StateOp(_StateValuesOp):
    """The scheduler-level state passes declared (`schedir.ir.state`), as it stands at the start
    of the step; the first op of a step whose pipeline declares any.

        sched.state {new_token_ratio = 0.7}
    """

    name = "sched.state"


@irdl_op_definition
class SetStateOp(_StateValuesOp):
    """New values for scheduler-level state, kept from the next step on (a later write wins).
    Each name must be one the step's `sched.state` lists.

        sched.set_state {new_token_ratio = 0.6986}
    """

    name = "sched.set_state"

    def verify_(self) -> None:
        super().verify_()
        block = self.parent_block()
        declared: set[str] = set()
        if block is not None:
            for op in block.ops:
                if isinstance(op, StateOp):
                    declared.update(op.values.data)
        unknown = sorted(set(self.values.data) - declared)
        if unknown:
            raise VerifyException(f"sched.set_state: {', '.join(unknown)} is not scheduler state of this step "
                                  f"(its sched.state lists: {', '.join(sorted(declared)) or 'nothing'})")


Sched = Dialect("sched", [StepOp, YieldOp, StateOp, SetStateOp], [])

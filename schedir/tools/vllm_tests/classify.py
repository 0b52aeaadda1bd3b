"""Give each failing vLLM scheduler test a one-line reason, from the failure itself.

A test of vLLM's scheduler may use only the engine-facing contract (`SchedulerInterface` and the
`running` / `waiting` / `requests` views), or it may reach into vLLM's implementation
(`scheduler.kv_cache_manager`, private methods, fields it sets on an `object.__new__` instance).
An adapter that implements the contract on another runtime must pass the first kind; the second
kind fails by construction and only needs naming. The category comes from the recorded failure:
the exception type, the attribute an `AttributeError` names and who owns it, where it was raised,
and the failing statement of the test (which scheduler attributes it reads). Whatever is none of
the known kinds is "interface/views behaviour": a real bug in the class under test.

`reach()` is the static companion: which non-interface scheduler attributes a test function (and
the module helpers it calls) touches at all. It says which tests *should* pass on any correct
implementation of the contract.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

INTERFACE_BUG = "interface/views behaviour"
"""The category of a failure the class under test is to blame for."""

MIXED_PREFIX = "contract check fails in a test that also uses"
"""The category prefix of a failure on the contract in a test that elsewhere reaches internals: maybe a bug."""

VIEWS = frozenset({"running", "waiting", "requests"})
"""Scheduler attributes the tests read as views of the request state (lists/dict of vLLM `Request`)."""

SET_BY_HELPERS = frozenset({"use_v2_model_runner"})
"""Attributes vLLM's `create_scheduler` itself sets on any scheduler it builds."""

CONNECTORS = frozenset({"connector", "ec_connector"})
"""Read by vLLM's engine core directly, outside the interface."""

SCHEDULER_NAME = re.compile(r"^(scheduler|sched|async_scheduler|.*_scheduler)$")
"""Variable names the tests bind a scheduler to."""

_FALLBACK_INTERFACE = frozenset(
    {
        "schedule", "get_grammar_bitmask", "update_from_output", "update_draft_token_ids",
        "update_draft_token_ids_in_output", "add_request", "finish_requests", "get_num_unfinished_requests",
        "has_unfinished_requests", "has_finished_requests", "has_requests", "pause_state", "set_pause_state",
        "reset_prefix_cache", "reset_encoder_cache", "get_request_counts", "get_kv_cache_usage", "make_stats",
        "shutdown", "get_kv_connector", "get_ec_connector", "get_kv_event_publisher_config",
    }
)  # fmt: skip


@cache
def interface_names() -> frozenset[str]:
    """Public members of vLLM's `SchedulerInterface`, read from its source (importing vLLM takes ~10 s)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return _FALLBACK_INTERFACE
    path = Path(next(iter(spec.submodule_search_locations))) / "v1" / "core" / "sched" / "interface.py"
    if not path.exists():
        return _FALLBACK_INTERFACE
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == "SchedulerInterface":
            return frozenset(
                n.name
                for n in node.body
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and not n.name.startswith("_")
            )
    return _FALLBACK_INTERFACE


def contract_names() -> frozenset[str]:
    """What a test may touch on a scheduler and still test only the contract."""
    return interface_names() | VIEWS | SET_BY_HELPERS


def _scheduler_attrs(tree: ast.AST) -> list[tuple[str, bool]]:
    """(attribute, called) for each `<scheduler var>.<attr>` in `tree`, plus setattr/patch.object strings."""
    out: list[tuple[str, bool]] = []
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and SCHEDULER_NAME.match(node.value.id):
            out.append((node.attr, id(node) in called))
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            fn = ast.unparse(node.func)
            first, second = node.args[0], node.args[1]
            if (
                fn.split(".")[-1] in {"object", "setattr", "getattr"}
                and isinstance(first, ast.Name)
                and SCHEDULER_NAME.match(first.id)
                and isinstance(second, ast.Constant)
                and isinstance(second.value, str)
            ):
                out.append((second.value, False))
    return out


def reaches(attrs: list[tuple[str, bool]]) -> list[str]:
    """The non-contract scheduler attributes among `attrs`, first-seen order, as `scheduler.x` (`x()` if called)."""
    ok = contract_names()
    return list(dict.fromkeys(f"scheduler.{a}" + ("()" if c else "") for a, c in attrs if a not in ok))


@cache
def _module_functions(path: str) -> dict[str, ast.FunctionDef]:
    tree = ast.parse(Path(path).read_text())
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def reach(path: str | Path, function: str) -> dict[str, Any]:
    """Static reach of test `function` in `path`: non-contract scheduler attributes, `object.__new__(…Scheduler)`.

    Follows calls to helper functions defined in the same module, transitively.
    """
    funcs = _module_functions(str(path))
    todo, seen = [function], set()
    attrs: list[tuple[str, bool]] = []
    new_instance = False
    while todo:
        name = todo.pop()
        if name in seen or name not in funcs:
            continue
        seen.add(name)
        fn = funcs[name]
        attrs += _scheduler_attrs(fn)
        for node in ast.walk(fn):
            if isinstance(node, ast.Call):
                if isinstance(node.func, ast.Name):
                    todo.append(node.func.id)
                if (
                    ast.unparse(node.func) == "object.__new__"
                    and node.args
                    and ast.unparse(node.args[0]).endswith("Scheduler")
                ):
                    new_instance = True  # a scheduler built without __init__, its fields set by hand
    return {"internals": reaches(attrs), "object_new": new_instance}


def _internal_kind(attr: str, called: bool = False) -> str:
    """A category for reaching scheduler attribute `attr` (not in the contract); `called`: it was called."""
    if attr == "kv_cache_manager":
        return "reaches kv_cache_manager internals (`scheduler.kv_cache_manager.…`)"
    if attr == "encoder_cache_manager":
        return "reaches encoder_cache_manager internals (`scheduler.encoder_cache_manager.…`)"
    if attr in CONNECTORS:
        return f"reaches the KV/EC connector (`scheduler.{attr}`)"
    if attr.startswith("_"):
        return f"calls private method `{attr}`" if called else f"uses private attribute `{attr}`"
    if called:
        return f"calls scheduler method `{attr}` (outside SchedulerInterface)"
    return f"uses scheduler attribute `{attr}` (outside SchedulerInterface)"


_MODEL_ID = re.compile(r"Invalid repository ID or local directory specified: '([^']+)'")
_FIXTURE = re.compile(r"fixture '([^']+)' not found")
_STARTUP_REFUSAL = re.compile(r"does not support (.+?) yet")
_REFUSED = re.compile(r"not supported|does not support|unsupported|refus", re.IGNORECASE)


def category(rec: Mapping[str, Any], static: Mapping[str, Any] | None = None) -> str:
    """One-line reason for a failed test record (see `plugin._failure` for its fields)."""
    msg = str(rec.get("message", ""))
    exc = str(rec.get("exc_type", ""))
    if m := _FIXTURE.search(msg):
        return f"test setup: fixture `{m.group(1)}` missing offline"
    if m := _MODEL_ID.search(msg):
        model = m.group(1)
        kind = "multimodal model" if any(k in model.lower() for k in ("llava", "vl", "vision")) else "model"
        return f"needs {kind} download (`{model}`)"
    if "class under test not provided" in msg:
        return f"class under test not provided ({msg.split(': ', 2)[1].split(' (')[0]})"
    if m := _STARTUP_REFUSAL.search(msg):
        return f"refused by the adapter at start-up: {m.group(1)}"
    if static and static.get("object_new"):
        return "builds the scheduler with object.__new__ and sets vLLM's private fields"
    stmt = str(rec.get("test_statement", ""))
    try:
        used = _scheduler_attrs(ast.parse(stmt)) if stmt else []
    except SyntaxError:
        used = []
    # An AttributeError on the scheduler itself names what the test (or vLLM code it calls) reached for.
    if exc.endswith("AttributeError") and rec.get("owner_is_scheduler") and rec.get("attr"):
        attr = str(rec["attr"])
        if attr not in contract_names():
            return _internal_kind(attr, any(a == attr and c for a, c in used))
    # Whatever the failing statement itself reads off the scheduler beyond the contract.
    ok = contract_names()
    inside = [(a, c) for a, c in used if a not in ok]
    if inside:
        return _internal_kind(*inside[0])
    if rec.get("raised_in") == "schedir" and _REFUSED.search(msg):
        return f"refused by the adapter: {msg.splitlines()[0].split(';')[0][:120]}"
    if rec.get("refusals"):
        return f"refused by the adapter per request: {rec['refusals'][0]}"
    if static and static.get("internals"):
        return f"{MIXED_PREFIX} `{static['internals'][0]}`"
    return INTERFACE_BUG


def detail(rec: Mapping[str, Any]) -> str:
    """A short human description of the failure (exception, message head, where)."""
    exc = str(rec.get("exc_type", "?")).rsplit(".", 1)[-1]
    head = " ".join(str(rec.get("message", "")).split())[:160]
    where = rec.get("test_frame", "")
    return f"{exc}: {head}" + (f"  [{where}]" if where else "")

"""pytest plugin: run vLLM's scheduler tests against other classes and record every outcome.

Loaded with `-p schedir.tools.vllm_tests.plugin` in the subprocess `runner.py` starts. vLLM's
test helpers (`create_scheduler` in `tests/v1/core/utils.py`, the `Scheduler(...)` calls in
`test_scheduler.py`) look the names `Scheduler` / `AsyncScheduler` up in their own module at
call time, so rebinding those module globals in every `tests.*` module swaps the class without
touching vLLM's files. Modules a test imports lazily are rebound before each test as well.

Each test phase appends one JSON line to `--schedir-records`: the outcome and, for a failure,
what the classifier needs (exception type, the attribute an `AttributeError` names and whether
its owner is the scheduler, where the exception was raised, the failing statement in the test).
`--noconftest` drops vLLM's root conftest (it imports extras), and with it the `caplog_vllm`
fixture; an equivalent is defined here.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

_STATE: dict[str, Any] = {}
"""Plugin state: targets, stock classes, records file, constructed-instance ids of the running test."""

STOCK = {
    "Scheduler": "vllm.v1.core.sched.scheduler:Scheduler",
    "AsyncScheduler": "vllm.v1.core.sched.async_scheduler:AsyncScheduler",
}


MISSING = "class under test not provided"
"""Message head of the placeholder bound when a class under test does not exist (yet)."""


def load_class(spec: str, placeholder: bool = False) -> type:
    """`pkg.module:Name` or `pkg.module.Name` -> the class.

    With `placeholder`, a class that does not exist becomes one whose construction fails with
    `MISSING`: its tests then fail, by name, instead of silently running vLLM's own class.
    """
    module, sep, name = spec.partition(":")
    if not sep:
        module, _, name = spec.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        if not placeholder:
            raise
        why = f"{MISSING}: {spec} ({type(e).__name__}: {e})"

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError(why)

        return type(f"Missing{name}", (), {"__init__": __init__, "__doc__": why})


REFUSAL_LOGGERS = ("schedir", "vllm")
_REFUSAL = re.compile(r"request \S+ refused: (.+)")


class _Refusals(logging.Handler):
    """Collects the adapter's per-request refusals ("request X refused: why") during one test."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = _REFUSAL.search(record.getMessage())
        if m and len(self.seen) < 5:
            self.seen.append(m.group(1).strip())


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("schedir", "run vLLM's scheduler tests against another class")
    group.addoption("--schedir-scheduler", default=STOCK["Scheduler"], help="class bound to `Scheduler`")
    group.addoption(
        "--schedir-async-scheduler", default=STOCK["AsyncScheduler"], help="class bound to `AsyncScheduler`"
    )
    group.addoption("--schedir-records", default=None, help="JSON-lines file for per-phase outcomes")


def _wrap_init(cls: type, targets: tuple[type, ...], seen: set[int]) -> Any:
    """Make `cls.__init__` note which instances of a target class get built (returns the undo)."""
    had_own = "__init__" in cls.__dict__
    original = cls.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if type(self) in targets:
            seen.add(id(self))
        original(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[misc]

    def undo() -> None:
        if had_own:
            cls.__init__ = original  # type: ignore[misc]
        else:
            del cls.__init__

    return undo


def pytest_configure(config: pytest.Config) -> None:
    records = config.getoption("--schedir-records")
    stock = {k: load_class(v) for k, v in STOCK.items()}
    try:
        sync = load_class(config.getoption("--schedir-scheduler"))
    except (ImportError, AttributeError) as e:
        raise pytest.UsageError(
            f"cannot load {config.getoption('--schedir-scheduler')}: {type(e).__name__}: {e}"
        ) from e
    targets = {
        "Scheduler": sync,
        "AsyncScheduler": load_class(config.getoption("--schedir-async-scheduler"), placeholder=True),
    }
    refusals = _Refusals()
    for name in REFUSAL_LOGGERS:  # the adapter may log under vLLM's logger (it configures only `vllm`)
        logging.getLogger(name).addHandler(refusals)
    seen: set[int] = set()
    target_types = tuple(dict.fromkeys(targets.values()))
    undo = [_wrap_init(cls, target_types, seen) for cls in target_types]
    _STATE.update(
        records=Path(records) if records else None,
        stock=stock,
        targets=targets,
        target_types=target_types,
        seen=seen,
        undo=undo,
        refusals=refusals,
        tests_root=None,
    )
    for marker in ("cpu_test", "slow_test", "skip_global_cleanup", "core_model", "optional"):
        config.addinivalue_line("markers", f"{marker}: vLLM test marker (registered by schedir's plugin)")
    if _STATE["records"] is not None:
        _STATE["records"].write_text("")
        _write({"kind": "config", "targets": {k: _describe(v) for k, v in targets.items()}})


def _describe(cls: type) -> str:
    if (cls.__doc__ or "").startswith(MISSING):
        return f"(missing: {cls.__doc__.split(': ', 1)[1].split(' (')[0]})"
    return f"{cls.__module__}.{cls.__qualname__}"


def pytest_unconfigure(config: pytest.Config) -> None:
    for undo in _STATE.get("undo", []):
        undo()
    if "refusals" in _STATE:
        for name in REFUSAL_LOGGERS:
            logging.getLogger(name).removeHandler(_STATE["refusals"])


def rebind() -> int:
    """Point every loaded `tests.*` module's `Scheduler` / `AsyncScheduler` at the classes under test."""
    n = 0
    for name, module in list(sys.modules.items()):
        if not (name == "tests" or name.startswith("tests.")) or module is None:
            continue
        for attr, stock in _STATE["stock"].items():
            if module.__dict__.get(attr) is stock and _STATE["targets"][attr] is not stock:
                setattr(module, attr, _STATE["targets"][attr])
                n += 1
    return n


def pytest_collection_finish(session: pytest.Session) -> None:
    rebind()
    tests_pkg = sys.modules.get("tests")
    if tests_pkg is not None and getattr(tests_pkg, "__file__", None):
        _STATE["tests_root"] = str(Path(tests_pkg.__file__).resolve().parent)


def pytest_runtest_setup(item: pytest.Item) -> None:
    rebind()
    _STATE["seen"].clear()
    _STATE["refusals"].seen.clear()


@pytest.fixture
def caplog_vllm(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """vLLM's logger does not propagate to the root logger caplog listens on: let it, at INFO, for one test."""
    logger = logging.getLogger("vllm")
    before = logger.propagate
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO):
            yield caplog
    finally:
        logger.propagate = before


def _where(path: str) -> str:
    """Which code a traceback frame belongs to: the vLLM tests, vLLM, schedir, or other."""
    p = str(Path(path).resolve())
    root = _STATE.get("tests_root")
    if root and p.startswith(root + os.sep):
        return "test"
    if f"{os.sep}schedir{os.sep}" in p and f"{os.sep}tools{os.sep}vllm_tests{os.sep}" not in p:
        return "schedir"
    if f"{os.sep}vllm{os.sep}" in p:
        return "vllm"
    return "other"


def _failure(excinfo: pytest.ExceptionInfo[BaseException]) -> dict[str, Any]:
    """What a failure's exception says: type, message, attribute, raising frame, failing test statement."""
    exc = excinfo.value
    info: dict[str, Any] = {
        "exc_type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc)[:2000],
    }
    if isinstance(exc, AttributeError):
        info["attr"] = getattr(exc, "name", None)
        obj = getattr(exc, "obj", None)
        if obj is not None:
            info["attr_owner"] = f"{type(obj).__module__}.{type(obj).__qualname__}"
            info["owner_is_scheduler"] = isinstance(obj, (*_STATE["target_types"], *_STATE["stock"].values()))
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        info["raised_in"] = _where(last.filename)
        info["raised_at"] = f"{last.filename}:{last.lineno} in {last.name}"
        test_idx = [i for i, f in enumerate(frames) if _where(f.filename) == "test"]
        if test_idx:
            i = test_idx[-1]
            f = frames[i]
            info["test_frame"] = f"{Path(f.filename).name}:{f.lineno} in {f.name}"
            # The whole failing statement (it may span lines): pytest's traceback entry has it.
            try:
                entry = [e for e in excinfo.traceback if str(e.path) == f.filename and e.lineno + 1 == f.lineno][-1]
                info["test_statement"] = str(entry.statement).strip()
            except Exception:  # noqa: BLE001 - the statement is a nicety; the frame line stands in
                info["test_statement"] = (f.line or "").strip()
            if i + 1 < len(frames):
                callee = frames[i + 1]
                info["test_called"] = f"{callee.name} ({_where(callee.filename)})"
    return info


def _write(record: dict[str, Any]) -> None:
    path = _STATE.get("records")
    if path is not None:
        with path.open("a") as out:
            out.write(json.dumps(record) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    rep: pytest.TestReport = outcome.get_result()
    record: dict[str, Any] = {
        "kind": "phase",
        "nodeid": rep.nodeid,
        "when": rep.when,
        "outcome": rep.outcome,
        "constructed": len(_STATE["seen"]),
    }
    if _STATE["refusals"].seen:
        record["refusals"] = list(_STATE["refusals"].seen)
    if rep.failed:
        if call.excinfo is not None:
            record.update(_failure(call.excinfo))
        else:
            record.update(exc_type="unknown", message=str(rep.longrepr)[:2000])
        if call.excinfo is not None and rep.when == "setup":
            record["message"] = str(rep.longrepr)[-2000:]
    elif rep.skipped and isinstance(rep.longrepr, tuple):
        record["message"] = str(rep.longrepr[2])
    _write(record)

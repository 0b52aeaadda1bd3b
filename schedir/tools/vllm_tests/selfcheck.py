"""Deliberately broken scheduler classes that validate the classifier (`--scheduler selfcheck`).

They are vLLM's own classes, except that (1) test code sees only the contract: any other
attribute read from a `tests.*` module raises `AttributeError`, as it would on an adapter
that implements `SchedulerInterface` on another runtime; and (2) `get_num_unfinished_requests()`
answers one too many to test code, a planted interface bug. A correct classifier files (1)'s failures
under the internal they reach and (2)'s under "interface/views behaviour".
"""

from __future__ import annotations

import sys
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler as _StockAsync
from vllm.v1.core.sched.scheduler import Scheduler as _StockScheduler

from schedir.tools.vllm_tests.classify import contract_names

_CONTRACT = contract_names()


class _ContractOnly:
    """Hide every non-contract attribute from the vLLM test modules (not from vLLM's own code)."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("__") and name not in _CONTRACT:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller == "tests" or caller.startswith("tests."):
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self)
        return object.__getattribute__(self, name)

    def get_num_unfinished_requests(self) -> int:
        n = super().get_num_unfinished_requests()  # type: ignore[misc]
        caller = sys._getframe(1).f_globals.get("__name__", "")
        return n + 1 if caller.startswith("tests.") else n  # the planted bug, seen by test code only


class Scheduler(_ContractOnly, _StockScheduler):
    """vLLM's Scheduler behind the contract, with an off-by-one `get_num_unfinished_requests`."""


class AsyncScheduler(_ContractOnly, _StockAsync):
    """vLLM's AsyncScheduler behind the contract, with an off-by-one `get_num_unfinished_requests`."""

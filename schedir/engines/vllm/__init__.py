"""schedir inside vLLM 0.32: the `scheduler_cls` plug-in.

    LLM(..., scheduler_cls="schedir.engines.vllm.Scheduler")
    python -m vllm.entrypoints.openai.api_server ... --scheduler-cls schedir.engines.vllm.Scheduler

The pipeline is the `vllm` preset unless `additional_config={"schedir_pipeline": ...}` or
$SCHEDIR_PIPELINE names another preset or pass list. vLLM is imported only when the class
is first used, so `import schedir.engines.vllm` stays cheap without vLLM.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Scheduler"]


def __getattr__(name: str) -> Any:
    if name == "Scheduler":
        from schedir.engines.vllm.scheduler import Scheduler

        return Scheduler
    raise AttributeError(f"module 'schedir.engines.vllm' has no attribute '{name}'")

"""schedir inside vLLM 0.32: the `scheduler_cls` plug-in.

    LLM(..., scheduler_cls="schedir.engines.vllm.Scheduler")
    python -m vllm.entrypoints.openai.api_server ... --scheduler-cls schedir.engines.vllm.Scheduler

With async scheduling on (`async_scheduling=True`), `Scheduler` builds its `AsyncScheduler`
subclass, as vLLM picks its own AsyncScheduler: decodes are scheduled ahead of their sampled
tokens (output placeholders). `AsyncScheduler` can also be named directly.

The pipeline is the `vllm` preset unless `additional_config={"schedir_pipeline": ...}` or
$SCHEDIR_PIPELINE names another preset or pass list. vLLM is imported only when the class
is first used, so `import schedir.engines.vllm` stays cheap without vLLM.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AsyncScheduler", "Scheduler"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from schedir.engines.vllm import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module 'schedir.engines.vllm' has no attribute '{name}'")

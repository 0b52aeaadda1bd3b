"""Parity harness: run another engine's scheduler beside schedir's on one trace and compare
every step. A measuring tool, not an adapter (adapters live in `schedir.engines`).

`harness` holds the engine-independent part (trace, step record, loop, comparison);
`vllm_driver` imports vLLM lazily, so importing this package stays cheap without it.
"""

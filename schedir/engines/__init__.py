"""Engine adapters: schedir inside a serving engine (`schedir.engines.vllm` for vLLM 0.32).

Each adapter imports its engine lazily, so importing this package stays cheap without it.
The parity harness that runs an engine's own scheduler beside schedir's is a measuring
tool and lives in `schedir.tools.parity`.
"""

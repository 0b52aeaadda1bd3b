"""Drivers that run other serving engines' schedulers beside schedir's.

`parity` holds the engine-independent part (trace, step record, loop, comparison);
`vllm_driver` imports vLLM lazily, so importing this package stays cheap without it.
"""

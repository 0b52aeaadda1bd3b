"""schedir's decisions in the shape SGLang's model side consumes (issue 16).

`sglang_batch(scheduler, output)` lowers one step to a `ScheduleBatch`-shaped record: forward
mode, request pool indices, sequence, prefix and extend lengths, and the KV slots of the new
tokens (`out_cache_loc`). The `sglang` scheduling preset itself is not built yet.
"""

from __future__ import annotations

from schedir.engines.sglang.batch import EXTEND_FIRST, ForwardMode, SGLangBatch, sglang_batch

__all__ = ["EXTEND_FIRST", "ForwardMode", "SGLangBatch", "sglang_batch"]

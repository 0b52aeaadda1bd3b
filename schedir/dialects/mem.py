"""The `mem` dialect: KV-cache block effects of a step, as counts per request.

Concrete block ids are the lowering's job (against the real pool); the IR says
how many blocks each request gains, loses, shares or moves, so verification can
check conservation (allocated <= free + freed) without the pool.

    mem.match %w {id = [11, 12], hit = [256, 0]}      // prefix-cache hit tokens
    mem.share %a {id = [11], blocks = [16]}            // reuse cached blocks
    mem.alloc %a {id = [11, 12], blocks = [2, 3]}      // fresh blocks
    mem.evict 4                                        // cached-free blocks dropped
    mem.free %p {id = [9], blocks = [7]}

`mem.pool` (schedir/dialects/pool.py) carries the pool itself for policies that
decide block by block, such as the `vllm` preset.
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, IntegerAttr, i64
from xdsl.ir import Dialect
from xdsl.irdl import IRDLOperation, irdl_op_definition, operand_def, prop_def
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from schedir.dialects.base import OverSetOp, RequestSetType, parse_attr_dict, print_attr_dict
from schedir.dialects.columns import ColumnsAttr
from schedir.dialects.pool import PoolOp


class _BlockEffect(OverSetOp):
    """An op giving each request of its set a number of blocks."""

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = ("id", "blocks")
    NON_NEGATIVE_COLUMNS: ClassVar[tuple[str, ...]] = ("blocks",)

    def verify_(self) -> None:
        self.verify_columns()
        self.verify_subset_of(self.operands[0])


@irdl_op_definition
class MatchOp(OverSetOp):
    """Prefix-cache hits: tokens of each request whose KV is already cached (full blocks).

        mem.match %w {id = [11, 12], hit = [256, 0]}
    """

    name = "mem.match"
    input = operand_def(RequestSetType)
    columns = prop_def(ColumnsAttr)

    REQUIRED_COLUMNS: ClassVar[tuple[str, ...]] = ("id", "hit")
    NON_NEGATIVE_COLUMNS: ClassVar[tuple[str, ...]] = ("hit", "cached_free")

    def verify_(self) -> None:
        self.verify_columns()
        self.verify_subset_of(self.input)


@irdl_op_definition
class AllocOp(_BlockEffect):
    """Fresh blocks taken from the free pool for each request.

        mem.alloc %a {id = [12], blocks = [3]}
    """

    name = "mem.alloc"
    input = operand_def(RequestSetType)
    columns = prop_def(ColumnsAttr)


@irdl_op_definition
class FreeOp(_BlockEffect):
    """Blocks a request gives back (finished or preempted by recompute).

        mem.free %p {id = [9], blocks = [7]}
    """

    name = "mem.free"
    input = operand_def(RequestSetType)
    columns = prop_def(ColumnsAttr)


@irdl_op_definition
class ShareOp(_BlockEffect):
    """Cached blocks a request reuses (prefix hit): ref counts rise, no new KV is computed.

    `revived` counts those among them that sat in the free queue (ref count 0)
    and so leave it: they consume free blocks like an allocation does.

        mem.share %a {id = [11], blocks = [16], revived = [4]}
    """

    name = "mem.share"
    input = operand_def(RequestSetType)
    columns = prop_def(ColumnsAttr)

    NON_NEGATIVE_COLUMNS: ClassVar[tuple[str, ...]] = ("blocks", "revived")

    def verify_(self) -> None:
        super().verify_()
        if self.columns.has("revived") and len(self):
            over = self.ids[self.col("revived") > self.col("blocks")]
            if over.size:
                raise VerifyException(f"mem.share: revived > blocks for request(s) {over.tolist()}")


@irdl_op_definition
class SwapOutOp(_BlockEffect):
    """Blocks copied to host memory and freed on the device (preemption by swap).

        mem.swap_out %p {id = [9], blocks = [7]}
    """

    name = "mem.swap_out"
    input = operand_def(RequestSetType)
    columns = prop_def(ColumnsAttr)


@irdl_op_definition
class SwapInOp(_BlockEffect):
    """Blocks allocated on the device and filled from host memory (resuming a swapped request).

        mem.swap_in %s {id = [9], blocks = [7]}
    """

    name = "mem.swap_in"
    input = operand_def(RequestSetType)
    columns = prop_def(ColumnsAttr)


@irdl_op_definition
class CopyOp(_BlockEffect):
    """Copy-on-write: shared blocks a request must copy before writing into them.

        mem.copy %a {id = [11], blocks = [1]}
    """

    name = "mem.copy"
    input = operand_def(RequestSetType)
    columns = prop_def(ColumnsAttr)


@irdl_op_definition
class EvictOp(IRDLOperation):
    """Cached-free blocks whose cached content is dropped so they can be reused.

        mem.evict 4
    """

    name = "mem.evict"
    blocks = prop_def(IntegerAttr[I64])

    @property
    def count(self) -> int:
        return self.blocks.value.data

    def verify_(self) -> None:
        if self.count < 0:
            raise VerifyException(f"mem.evict: block count {self.count} is negative")

    def print(self, printer: Printer) -> None:
        printer.print_string(f" {self.count}")
        print_attr_dict(printer, self)

    @classmethod
    def parse(cls, parser: Parser) -> EvictOp:
        at = parser._current_token.span
        count = parser.parse_integer(allow_boolean=False, context_msg=" (blocks evicted)")
        if not -(2**63) <= count < 2**63:
            parser.raise_error(f"{count} does not fit in int64 (blocks evicted)", at)
        return cls.create(properties={"blocks": IntegerAttr(count, i64)}, attributes=parse_attr_dict(parser))


BLOCK_EFFECTS = (AllocOp, FreeOp, ShareOp, SwapOutOp, SwapInOp, CopyOp)

Mem = Dialect(
    "mem",
    [MatchOp, AllocOp, FreeOp, ShareOp, EvictOp, SwapOutOp, SwapInOp, CopyOp, PoolOp],
    [],
)

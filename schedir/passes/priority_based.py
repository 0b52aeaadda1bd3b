"""priority-based: the seed's PriorityBased pass — most urgent first, then first come."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from schedir.passes.order_priority import OrderPriority


@dataclass(frozen=True)
class PriorityBased(OrderPriority):
    """Order a queue by priority (lower value more urgent), ties by arrival (the seed's PriorityBased).

    The seed's rule is `order-priority`'s, so this is that pass under the seed's name: seed
    pipelines (`with-all-passes`) read as the seed wrote them, and it can follow another order
    pass (the sort is stable: requests equal on priority and arrival keep the earlier order).
    """

    name: ClassVar[str] = "priority-based"

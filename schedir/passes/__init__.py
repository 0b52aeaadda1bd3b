"""Every built-in pass, by name. `register_pass` adds a user's pass to the same table."""

from __future__ import annotations

from schedir.ir.pass_base import StepPass
from schedir.passes.admit_greedy import AdmitGreedy
from schedir.passes.mlfq_account import MlfqAccount
from schedir.passes.mlfq_levels import MlfqLevels
from schedir.passes.mlfq_order import MlfqOrder
from schedir.passes.mlfq_swap_in import MlfqSwapIn
from schedir.passes.orca_admit import OrcaAdmit
from schedir.passes.order_decodes_first import OrderDecodesFirst
from schedir.passes.order_fcfs import OrderFcfs
from schedir.passes.order_priority import OrderPriority
from schedir.passes.order_slo import OrderSlo
from schedir.passes.order_vllm import OrderVllm
from schedir.passes.reject_oversized import RejectOversized
from schedir.passes.sarathi_budget import SarathiBudget
from schedir.passes.schedule_running import ScheduleRunning
from schedir.passes.verify_step import VerifyStep
from schedir.passes.vtc_account import VtcAccount
from schedir.passes.vtc_order import VtcOrder
from schedir.passes.vllm_admit import VllmAdmit
from schedir.passes.vllm_schedule_running import VllmScheduleRunning

PASSES: dict[str, type[StepPass]] = {}


def register_pass(cls: type[StepPass]) -> type[StepPass]:
    """Make a pass known to pipelines and to `schedir passes` (usable as a decorator)."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    existing = PASSES.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"a pass named '{cls.name}' is already registered ({existing.__qualname__})")
    PASSES[cls.name] = cls
    return cls


for _cls in (RejectOversized, OrderFcfs, OrderPriority, ScheduleRunning, AdmitGreedy, VerifyStep, OrderVllm,
             VllmScheduleRunning, VllmAdmit, OrcaAdmit, MlfqLevels, MlfqOrder, MlfqSwapIn, MlfqAccount,
             OrderSlo, SarathiBudget, OrderDecodesFirst, VtcOrder, VtcAccount):
    register_pass(_cls)

# Routing passes (cluster dialect): run on a cluster.route_step.
from schedir.passes.pd_disaggregate import PdDisaggregate  # noqa: E402
from schedir.passes.replicate_hot_prefix import ReplicateHotPrefix  # noqa: E402
from schedir.passes.route_cache_aware import RouteCacheAware  # noqa: E402
from schedir.passes.route_cache_balance import RouteCacheBalance  # noqa: E402
from schedir.passes.route_least_load import RouteLeastLoad  # noqa: E402
from schedir.passes.route_round_robin import RouteRoundRobin  # noqa: E402
from schedir.passes.slo_early_reject import SloEarlyReject  # noqa: E402
from schedir.passes.topology_distance import TopologyDistance  # noqa: E402

for _cls in (RouteRoundRobin, RouteLeastLoad, RouteCacheAware, RouteCacheBalance, TopologyDistance,
             ReplicateHotPrefix, PdDisaggregate, SloEarlyReject):
    register_pass(_cls)

# The seed's four passes (issue 15).
from schedir.passes.batching_efficiency import BatchingEfficiency  # noqa: E402
from schedir.passes.memory_aware_preemption import MemoryAwarePreemption  # noqa: E402
from schedir.passes.prefix_cache_aware import PrefixCacheAware  # noqa: E402
from schedir.passes.priority_based import PriorityBased  # noqa: E402

for _cls in (PrefixCacheAware, PriorityBased, BatchingEfficiency, MemoryAwarePreemption):
    register_pass(_cls)

# SGLang's scheduler (issue 16): over the radix pool (`schedir.lowering.radix_pool`).
from schedir.passes.sglang_admit import SglangAdmit  # noqa: E402
from schedir.passes.sglang_decode import SglangDecode  # noqa: E402
from schedir.passes.sglang_order import SglangOrder  # noqa: E402

for _cls in (SglangOrder, SglangAdmit, SglangDecode):
    register_pass(_cls)

# vLLM v0's scheduler (issue 15): three queues, preemption by recompute or swap to the host tier.
from schedir.passes.v0_chunked_prefills import V0ChunkedPrefills  # noqa: E402
from schedir.passes.v0_chunked_running import V0ChunkedRunning  # noqa: E402
from schedir.passes.v0_prefills import V0Prefills  # noqa: E402
from schedir.passes.v0_running import V0Running  # noqa: E402
from schedir.passes.v0_swapped import V0Swapped  # noqa: E402

from schedir.passes.order_v0_priority import OrderV0Priority  # noqa: E402
from schedir.passes.v0_priority_preemption import V0PriorityPreemption  # noqa: E402

for _cls in (V0Prefills, V0Running, V0Swapped, V0ChunkedRunning, V0ChunkedPrefills, OrderV0Priority,
             V0PriorityPreemption):
    register_pass(_cls)

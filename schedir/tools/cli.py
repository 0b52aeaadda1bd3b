"""The `schedir` command line: `schedir passes`, `schedir opt`, `schedir sim/bench/stats`.

Bad input (a file that does not parse, an unknown pass, a pipeline whose
dependencies are missing) prints one clear message and exits 2; a step that a
pass finds illegal exits 1. No traceback is ever shown for bad input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from schedir.ir.errors import (
    PassFailure,
    PipelineError,
    QueueOptionError,
    SchedirError,
    StepParseError,
    os_error_message,
)
from schedir.ir.pass_base import StepPass
from schedir.ir.pipeline import Instrumentation, PassManager, default_presets, default_registry
from schedir.ir.textio import parse_step_file, parse_step_text, print_ir
from schedir.tools.sim_commands import add_commands as add_sim_commands

EXIT_OK, EXIT_ILLEGAL, EXIT_BAD_INPUT = 0, 1, 2
# the example pipeline `schedir opt --help` shows (tested: it runs on every example step)
HELP_PIPELINE = "reject-oversized,order-fcfs,schedule-running,admit-greedy{chunk=false}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own usage errors exit 2 too
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"schedir: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="schedir", description="A scheduler IR for LLM serving engines.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    sub.add_parser("passes", help="list every pass with its options, requires and provides, and the presets")

    opt = sub.add_parser("opt", help="parse a step, run a pipeline over it, print the result")
    opt.add_argument("input", help="a step IR file, or - for standard input")
    opt.add_argument("-p", "--passes", default="", metavar="PIPELINE",
                     help=f'comma-separated passes with options, e.g. "{HELP_PIPELINE}", or a preset (base, vllm, ...)')
    opt.add_argument("--print-ir-after-all", action="store_true", help="print the IR after every pass (to stderr)")
    opt.add_argument("--dump-dir", type=Path, help="write the IR after every pass to DIR, one file per pass")
    opt.add_argument("--dot-dir", type=Path, help="write a Graphviz DOT (and SVG when `dot` is installed) per pass")
    opt.add_argument("--no-svg", action="store_true", help="with --dot-dir, write DOT only")
    opt.add_argument("--no-verify-each", action="store_true", help="do not verify the IR after every pass")
    opt.add_argument("--generic", action="store_true", help="print the generic (MLIR) form")
    opt.add_argument("--timing", action="store_true", help="print each pass's time to stderr")
    opt.add_argument("-o", "--output", type=Path, help="write the result here instead of stdout")
    add_sim_commands(sub)
    return parser


def _declares_by_default(cls: type, declaration: str) -> bool:
    """Whether the pass, with its default options, answers True to `declaration` (steady decode
    steps, running steps; a pass with required options, or a routing pass, says nothing here)."""
    try:
        return bool(getattr(cls(), declaration, lambda: False)())
    except (TypeError, ValueError):
        return False


def cmd_passes(out: TextIO) -> int:
    registry = default_registry()
    for name in sorted(registry):
        cls = registry[name]
        out.write(f"{name}\n    {cls.summary()}\n")
        out.write(f"    options:     {cls.options_text() or '-'}\n")
        out.write(f"    requires:    {', '.join(sorted(cls.requires)) or '-'}\n")
        out.write(f"    provides:    {', '.join(sorted(cls.provides)) or '-'}\n")
        if cls.invalidates:
            out.write(f"    invalidates: {', '.join(sorted(cls.invalidates))}\n")
        for state in (*cls.request_state, *cls.scheduler_state):
            out.write(f"    state:       {state.describe()}\n")
        if _declares_by_default(cls, "decodes_steadily"):
            says = []
            if cls.steady_state is not StepPass.steady_state:
                says.append("the state it writes then")
            if cls.steady_order is not StepPass.steady_order:
                says.append("the batch order")
            out.write("    steady:      declared: in a steady decode step it decides nothing or the steady decision"
                      + (f" (it says {' and '.join(says)})" if says else "") + "\n")
            if cls.steady_swapped:
                out.write("    swapped:     its steady answers hold with requests swapped out (a pipeline whose "
                          "passes all say so takes steady steps then)\n")
            if cls.steady_reads is not None:
                out.write("    held:        its steady answers are asked again only when the queues"
                          + (f", the request state or one of {', '.join(sorted(cls.steady_reads))}"
                             if cls.steady_reads else " or the request state") + " change\n")
        if _declares_by_default(cls, "decides_running_steps"):
            out.write("    running:     declared: in a running step (nobody admissible waiting) it decides "
                      + ("the running queue alone\n" if cls.decide_running is not StepPass.decide_running
                         else "nothing\n"))
        keyed = cls.waiting_rank is not StepPass.waiting_rank
        columns = cls.rank_columns is not StepPass.rank_columns
        if keyed or columns:  # (an order whose head admission walks under a long queue: writing-a-pass.md)
            out.write("    rank:        declared: " + ("its key" if keyed else "")
                      + (" and " if keyed and columns else "")
                      + ("its key's columns (composing with other orders)" if columns else "") + "\n")
        if _declares_by_default(cls, "decides_array_steps"):
            out.write("    arrays:      declared: it decides an IR step over arrays as over its IR "
                      "(a pipeline whose passes all say so builds no IR ops for its steps)\n")
    out.write("\npresets\n")
    for name, spec in sorted(default_presets().items()):
        out.write(f"    {name}: {spec}\n")
    return EXIT_OK


def cmd_opt(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.input == "-":
        stream = getattr(sys.stdin, "buffer", None)
        raw = stream.read() if stream is not None else sys.stdin.read()
        data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as bad:
            line = data[: bad.start].count(b"\n") + 1
            raise StepParseError(f"<stdin>:{line}: not UTF-8 text (byte {data[bad.start]:#04x})") from None
        module = parse_step_text(text, "<stdin>")
    else:
        module = parse_step_file(args.input)
    instrument = None
    if args.print_ir_after_all or args.dump_dir or args.dot_dir:
        instrument = Instrumentation(
            print_ir_after_all=err if args.print_ir_after_all else None,
            dump_dir=args.dump_dir,
            dot_dir=args.dot_dir,
            svg=False if args.no_svg else None,
        )
    manager = PassManager.parse(args.passes, verify_each=not args.no_verify_each, instrument=instrument)
    if manager.passes:
        try:
            manager.run(module)
        except QueueOptionError as e:  # refused on this input's queues: say which file
            raise QueueOptionError(f"{'<stdin>' if args.input == '-' else args.input}: {e}") from None
    text = print_ir(module, generic=args.generic)
    if args.output:
        args.output.write_text(text)
    else:
        out.write(text)
    if instrument is not None and instrument.svg_skipped:
        from schedir.ir.dot import svg_skipped_note

        err.write(f"schedir: {svg_skipped_note(args.dot_dir)}\n")
    if args.timing:
        err.writelines(f"{timing.name:24s} {timing.seconds * 1e6:10.1f} us\n" for timing in manager.timings)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out, err = sys.stdout, sys.stderr
    try:
        if args.command == "passes":
            return cmd_passes(out)
        if args.command in ("sim", "bench", "stats"):
            return run_sim_command(args, err)
        return cmd_opt(args, out, err)
    except (StepParseError, PipelineError) as e:
        err.write(f"schedir: error: {e}\n")
        return EXIT_BAD_INPUT
    except PassFailure as e:
        err.write(f"schedir: error: {e}\n")
        return EXIT_ILLEGAL
    except SchedirError as e:
        err.write(f"schedir: error: {e}\n")
        return EXIT_BAD_INPUT
    except OSError as e:
        err.write(f"schedir: error: {describe_os_error(args, e)}\n")
        return EXIT_BAD_INPUT
    except RuntimeError as e:  # an external tool failed (Graphviz `dot` for --dot-dir)
        err.write(f"schedir: error: {e}\n")
        return EXIT_ILLEGAL


# the arguments that name files: (attribute, how the user wrote it, what schedir does with it)
_FILE_ARGUMENTS = (
    ("input", "", "read"), ("trace", "--trace", "read"), ("run", "", "read"), ("output", "-o", "write"),
    ("dump_dir", "--dump-dir", "write"), ("dot_dir", "--dot-dir", "write"), ("json", "--json", "write"),
    ("plots", "--plots", "write"), ("requests_csv", "--requests-csv", "write"),
)


def describe_os_error(args: argparse.Namespace, e: OSError) -> str:
    """An OSError as one line naming the argument whose file failed and why, in words."""
    if e.filename is not None:
        failed = Path(e.filename)
        for attr, flag, verb in _FILE_ARGUMENTS:
            value = getattr(args, attr, None)
            if value is None or value == "-":
                continue
            given = Path(value)
            if failed == given or failed in given.parents or given in failed.parents:
                return os_error_message(e, f"{flag} {given}".strip(), given, verb)
    return os_error_message(e)


def run_sim_command(args: argparse.Namespace, err: TextIO) -> int:
    """The simulator's commands: bad input (trace rows, names, options) is a ValueError -> exit 2."""
    from rich.console import Console

    from schedir.tools.sim_commands import cmd_bench, cmd_sim, cmd_stats

    console = Console() if sys.stdout.isatty() else Console(width=200)  # files and pipes: no 80-column wrap
    command = {"sim": cmd_sim, "bench": cmd_bench, "stats": cmd_stats}[args.command]
    try:
        return command(args, console)
    except ValueError as e:
        err.write(f"schedir {args.command}: error: {e}\n")
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())

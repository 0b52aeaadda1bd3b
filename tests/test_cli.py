"""The `schedir` command line: `passes`, `opt`, exit codes, messages with locations, never a traceback."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from conftest import BASE_PASSES, SMALL_STEP_TEXT

from schedir.ir.pass_base import StepPass
from schedir.ir.step import Step
from schedir.ir.textio import parse_step_file, parse_step_text, print_ir
from schedir.passes import PASSES, register_pass
from schedir.passes.presets import PRESETS
from schedir.tools.cli import EXIT_BAD_INPUT, EXIT_ILLEGAL, EXIT_OK, main

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def step_file(tmp_path: Path) -> Path:
    path = tmp_path / "step.mlir"
    path.write_text(SMALL_STEP_TEXT)
    return path


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err and "Traceback" not in out
    return code, out, err


def base_result() -> str:
    from schedir.ir.pipeline import PassManager

    module = parse_step_text(SMALL_STEP_TEXT)
    PassManager.parse("base").run(module)
    return print_ir(module)


# ---------------------------------------------------------------- passes
def test_passes_lists_every_pass_and_preset(capsys):
    code, out, err = run_cli(capsys, "passes")
    assert code == EXIT_OK and err == ""
    for name, cls in PASSES.items():
        block = re.search(rf"^{re.escape(name)}\n((?:    .*\n)+)", out, re.MULTILINE)
        assert block, f"pass {name} not listed"
        body = block.group(1)
        assert cls.summary() in body
        options = re.search(r"options: +(.*)", body).group(1)
        for opt, _type, _default in cls.options():
            assert f"{opt}: " in options
        requires = re.search(r"requires: +(.*)", body).group(1)
        provides = re.search(r"provides: +(.*)", body).group(1)
        assert requires == (", ".join(sorted(cls.requires)) or "-")
        assert provides == (", ".join(sorted(cls.provides)) or "-")
    assert "\npresets\n" in out
    for name, spec in PRESETS.items():
        assert f"    {name}: {spec}\n" in out


def test_passes_shows_option_defaults(capsys):
    _, out, _ = run_cli(capsys, "passes")
    assert "chunk: bool = true, stop-at-first: bool = false, queue: str = waiting" in out
    assert "requires:    order, running-scheduled" in out


def test_passes_lists_a_registered_pass_with_invalidates(capsys, tmp_registry):
    @dataclass(frozen=True)
    class Scramble(StepPass):
        """Scramble the queue (test only)."""

        name: ClassVar[str] = "scramble-test"
        requires: ClassVar[frozenset[str]] = frozenset({"admissible"})
        invalidates: ClassVar[frozenset[str]] = frozenset({"order"})
        seed: int = 7

        def run(self, step: Step) -> None:
            pass

    register_pass(Scramble)
    assert "scramble-test" in tmp_registry
    _, out, _ = run_cli(capsys, "passes")
    assert "scramble-test\n    Scramble the queue (test only).\n" in out
    assert (
        "    options:     seed: int = 7\n"
        "    requires:    admissible\n"
        "    provides:    -\n"
        "    invalidates: order\n"
    ) in out


def test_passes_show_which_declare_steady_steps(capsys):
    _, out, _ = run_cli(capsys, "passes")
    text = out.split("\npresets\n")[0]
    sections: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if line and not line.startswith(" "):
            name = line
            sections[name] = ""
        elif name is not None:
            sections[name] += line + "\n"
    for steady in ("vllm-schedule-running", "vllm-admit", "schedule-running", "admit-greedy", "verify-step",
                   "sarathi-budget", "order-fcfs", "sglang-decode", "vtc-account"):
        assert "steady:" in sections[steady], steady
    assert "it says the state it writes then and the batch order" in sections["sglang-decode"]
    assert "it says the state it writes then)" in sections["vtc-account"]
    for writes in ("mlfq-account", "v0-running", "v0-chunked-running", "memory-aware-preemption"):
        assert "it says the state it writes then)" in sections[writes], writes
    assert "it says the state it writes then and the batch order" in sections["mlfq-order"]
    for judged in ("mlfq-order", "mlfq-levels", "mlfq-swap-in", "admit-greedy"):  # fastserve's, with jobs parked
        assert "swapped:     its steady answers hold with requests swapped out" in sections[judged], judged
    assert "swapped:" not in sections["v0-swapped"]  # v0 swaps a request back whenever it fits
    for not_steady in ("route-round-robin", "route-cache-aware"):  # routing passes: no engine step
        assert "steady:" not in sections[not_steady], not_steady
    assert "running:     declared: in a running step (nobody admissible waiting) it decides the running queue alone" \
        in sections["vllm-schedule-running"]
    for nothing in ("order-vllm", "reject-oversized", "vllm-admit"):
        assert "it decides nothing" in sections[nothing], nothing
    assert "running:     declared" not in sections["schedule-running"]
    for arrays in ("reject-oversized", "mlfq-levels", "mlfq-order", "schedule-running", "mlfq-swap-in", "admit-greedy",
                   "mlfq-account", "verify-step", "order-fcfs", "order-priority", "orca-admit",
                   "prefix-cache-aware"):
        assert "arrays:      declared: it decides an IR step over arrays" in sections[arrays], arrays
    for ir_only in ("vllm-admit", "sglang-admit", "vtc-order"):
        assert "arrays:" not in sections[ir_only], ir_only
    # answers held over a run of steps, and what asks them again
    assert "held:        its steady answers are asked again only when the queues, the request state or one of " \
        "sglang_batch_full, sglang_batch_size, sglang_chunked change" in sections["sglang-decode"]
    assert "asked again only when the queues or the request state change" in sections["reject-oversized"]
    # VTC's lift and charge are transitions (`Lift`, `Charge`): held too
    for vtc in ("vtc-account", "vtc-order"):
        assert "asked again only when the queues or the request state change" in sections[vtc], vtc
    assert "held:" not in sections["order-slo"]  # it judges the queue against the clock every step
    # ranks: a key admission walks the head of; columns compose several orders (with-all-passes)
    for composing in ("order-fcfs", "order-priority", "priority-based", "prefix-cache-aware"):
        assert "rank:        declared: its key and its key's columns" in sections[composing], composing
    assert "rank:        declared: its key's columns (composing" in sections["batching-efficiency"]
    assert "rank:        declared: its key\n" in sections["vtc-order"]
    assert "rank:" not in sections["admit-greedy"]


# ---------------------------------------------------------------- opt
def test_opt_file(capsys, step_file):
    code, out, err = run_cli(capsys, "opt", str(step_file), "-p", "base")
    assert code == EXIT_OK and err == ""
    assert out == base_result()


def test_opt_without_passes_prints_the_input(capsys, step_file):
    code, out, _ = run_cli(capsys, "opt", str(step_file))
    assert code == EXIT_OK
    assert out == print_ir(parse_step_text(SMALL_STEP_TEXT))


def test_opt_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(SMALL_STEP_TEXT))
    code, out, err = run_cli(capsys, "opt", "-", "-p", ",".join(BASE_PASSES))
    assert code == EXIT_OK and err == ""
    assert out == base_result()


def test_opt_output_file(capsys, step_file, tmp_path):
    target = tmp_path / "out.mlir"
    code, out, _ = run_cli(capsys, "opt", str(step_file), "-p", "base", "-o", str(target))
    assert code == EXIT_OK and out == ""
    assert target.read_text() == base_result()


def test_opt_generic_output_reparses(capsys, step_file):
    code, out, _ = run_cli(capsys, "opt", str(step_file), "-p", "base", "--generic")
    assert code == EXIT_OK
    assert '"sched.step"()' in out and '"req.queue"()' in out
    assert print_ir(parse_step_text(out, "generic")) == base_result()


def test_opt_print_ir_after_all(capsys, step_file):
    code, out, err = run_cli(capsys, "opt", str(step_file), "-p", "base", "--print-ir-after-all")
    assert code == EXIT_OK
    assert re.findall(r"// -----// IR after (\S+) //----- //", err) == ["input", *BASE_PASSES]
    assert out == base_result()


def test_opt_dump_dir(capsys, step_file, tmp_path):
    dumps = tmp_path / "dumps"
    code, _, _ = run_cli(capsys, "opt", str(step_file), "-p", "base", "--dump-dir", str(dumps))
    assert code == EXIT_OK
    expected = ["00-input.mlir"] + [f"{i:02d}-{name}.mlir" for i, name in enumerate(BASE_PASSES, 1)]
    assert sorted(p.name for p in dumps.iterdir()) == expected
    for path in dumps.iterdir():
        parse_step_file(path)  # each dump parses and verifies
    assert (dumps / expected[-1]).read_text() == base_result()


@pytest.mark.parametrize("no_svg", [False, True])
def test_opt_dot_dir(capsys, step_file, tmp_path, no_svg):
    dots = tmp_path / "dots"
    argv = ["opt", str(step_file), "-p", "base", "--dot-dir", str(dots)] + (["--no-svg"] if no_svg else [])
    code, _, _ = run_cli(capsys, *argv)
    assert code == EXIT_OK
    stems = ["00-input"] + [f"{i:02d}-{name}" for i, name in enumerate(BASE_PASSES, 1)]
    assert sorted(p.name for p in dots.glob("*.dot")) == [f"{s}.dot" for s in stems]
    svgs = sorted(p.name for p in dots.glob("*.svg"))
    assert svgs == ([f"{s}.svg" for s in stems] if shutil.which("dot") and not no_svg else [])


def test_opt_timing(capsys, step_file):
    code, out, err = run_cli(capsys, "opt", str(step_file), "-p", "base", "--timing")
    assert code == EXIT_OK
    lines = err.splitlines()
    assert [line.split()[0] for line in lines] == list(BASE_PASSES)
    assert all(re.fullmatch(r"\S+ +[0-9.]+ us", line) for line in lines)
    assert out == base_result()


def test_opt_no_verify_each_same_result(capsys, step_file):
    code, out, _ = run_cli(capsys, "opt", str(step_file), "-p", "base", "--no-verify-each")
    assert code == EXIT_OK and out == base_result()


# ---------------------------------------------------------------- bad input: exit 2
def test_parse_error_has_location(capsys, tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text(SMALL_STEP_TEXT.replace("max_seqs = 4,", "max_seqs = ,"))
    code, out, err = run_cli(capsys, "opt", str(bad), "-p", "base")
    assert code == EXIT_BAD_INPUT and out == ""
    assert err.startswith("schedir: error: ")
    assert re.search(rf"{re.escape(str(bad))}:1:\d+", err)
    assert "max_seqs" in err


def test_parse_error_on_stdin_names_stdin(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(SMALL_STEP_TEXT.replace("req.queue waiting", "req.queue waiting {")))
    code, _, err = run_cli(capsys, "opt", "-")
    assert code == EXIT_BAD_INPUT
    assert re.search(r"<stdin>:3:\d+", err)


def test_verifier_error_has_location(capsys, tmp_path):
    bad = tmp_path / "invalid.mlir"
    bad.write_text(SMALL_STEP_TEXT.replace("computed = [0, 0]", "computed = [0, 99]"))
    code, out, err = run_cli(capsys, "opt", str(bad), "-p", "base")
    assert code == EXIT_BAD_INPUT and out == ""
    assert f"{bad}:3:3: req.queue waiting" in err
    assert "[4]" in err


def test_step_fact_verifier_error_has_location(capsys, tmp_path):
    bad = tmp_path / "invalid.mlir"
    bad.write_text(SMALL_STEP_TEXT.replace("free_blocks = 10,", "free_blocks = 30,"))
    code, _, err = run_cli(capsys, "opt", str(bad))
    assert code == EXIT_BAD_INPUT
    assert f"{bad}:1:1: sched.step" in err and "free_blocks = 30 exceeds total_blocks = 20" in err


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("order-fcf", "unknown pass 'order-fcf'; did you mean 'order-fcfs'?"),
        ("order-fcfs{queue=1}", "pass 'order-fcfs': bad option"),
        ("order-fcfs{bogus=1}", "pass 'order-fcfs': bad option"),
        ("order-fcfs{", "cannot parse pipeline 'order-fcfs{'"),
        ("schedule-running,admit-greedy", "pass 'admit-greedy' (#2) requires 'order', which no earlier pass provides"),
        ("admit-greedy,order-fcfs,schedule-running", "move it before 'admit-greedy'"),
        ("base{chunk=true}", "preset 'base' takes no options"),
    ],
)
def test_bad_pipeline(capsys, step_file, spec, expected):
    code, out, err = run_cli(capsys, "opt", str(step_file), "-p", spec)
    assert code == EXIT_BAD_INPUT and out == ""
    assert err.startswith("schedir: error: ") and expected in err


def test_missing_file(capsys, tmp_path):
    missing = tmp_path / "nope.mlir"
    code, out, err = run_cli(capsys, "opt", str(missing), "-p", "base")
    assert code == EXIT_BAD_INPUT and out == ""
    assert f"{missing}: cannot read" in err


def test_empty_module(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("builtin.module {\n}\n"))
    code, _, err = run_cli(capsys, "opt", "-", "-p", "base")
    assert code == EXIT_BAD_INPUT and "no sched.step" in err


def test_usage_errors_exit_2(capsys):
    for argv in ([], ["opt"], ["frobnicate"], ["opt", "x.mlir", "--bogus-flag"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == EXIT_BAD_INPUT
        assert "Traceback" not in capsys.readouterr().err


# ---------------------------------------------------------------- illegal step: exit 1
def test_verify_step_failure_exits_1(capsys, step_file):
    code, out, err = run_cli(capsys, "opt", str(step_file), "-p", "order-fcfs,verify-step")
    assert code == EXIT_ILLEGAL and out == ""
    assert "pass 'verify-step': step 3 is illegal" in err
    assert "request(s) [1, 2] of queue 'running' have no decision" in err


def test_verify_step_incomplete_is_fine(capsys, step_file):
    code, _, _ = run_cli(capsys, "opt", str(step_file), "-p", "order-fcfs,verify-step{complete=false}")
    assert code == EXIT_OK


# ---------------------------------------------------------------- as a real process
def _subprocess(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "schedir", *argv],
        input=stdin, capture_output=True, text=True, cwd=REPO, timeout=300, check=False,
    )


def test_subprocess_opt_stdin():
    proc = _subprocess("opt", "-", "-p", "base", stdin=SMALL_STEP_TEXT)
    assert proc.returncode == EXIT_OK, proc.stderr
    assert proc.stdout == base_result()


def test_subprocess_errors_have_no_traceback(tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text(SMALL_STEP_TEXT.replace("sched.yield", "sched.yield %nope"))
    proc = _subprocess("opt", str(bad), "-p", "base")
    assert proc.returncode == EXIT_BAD_INPUT
    assert "Traceback" not in proc.stderr
    assert re.search(rf"{re.escape(str(bad))}:\d+:\d+", proc.stderr)

    proc = _subprocess("opt", "-", "-p", "verify-step", stdin=SMALL_STEP_TEXT)
    assert proc.returncode == EXIT_ILLEGAL
    assert "Traceback" not in proc.stderr and "pass 'verify-step'" in proc.stderr


def test_subprocess_passes():
    proc = _subprocess("passes")
    assert proc.returncode == EXIT_OK
    for name in [*PASSES, *PRESETS]:
        assert name in proc.stdout


# ---------------------------------------------------------------- input that is not step IR text
@pytest.mark.parametrize("text", ["`x", '"unterminated', "\n\n  #"])
def test_lex_error_on_the_first_token_is_a_step_parse_error(text):
    from schedir.ir.errors import StepParseError

    with pytest.raises(StepParseError, match=r"^f\.mlir:\d+:\d+"):
        parse_step_text(text, "f.mlir")


def test_cli_lex_error_on_the_first_token_exits_2(capsys, tmp_path):
    bad = tmp_path / "lex.mlir"
    bad.write_text("\n\n  `x\n")
    code, out, err = run_cli(capsys, "opt", str(bad))
    assert code == EXIT_BAD_INPUT and out == ""
    assert f"{bad}:3:3" in err


def test_cli_non_utf8_file_exits_2(capsys, tmp_path):
    bad = tmp_path / "binary.mlir"
    bad.write_bytes(b"\xff\xfe\x00 not text")
    code, out, err = run_cli(capsys, "opt", str(bad))
    assert code == EXIT_BAD_INPUT and out == ""
    assert str(bad) in err


def test_cli_non_utf8_stdin_exits_2(capsys, monkeypatch):
    import io
    import sys

    class FakeStdin:
        buffer = io.BytesIO(b"sched.step 1 {\n \xff}")

    monkeypatch.setattr(sys, "stdin", FakeStdin())
    code, out, err = run_cli(capsys, "opt", "-")
    assert code == EXIT_BAD_INPUT and out == ""
    assert "<stdin>:2: not UTF-8" in err


# ---------------------------------------------------------------- a newcomer's first contact (issue 18)
EXAMPLES = sorted((REPO / "examples").glob("*.mlir"))
NO_REPR = re.compile(r"<class |\[Errno|Errno \d|given \(|Traceback")


def test_opt_help_example_pipeline_runs(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per option: the example unwrapped, as a user copies it
    with pytest.raises(SystemExit) as info:
        main(["opt", "--help"])
    assert info.value.code == 0
    shown = re.search(r'e\.g\. "([^"]+)"', capsys.readouterr().out)
    assert shown is not None, "opt --help shows no example pipeline"
    for example in EXAMPLES:
        code, out, err = run_cli(capsys, "opt", str(example), "-p", shown.group(1))
        assert code == EXIT_OK, f"{example.name}: {err}"
        assert "req.schedule" in out


@pytest.mark.parametrize(
    ("spec", "option", "queues"),
    [
        ("reject-oversized,order-fcfs{queue=waitingx},schedule-running,admit-greedy", "queue=waitingx", "running, waiting"),
        ("reject-oversized{queue=wating},order-fcfs,schedule-running,admit-greedy", "queue=wating", "running, waiting"),
        ("reject-oversized,order-fcfs,schedule-running{queue=runing},admit-greedy", "queue=runing", "running, waiting"),
        ("reject-oversized,order-fcfs,schedule-running,admit-greedy{running=run}", "running=run", "running, waiting"),
        ("reject-oversized,order-priority{queue=swapped},schedule-running,admit-greedy", "queue=swapped", "running, waiting"),
    ],
)
def test_queue_option_naming_no_queue_of_the_step_is_an_error(capsys, step_file, spec, option, queues):
    code, out, err = run_cli(capsys, "opt", str(step_file), "-p", spec)
    assert code == EXIT_BAD_INPUT and out == ""
    pass_name = next(p.split("{")[0] for p in spec.split(",") if option.split("=")[1] + "}" in p)
    assert err.startswith(f"schedir: error: {step_file}: step 3: pass '{pass_name}': option {option} ")
    assert f"(its queues: {queues})" in err
    assert len(err.splitlines()) == 1


def test_queue_option_naming_a_queue_of_the_step_runs(capsys, step_file):
    code, out, _ = run_cli(capsys, "opt", str(step_file), "-p", "order-fcfs{queue=running}")
    assert code == EXIT_OK and 'req.sort %run by ["arrival"]' in out


def test_dot_dir_without_graphviz_writes_dot_and_says_svg_skipped(capsys, monkeypatch, step_file, tmp_path):
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name == "dot" else real_which(name, *a, **k))
    dots = tmp_path / "dots"
    code, _, err = run_cli(capsys, "opt", str(step_file), "-p", "base", "--dot-dir", str(dots))
    assert code == EXIT_OK
    assert len(list(dots.glob("*.dot"))) == 1 + len(BASE_PASSES) and not list(dots.glob("*.svg"))
    notes = [line for line in err.splitlines() if "SVG" in line]
    assert len(notes) == 1, err  # once, not once per pass
    assert f"wrote the .dot files to {dots} but no SVGs: Graphviz's `dot` is not installed" in notes[0]
    assert "apt-get install graphviz" in notes[0]
    # --no-svg asked for no SVG: nothing to say
    code, _, err = run_cli(capsys, "opt", str(step_file), "-p", "base", "--dot-dir", str(tmp_path / "d2"), "--no-svg")
    assert code == EXIT_OK and "SVG" not in err


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("admit-greedy{chunk=maybe}", "pass 'admit-greedy': bad option chunk=maybe: expected true or false"),
        ("admit-greedy{chunk=1}", "pass 'admit-greedy': bad option chunk=1: expected true or false"),
        ("admit-greedy{chunk}", "pass 'admit-greedy': bad option chunk=: expected one value, true or false"),
        ("vllm-admit{long-prefill=1.5}", "pass 'vllm-admit': bad option long-prefill=1.5: expected an integer"),
        ("order-fcfs{queue=1}", "pass 'order-fcfs': bad option queue=1: expected a queue name, such as waiting"),
        ("admit-greedy{chnk=true}", "pass 'admit-greedy': bad option 'chnk': no such option; did you mean 'chunk'?"),
    ],
)
def test_bad_option_speaks_the_pipeline_language(capsys, step_file, spec, expected):
    code, out, err = run_cli(capsys, "opt", str(step_file), "-p", spec)
    assert code == EXIT_BAD_INPUT and out == ""
    assert err.startswith(f"schedir: error: {expected} (options: ")
    assert not NO_REPR.search(err), err
    assert "= True" not in err and "= False" not in err  # options as written: true / false


def test_file_errors_name_the_file_and_say_why(capsys, step_file, tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [
        (["opt", str(tmp_path / "missing.mlir")], f"{tmp_path / 'missing.mlir'}: cannot read: no such file or folder"),
        (["opt", str(tmp_path)], f"{tmp_path}: cannot read: is a folder, not a file"),
        (["opt", str(step_file), "-p", "base", "--dump-dir", str(a_file / "d")],
         f"--dump-dir {a_file / 'd'}: cannot write: a part of that path is a file, not a folder"),
        (["opt", str(step_file), "-p", "base", "--dot-dir", str(a_file / "d"), "--no-svg"],
         f"--dot-dir {a_file / 'd'}: cannot write: a part of that path is a file, not a folder"),
        (["opt", str(step_file), "-o", str(tmp_path / "no" / "out.mlir")],
         f"-o {tmp_path / 'no' / 'out.mlir'}: cannot write: its folder does not exist"),
    ]
    for argv, expected in cases:
        code, out, err = run_cli(capsys, *argv)
        assert code == EXIT_BAD_INPUT and out == "", argv
        assert err == f"schedir: error: {expected}\n", argv
        assert not NO_REPR.search(err), err


def test_pass_manager_is_public():
    import schedir
    from schedir.ir.pipeline import Instrumentation, PassManager

    assert schedir.PassManager is PassManager and schedir.Instrumentation is Instrumentation
    assert {"PassManager", "Instrumentation"} <= set(schedir.__all__)
    namespace: dict[str, object] = {}
    exec("from schedir import *", namespace)  # noqa: S102 (what `import *` gives a user)
    assert namespace["PassManager"] is PassManager

"""`benchmarks/window_cost.py` runs, prints a row per preset and size, and leaves schedir as it found it."""

from __future__ import annotations

import sys
from pathlib import Path

import schedir.ir.window as window_module
from schedir.runtime.scheduler import Scheduler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import window_cost  # noqa: E402


def test_window_cost_prints_each_preset_and_restores_the_kernels(capsys) -> None:  # noqa: ANN001
    before = (Scheduler._waiting_window, window_module.head_in_rank_order)
    assert window_cost.main(["--presets", "with-all-passes,fastserve", "--sizes", "16", "--waiting", "300",
                             "--steps", "60"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [r[:2] for r in rows] == [["with-all-passes", "16"], ["fastserve", "16"], ["vllm", "16"]]
    assert all(float(r[3]) > 0 for r in rows)  # IR steps timed under the long queue
    assert float(rows[0][8]) > 0 and float(rows[0][9]) > 0  # its window (a ranked one) and kernels in it
    assert float(rows[2][8]) == 0  # vllm's admission window is no pass window
    assert (Scheduler._waiting_window, window_module.head_in_rank_order) == before

"""`python -m schedir.tools.vllm_tests`: run vLLM's scheduler tests against a class and print the tally.

Exit 0 when the tests ran (whatever their outcome: CI shows the tally), 2 when they could not
run (no vLLM, no network for the first fetch, a class that does not import), and with
`--strict` 1 when a failure is classified "interface/views behaviour".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from schedir.tools.vllm_tests import report, runner, sdist


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m schedir.tools.vllm_tests", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--scheduler",
        default="schedir",
        help="schedir (schedir.engines.vllm), stock (vLLM's own), selfcheck (deliberately broken, "
        "validates the classifier), or module:Sync[,module:Async]  [default: schedir]",
    )
    ap.add_argument("--compare", action="store_true", help="also run stock vLLM and print it side by side")
    ap.add_argument("--strict", action="store_true", help="exit 1 if any interface/views behaviour failure")
    ap.add_argument("-k", dest="select", default=None, help="pytest -k expression: run a subset")
    ap.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--refresh", action="store_true", help="fetch the sdist again even if cached")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every failure with its reason")
    args = ap.parse_args(argv)

    try:
        run = runner.run(args.scheduler, select=args.select, refresh=args.refresh)
        baseline = runner.run("stock", select=args.select) if args.compare and args.scheduler != "stock" else None
    except (runner.RunError, sdist.FetchError) as e:
        print(f"vllm_tests: could not run: {e}", file=sys.stderr)
        return 2
    print(report.render(run, baseline, verbose=args.verbose))
    if args.json is not None:
        report.to_json(run, args.json)
    if args.strict and report.bugs(run):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

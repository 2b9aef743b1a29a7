"""``hybridflow plot RUN_DIR [--out FILE]``: curves of any run that logged ``jsonl``."""

from __future__ import annotations

import argparse
import sys

from hybridflow.utils.errors import run_main
from hybridflow.view.plot import plot_run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hybridflow plot", description=__doc__)
    parser.add_argument("run_dir", help="a run directory containing metrics.jsonl")
    parser.add_argument("--out", default=None, help="PNG path (default: RUN_DIR/curves.png)")
    args = parser.parse_args(argv)
    return run_main("hybridflow plot", lambda: print(plot_run(args.run_dir, args.out)))


if __name__ == "__main__":
    sys.exit(main())

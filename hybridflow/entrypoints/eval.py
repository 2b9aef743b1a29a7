"""``hybridflow eval``: score a file of generated responses per data source (verl's ``main_eval``).

    python -m hybridflow.entrypoints.eval data.path=gen.parquet
    hybridflow eval data.path=gen.parquet custom_reward_function.path=my_score.py output_path=out.json

Prints mean@N, best@N and maj@N per data source with bootstrap error bars and writes the full
report as JSON (default: next to the input, ``<name>.eval.json``). The keys and the metrics are
described in :mod:`hybridflow.trainer.offline_eval`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from hybridflow.trainer.offline_eval import (
    evaluate,
    format_table,
    load_eval_config,
    report_path,
    write_report,
)
from hybridflow.utils.errors import run_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hybridflow eval",
        description="Score a parquet/jsonl of generated responses per data source: mean@N, best@N, maj@N with "
        "bootstrap error bars. Keys: data.path, data.response_key, reward_model.*, custom_reward_function.*, "
        "metrics.n_bootstrap / seed / confidence, output_path.",
    )
    parser.add_argument("--config", action="append", default=[], metavar="FILE", help="YAML config file (repeatable)")
    parser.add_argument("overrides", nargs="*", help="key=value, e.g. data.path=gen.parquet")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    def body() -> int:
        cfg = load_eval_config(args.config, args.overrides)
        report = evaluate(cfg)
        print(format_table(report))
        print(f"wrote {write_report(report, report_path(cfg))}")
        return 0

    return run_main("hybridflow eval", body)


if __name__ == "__main__":
    sys.exit(main())

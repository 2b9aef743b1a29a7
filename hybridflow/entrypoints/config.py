"""``python -m hybridflow.entrypoints.config [--trainer sft] [--config FILE]... [key=value ...]``: print the
resolved config as YAML (the PPO trainer's, or with ``--trainer sft`` the SFT trainer's, e.g. for verl's
``sft_trainer.yaml``).

Secrets (API keys, tokens, passwords; :mod:`hybridflow.config.secrets`) are printed as
``<redacted>``. Exit status 2 with the list of problems when the config is invalid.
"""

from __future__ import annotations

import argparse
import logging
import sys

import yaml

from hybridflow.config.build import to_dict
from hybridflow.config.errors import ConfigError
from hybridflow.config.loader import load_config
from hybridflow.config.secrets import redact
from hybridflow.config.sft_rules import load_sft_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hybridflow config",
        description="Print the fully resolved trainer config (defaults ← --config files ← overrides) as YAML.",
    )
    parser.add_argument("--trainer", choices=("ppo", "sft"), default="ppo", help="which trainer's config (default ppo)")
    parser.add_argument("--config", action="append", default=[], metavar="FILE", help="YAML config file (repeatable)")
    parser.add_argument("overrides", nargs="*", help="verl-style overrides, e.g. actor_rollout_ref.rollout.n=8")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        load = load_sft_config if args.trainer == "sft" else load_config
        cfg = load(args.config, args.overrides)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump(redact(to_dict(cfg)), sort_keys=False, allow_unicode=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

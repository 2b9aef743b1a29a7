"""verl's config files against hybridflow's loaders: key lists, load checks, default differences.

    python scripts/verl_config_keys.py --verl PATH [--ref REF]          # write the key lists
    python scripts/verl_config_keys.py --verl PATH --check              # load each file; count key fates
    python scripts/verl_config_keys.py --verl PATH --defaults           # keys whose default differs

PATH is a verl checkout folder or a bare git repository (read at ``--ref``, default HEAD). The
key lists (``tests/config/fixtures/verl/<stem>.keys``) hold only key names and structure: a
header naming the verl commit and file, then every dotted leaf key in file order. The tests
build configs from them; no value of verl's is copied.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from hybridflow.config.build import lookup
from hybridflow.config.errors import ConfigError
from hybridflow.config.loader import load_structured
from hybridflow.config.ppo import PPOConfig
from hybridflow.config.ppo_rules import finalize_ppo_config
from hybridflow.config.sft_rules import finalize_sft_config
from hybridflow.config.verl_keys import VERL_CONFIG_FILES, explain_verl_key, leaf_keys

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "config" / "fixtures" / "verl"
STATUSES = ("honoured", "moved", "renamed", "ignored", "off_only", "unknown")
# verl picks these modes by entry point (its fully_async_main / one_step_off main), not by a key
ENTRY_POINT_MODE = {
    "fully_async_ppo_trainer": ["async_training.mode=fully_async"],
    "one_step_off_ppo_trainer": ["async_training.mode=one_step_off"],
}


def git(verl: Path, *args: str) -> str:
    """Output of a read-only git command on the checkout or bare repository ``verl``."""
    where = ["--git-dir", str(verl)] if (verl / "HEAD").is_file() and (verl / "objects").is_dir() else ["-C", str(verl)]
    return subprocess.run(["git", *where, *args], check=True, capture_output=True, text=True).stdout


def read_file(verl: Path, ref: str, rel: str) -> str:
    """One file of verl: from the work tree of a checkout, else from ``ref`` of the repository."""
    if (verl / rel).is_file():
        return (verl / rel).read_text(encoding="utf-8")
    return git(verl, "show", f"{ref}:{rel}")


def commit_of(verl: Path, ref: str) -> str:
    """``<sha> (<date>)`` of ``ref``, or ``unknown`` for a folder that is not a git checkout."""
    try:
        return git(verl, "log", "-1", "--format=%H (%cs)", ref).strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown (not a git checkout)"


def write_key_lists(verl: Path, ref: str) -> None:
    """Write ``<stem>.keys`` for each of :data:`VERL_CONFIG_FILES`."""
    FIXTURES.mkdir(parents=True, exist_ok=True)
    commit = commit_of(verl, ref)
    for stem, (rel, _) in VERL_CONFIG_FILES.items():
        keys = leaf_keys(yaml.safe_load(read_file(verl, ref, rel)))
        header = [
            f"# Leaf key names of verl's {rel} at commit {commit}.",
            "# Names only (no values). Regenerate: python scripts/verl_config_keys.py --verl <verl checkout>",
        ]
        (FIXTURES / f"{stem}.keys").write_text("\n".join(header + keys) + "\n", encoding="utf-8")
        print(f"{FIXTURES / f'{stem}.keys'}: {len(keys)} keys")


def load_errors(text: str, root: type, extra: list[str]) -> tuple[list[str], list[str]]:
    """The problems of loading ``text`` (one verl file) with our loader: (key and type problems,
    cross-key rule problems of the values). Only ``trainer.device=cpu`` and ``extra`` are given besides."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False, encoding="utf-8") as handle:
        handle.write(text)
    try:
        cfg: Any = load_structured(root, [handle.name], ["trainer.device=cpu", *extra])
    except ConfigError as err:
        return err.problems, []
    finally:
        Path(handle.name).unlink()
    try:
        (finalize_ppo_config if root is PPOConfig else finalize_sft_config)(cfg)
    except ConfigError as err:
        return [], err.problems
    return [], []


def check(verl: Path, ref: str) -> int:
    """Print per file the fate counts of its keys, the key errors of loading it and the value-rule
    errors (verl values our rules refuse); 1 if any key is unknown or any key error."""
    logging.disable(logging.WARNING)  # the ignored-key lines; the counts say the same
    failed = 0
    for stem, (rel, root) in VERL_CONFIG_FILES.items():
        text = read_file(verl, ref, rel)
        counts: Counter[str] = Counter(explain_verl_key(key, root).status for key in leaf_keys(yaml.safe_load(text)))
        errors, rule_errors = load_errors(text, root, ENTRY_POINT_MODE.get(stem, []))
        failed += len(errors) + counts["unknown"]
        row = " ".join(f"{status}={counts[status]}" for status in STATUSES)
        print(f"{stem}: {row} errors={len(errors)} value_rule_errors={len(rule_errors)}")
        for problem in errors + rule_errors:
            print(f"    {problem}")
    return 1 if failed else 0


def resolved_tree(text: str) -> dict[str, Any]:
    """verl's file with the interpolations that resolve within it resolved (others left as text)."""
    tree = yaml.safe_load(text)
    conf = OmegaConf.create(tree)
    out: dict[str, Any] = {}
    for key in leaf_keys(tree):
        try:
            out[key] = OmegaConf.select(conf, key, throw_on_resolution_failure=True)
        except Exception:  # noqa: BLE001 - any failed resolution keeps verl's text
            out[key] = OmegaConf.select(conf, key, throw_on_resolution_failure=False)
    return {k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in out.items()}


def default_differences(verl: Path, ref: str) -> list[tuple[str, str, Any, Any]]:
    """(verl key, our key, verl's value, our default) where both have the key and the values differ."""
    rows: list[tuple[str, str, Any, Any]] = []
    seen: set[tuple[str, str]] = set()
    for rel, root in VERL_CONFIG_FILES.values():
        for key, value in resolved_tree(read_file(verl, ref, rel)).items():
            fate = explain_verl_key(key, root)
            if fate.status not in ("honoured", "moved", "renamed") or fate.reason or (root.__name__, fate.ours) in seen:
                continue
            seen.add((root.__name__, fate.ours))
            ours = _plain(lookup(root(), fate.ours))
            if value != ours and not (isinstance(value, str) and "${" in value):
                rows.append((key, f"{root.__name__}:{fate.ours}", value, ours))
    return rows


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verl", type=Path, required=True, help="verl checkout folder or bare git repository")
    parser.add_argument("--ref", default="HEAD", help="commit to read from a git repository (default HEAD)")
    parser.add_argument("--check", action="store_true", help="load each file with hybridflow; print counts")
    parser.add_argument("--defaults", action="store_true", help="print keys whose default differs from verl's")
    args = parser.parse_args(argv)
    if args.check:
        return check(args.verl, args.ref)
    if args.defaults:
        for key, ours_key, verl_value, ours in default_differences(args.verl, args.ref):
            print(f"{key}\t{ours_key}\tverl={verl_value!r}\tours={ours!r}")
        return 0
    write_key_lists(args.verl, args.ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())

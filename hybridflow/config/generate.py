"""Regenerate the files derived from the config dataclasses.

    python -m hybridflow.config.generate          # rewrite them
    python -m hybridflow.config.generate --check  # exit 1 if any is out of date

Writes ``hybridflow/config/ppo_trainer.yaml``, ``hybridflow/config/sft_trainer.yaml`` and the
generated regions of ``docs/configuration.md``, ``docs/sft.md`` and ``docs/reward_models.md`` (between
``<!-- BEGIN GENERATED: name -->`` and ``<!-- END GENERATED: name -->``; the prose around them
is hand-written).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from hybridflow.config.ppo import PPOConfig
from hybridflow.config.render import render_defaults_yaml, render_reference_markdown, render_verl_markdown
from hybridflow.config.render_verl import render_verl_files_markdown
from hybridflow.config.rm import RMConfig
from hybridflow.config.sft import SFTConfig

CONFIG_DIR = Path(__file__).resolve().parent
PPO_YAML = CONFIG_DIR / "ppo_trainer.yaml"
DOC = CONFIG_DIR.parents[1] / "docs" / "configuration.md"
SFT_YAML = CONFIG_DIR / "sft_trainer.yaml"
SFT_DOC = CONFIG_DIR.parents[1] / "docs" / "sft.md"
RM_DOC = CONFIG_DIR.parents[1] / "docs" / "reward_models.md"

DOC_REGIONS: dict[str, Callable[[], str]] = {
    "ppo-keys": lambda: render_reference_markdown(PPOConfig),
    "verl-keys": render_verl_markdown,
    "verl-file-keys": render_verl_files_markdown,
}


SFT_DOC_REGIONS: dict[str, Callable[[], str]] = {
    "sft-keys": lambda: render_reference_markdown(SFTConfig),
}
RM_DOC_REGIONS: dict[str, Callable[[], str]] = {
    "rm-keys": lambda: render_reference_markdown(RMConfig),
}


def expected_ppo_yaml() -> str:
    return render_defaults_yaml(PPOConfig, "hybridflow PPO trainer config")


def expected_sft_yaml() -> str:
    return render_defaults_yaml(SFTConfig, "hybridflow SFT trainer config")


def fill_regions(doc: str, regions: dict[str, Callable[[], str]] = DOC_REGIONS, where: Path = DOC) -> str:
    """``doc`` with each generated region replaced by freshly rendered text."""
    for name, render in regions.items():
        pattern = re.compile(
            rf"(<!-- BEGIN GENERATED: {re.escape(name)} -->\n).*?(<!-- END GENERATED: {re.escape(name)} -->)", re.S
        )
        if not pattern.search(doc):
            raise ValueError(f"{where} lacks '<!-- BEGIN GENERATED: {name} -->' ... '<!-- END GENERATED: {name} -->'")
        body = render()

        def fill(m: re.Match[str], body: str = body) -> str:
            return f"{m.group(1)}\n{body}\n{m.group(2)}"

        doc = pattern.sub(fill, doc)
    return doc


def outdated() -> list[Path]:
    """The derived files whose content differs from what the dataclasses generate."""
    stale = []
    if not PPO_YAML.exists() or PPO_YAML.read_text(encoding="utf-8") != expected_ppo_yaml():
        stale.append(PPO_YAML)
    doc = DOC.read_text(encoding="utf-8")
    if fill_regions(doc) != doc:
        stale.append(DOC)
    if not SFT_YAML.exists() or SFT_YAML.read_text(encoding="utf-8") != expected_sft_yaml():
        stale.append(SFT_YAML)
    sft_doc = SFT_DOC.read_text(encoding="utf-8")
    if fill_regions(sft_doc, SFT_DOC_REGIONS, SFT_DOC) != sft_doc:
        stale.append(SFT_DOC)
    rm_doc = RM_DOC.read_text(encoding="utf-8")
    if fill_regions(rm_doc, RM_DOC_REGIONS, RM_DOC) != rm_doc:
        stale.append(RM_DOC)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridflow.config.generate", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report out-of-date files (exit 1 if any)")
    args = parser.parse_args(argv)
    if args.check:
        stale = outdated()
        for path in stale:
            print(f"out of date: {path} (run python -m hybridflow.config.generate)")
        return 1 if stale else 0
    PPO_YAML.write_text(expected_ppo_yaml(), encoding="utf-8")
    DOC.write_text(fill_regions(DOC.read_text(encoding="utf-8")), encoding="utf-8")
    SFT_YAML.write_text(expected_sft_yaml(), encoding="utf-8")
    SFT_DOC.write_text(fill_regions(SFT_DOC.read_text(encoding="utf-8"), SFT_DOC_REGIONS, SFT_DOC), encoding="utf-8")
    RM_DOC.write_text(fill_regions(RM_DOC.read_text(encoding="utf-8"), RM_DOC_REGIONS, RM_DOC), encoding="utf-8")
    print(f"wrote {PPO_YAML}\nwrote {DOC}\nwrote {SFT_YAML}\nwrote {SFT_DOC}\nwrote {RM_DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

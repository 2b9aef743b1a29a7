"""ppo_trainer.yaml and docs/configuration.md stay in step with the dataclasses."""

from __future__ import annotations

import re

from hybridflow.config import PPOConfig, load_config
from hybridflow.config.generate import DOC, PPO_YAML, expected_ppo_yaml, fill_regions, outdated
from hybridflow.config.render import inline_yaml, leaf_paths
from hybridflow.config.sources import read_yaml_file
from hybridflow.config.verl_compat import VERL_IGNORED_KEYS

FIX = "run `python -m hybridflow.config.generate`"


def test_defaults_yaml_is_up_to_date():
    assert PPO_YAML.read_text(encoding="utf-8") == expected_ppo_yaml(), f"ppo_trainer.yaml is stale: {FIX}"


def test_doc_tables_are_up_to_date():
    doc = DOC.read_text(encoding="utf-8")
    assert fill_regions(doc) == doc, f"docs/configuration.md is stale: {FIX}"
    assert outdated() == []


def test_doc_lists_every_key_and_every_verl_pattern():
    doc = DOC.read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", doc, flags=re.M))
    missing = [path for path in leaf_paths(PPOConfig) if path not in documented]
    assert missing == []
    for entry in VERL_IGNORED_KEYS:
        assert f"| `{entry.pattern}` |" in doc


def test_defaults_yaml_loads_back_to_the_defaults():
    assert load_config([str(PPO_YAML)]) == load_config()
    tree = read_yaml_file(PPO_YAML)
    assert tree["actor_rollout_ref"]["actor"]["optim"]["lr"] == 1.5e-5
    assert tree["actor_rollout_ref"]["actor"]["clip_ratio_low"] is None  # unresolved on purpose


def test_inline_yaml():
    assert inline_yaml(None) == "null"
    assert inline_yaml(True) == "true"
    assert inline_yaml(1e-6) == "1.0e-06"
    assert inline_yaml(("console",)) == "[console]"
    assert inline_yaml({}) == "{}"
    assert inline_yaml("text") == "text"
    assert inline_yaml("yes") == "'yes'"  # would read back as a bool unquoted

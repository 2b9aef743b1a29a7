"""No config key is accepted and then silently ignored.

Every leaf of the PPO and SFT schemas must be *read* somewhere in the package (outside the
files that declare, render and load the schema — the trainers, workers and cross-key rules all
count), or be gated by a switch that a rule refuses to turn on. Reading is found statically: the
key's name appears as an attribute (``cfg.val_only``), a keyword argument or a string in the
package. verl keys we do not honour are not in the schema at all: they are listed in
``verl_compat`` and either refused when switched on or ignored with a warning line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hybridflow.config import load_config
from hybridflow.config.ppo import PPOConfig
from hybridflow.config.sft import SFTConfig
from hybridflow.config.spec import iter_leaves

PACKAGE = Path(__file__).resolve().parents[2] / "hybridflow"
# Files that declare or process the schema generically: a name used there is not a use.
SCHEMA_FILES = {"ppo.py", "actor_rollout_ref.py", "sft.py", "spec.py", "render.py", "generate.py", "build.py",
                "coerce.py", "sources.py", "loader.py", "__init__.py", "__main__.py", "errors.py"}
# Keys that act only while a switch is on that a rule refuses to turn on (``rule_not_yet``).
GATED: dict[str, str] = {}


def _names_read() -> set[str]:
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "config" and path.name in SCHEMA_FILES:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
    return names


NAMES = _names_read()


@pytest.mark.parametrize("root", [PPOConfig, SFTConfig], ids=["ppo", "sft"])
def test_every_key_is_read_or_gated(root):
    unread = []
    for path, _, _ in iter_leaves(root):
        if any(path.startswith(prefix) for prefix in GATED):
            continue
        if path.rpartition(".")[2] not in NAMES:
            unread.append(path)
    assert unread == [], f"keys that no code reads and no rule refuses: {unread}"


@pytest.mark.parametrize(
    "override, message",
    [
        ("actor_rollout_ref.rollout.multi_turn.interaction_config_path=/x.yaml", "interactions are not implemented"),
        ("actor_rollout_ref.rollout.multi_turn.use_inference_chat_template=true", "use_inference_chat_template"),
        ("actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=disable", "only 'strict'"),
        ("+actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=2", "not supported by hybridflow"),
        ("+actor_rollout_ref.rollout.agent.custom_async_server=x", "not supported by hybridflow"),
    ],
)
def test_multi_turn_keys_not_honoured_are_refused(make_config, override, message):
    from hybridflow.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        make_config(override)
    cfg = make_config("actor_rollout_ref.rollout.multi_turn.enable=true")  # the agent loop is on
    assert cfg.actor_rollout_ref.rollout.multi_turn.enable is True
    assert load_config().actor_rollout_ref.rollout.multi_turn.enable is False


def test_the_scan_finds_a_planted_unread_key(tmp_path):
    """The check can fail: a name nothing reads is reported."""
    assert "val_only" in NAMES and "definitely_not_read_anywhere_xyz" not in NAMES

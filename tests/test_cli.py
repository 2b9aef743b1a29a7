import importlib

import pytest

from hybridflow.cli import COMMANDS, main


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in COMMANDS:
        assert f"  {name}" in out


def test_unknown_command_is_named(capsys):
    assert main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_a_main(name):
    module = importlib.import_module(COMMANDS[name][0])
    assert callable(module.main)


def test_config_subcommand_prints_resolved_yaml(capsys):
    assert main(["config", "algorithm.adv_estimator=rloo"]) == 0
    assert "adv_estimator: rloo" in capsys.readouterr().out

from __future__ import annotations

import pytest
import torch

from hybridflow.reward import NaiveRewardManager, load_custom_reward_function

SOURCE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return float(solution_str.strip() == ground_truth) + bonus

def by_length(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": len(solution_str) / 10, "length": len(solution_str)}

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(SOURCE)
    return path


def test_load_and_bind_kwargs(reward_file):
    assert load_custom_reward_function(None) is None
    fn = load_custom_reward_function(reward_file)
    assert fn("any", " yes ", "yes") == 1.0
    with_bonus = load_custom_reward_function(str(reward_file), "compute_score", {"bonus": 0.5})
    assert with_bonus("any", "no", "yes") == 0.5


def test_errors_name_file_and_function(reward_file, tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file .*missing.py"):
        load_custom_reward_function(tmp_path / "missing.py")
    with pytest.raises(AttributeError, match=r"has no function 'score_it'; callables there: by_length, compute_score"):
        load_custom_reward_function(reward_file, "score_it")
    with pytest.raises(TypeError, match="'NOT_A_FUNCTION' .* is a int, not a function"):
        load_custom_reward_function(reward_file, "NOT_A_FUNCTION")
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_here\n")
    with pytest.raises(ImportError, match="importing .*broken.py failed: ModuleNotFoundError"):
        load_custom_reward_function(broken)


def test_custom_function_in_a_manager(reward_file, make_batch, tokenizer):
    data, lengths = make_batch(["abcd", "ab"], ["x", "y"], data_sources=["anything", "else"])
    manager = NaiveRewardManager(tokenizer, compute_score=load_custom_reward_function(reward_file, "by_length"))
    reward, info = manager(data)
    # the decoded response has no eos (special tokens are skipped): lengths 4 and 2 chars
    assert torch.allclose(reward.sum(-1), torch.tensor([0.4, 0.2]))
    assert info["length"] == [4, 2]

"""The attention-kernel choice (``model.attn_implementation``) and that both kernels agree."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridflow.models import choose_attn_implementation, load_model_and_tokenizer, policy_attn_implementation
from hybridflow.models.attention import EAGER_MAX_TOKENS


@pytest.mark.parametrize(
    ("choice", "device", "max_tokens", "expected"),
    [
        ("auto", "cpu", 100, "eager"),
        ("auto", "cpu", EAGER_MAX_TOKENS, "eager"),
        ("auto", "cpu", EAGER_MAX_TOKENS + 1, "sdpa"),
        ("auto", "cpu", None, "sdpa"),  # unknown row length: keep the kernel that scales
        ("auto", "cuda", 100, "sdpa"),
        ("eager", "cuda", 4096, "eager"),
        ("sdpa", "cpu", 10, "sdpa"),
    ],
)
def test_choice(choice: str, device: str, max_tokens: int | None, expected: str) -> None:
    assert choose_attn_implementation(choice, device, max_tokens) == expected


def test_unknown_choice_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"unknown attn_implementation 'flash'; valid: auto, eager, sdpa"):
        choose_attn_implementation("flash", "cpu", 10)


def test_policy_rows_are_prompt_plus_response(make_config) -> None:
    short = make_config("data.max_prompt_length=200", "data.max_response_length=56").actor_rollout_ref
    long = make_config("data.max_prompt_length=200", "data.max_response_length=57").actor_rollout_ref
    assert policy_attn_implementation(short, "cpu") == "hybridflow_packed_eager"  # use_remove_padding (default)
    assert policy_attn_implementation(long, "cpu") == "hybridflow_packed_sdpa"
    padded = make_config("data.max_prompt_length=200", "data.max_response_length=56",
                         "actor_rollout_ref.model.use_remove_padding=false").actor_rollout_ref
    assert policy_attn_implementation(padded, "cpu") == "eager"


def test_config_value_is_checked(make_config) -> None:
    from hybridflow.config import ConfigError

    with pytest.raises(ConfigError, match="actor_rollout_ref.model.attn_implementation"):
        make_config("actor_rollout_ref.model.attn_implementation=flash")


def test_eager_and_sdpa_give_the_same_logits(tiny_model_dir: Path) -> None:
    torch.manual_seed(0)
    ids = torch.randint(3, 200, (3, 12))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding, as in rollout rows
    logits = {}
    for kernel in ("eager", "sdpa"):
        model, _ = load_model_and_tokenizer(tiny_model_dir, attn_implementation=kernel)
        assert model.config._attn_implementation == kernel
        with torch.no_grad():
            logits[kernel] = model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(logits["eager"][real], logits["sdpa"][real], atol=1e-5, rtol=1e-5)

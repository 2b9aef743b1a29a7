"""Masked statistics, response masks, log-probs and entropy (hand-computed values)."""

import math

import pytest
import torch

from hybridflow.algorithms.utils import (
    check_finite,
    compute_response_mask,
    entropy_from_logits,
    entropy_from_logits_chunked,
    get_response_mask,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
M = torch.tensor([[1, 1, 0], [0, 1, 0]])  # selects 1, 2, 5


def test_masked_sum_and_mean_by_hand():
    assert masked_sum(X, M).item() == 8.0
    assert masked_mean(X, M).item() == pytest.approx(8 / 3)
    assert masked_mean(X, M, axis=-1).tolist() == pytest.approx([1.5, 5.0])


def test_masked_mean_ignores_nan_outside_mask_and_empty_mask_is_zero():
    x = X.clone()
    x[0, 2] = float("nan")
    x[1, 0] = float("inf")
    assert masked_mean(x, M).item() == pytest.approx(8 / 3)
    assert masked_mean(x, torch.zeros_like(M)).item() == 0.0


def test_masked_var_unbiased_by_hand():
    # values 1, 2, 5: mean 8/3, Σ dev² = 78/9, unbiased var = 78/9 / 2 = 13/3
    assert masked_var(X, M).item() == pytest.approx(13 / 3, rel=1e-6)
    assert masked_var(X, M, unbiased=False).item() == pytest.approx(26 / 9, rel=1e-6)


@pytest.mark.parametrize("mask", [torch.zeros(2, 3), torch.tensor([[1.0, 0, 0], [0, 0, 0]])])
def test_masked_var_needs_two_elements(mask):
    with pytest.raises(ValueError, match="mask"):
        masked_var(X, mask)


def test_masked_whiten_by_hand():
    out = masked_whiten(X, M)
    scale = 1 / math.sqrt(13 / 3)
    assert out[1, 1].item() == pytest.approx((5 - 8 / 3) * scale, rel=1e-6)  # 1.120897
    assert out[0, 0].item() == pytest.approx((1 - 8 / 3) * scale, rel=1e-6)
    assert masked_mean(out, M).item() == pytest.approx(0.0, abs=1e-6)
    shifted = masked_whiten(X, M, shift_mean=False)
    assert shifted[1, 1].item() == pytest.approx((5 - 8 / 3) * scale + 8 / 3, rel=1e-6)


def test_masked_whiten_with_fewer_than_two_elements_is_zero():
    assert torch.equal(masked_whiten(X, torch.zeros_like(M)), torch.zeros_like(X))
    assert torch.equal(masked_whiten(X, torch.tensor([[0, 1, 0], [0, 0, 0]])), torch.zeros_like(X))


def test_get_response_mask_up_to_and_including_first_eos():
    ids = torch.tensor([[5, 2, 7, 2], [2, 3, 3, 3], [4, 4, 4, 4], [3, 9, 2, 1]])
    assert get_response_mask(ids, eos_token=2).tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 1, 0]]
    assert get_response_mask(ids, eos_token=[2, 3]).tolist() == [
        [1, 1, 0, 0],
        [1, 0, 0, 0],
        [1, 1, 1, 1],
        [1, 0, 0, 0],
    ]
    assert get_response_mask(ids, eos_token=2, dtype=torch.float32).dtype == torch.float32


def test_compute_response_mask_takes_the_response_columns():
    attention = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    responses = torch.zeros(2, 3, dtype=torch.long)
    assert compute_response_mask(responses, attention).tolist() == [[1, 1, 0], [1, 0, 0]]
    with pytest.raises(ValueError, match="columns"):
        compute_response_mask(torch.zeros(2, 7, dtype=torch.long), attention)


def test_logprobs_from_logits_with_temperature_by_hand():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # probs 1/4, 3/4
    labels = torch.tensor([[1]])
    assert logprobs_from_logits(logits, labels).item() == pytest.approx(math.log(0.75), rel=1e-6)
    # τ = 2: probs ∝ 1, √3
    expected = math.log(math.sqrt(3) / (1 + math.sqrt(3)))  # −0.455754
    assert logprobs_from_logits(logits, labels, temperature=2.0).item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        logprobs_from_logits(logits, labels, temperature=0.0)


def test_logprobs_match_log_softmax_for_bf16_and_many_rows():
    torch.manual_seed(0)
    logits = torch.randn(3, 1500, 11)  # more rows than one chunk
    labels = torch.randint(0, 11, (3, 1500))
    expected = torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(logprobs_from_logits(logits, labels), expected, atol=1e-6)
    bf16 = logprobs_from_logits(logits.bfloat16(), labels)
    assert bf16.dtype == torch.float32
    assert torch.allclose(bf16, expected, atol=5e-2)


def test_entropy_by_hand():
    assert entropy_from_logits(torch.zeros(4)).item() == pytest.approx(math.log(4), rel=1e-6)
    two = torch.tensor([0.0, math.log(3.0)])  # H = 0.25 ln 4 + 0.75 ln(4/3) = 0.562335
    assert entropy_from_logits(two).item() == pytest.approx(0.562335, rel=1e-5)
    # τ → the distribution of z/τ: z = [0, 2 ln 3], τ = 2 gives the same as `two`
    assert entropy_from_logits(two * 2, temperature=2.0).item() == pytest.approx(0.562335, rel=1e-5)


def test_chunked_entropy_equals_plain_and_is_differentiable():
    torch.manual_seed(1)
    logits = torch.randn(3, 5, 7, requires_grad=True)
    chunked = entropy_from_logits_chunked(logits, chunk_size=4)
    assert chunked.shape == (3, 5)
    assert torch.allclose(chunked, entropy_from_logits(logits), atol=1e-6)
    chunked.sum().backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_check_finite_names_the_tensor_and_respects_mask():
    x = torch.tensor([[1.0, float("nan")]])
    check_finite("x", x, torch.tensor([[1, 0]]))
    with pytest.raises(ValueError, match=r"where: x contains NaN/inf at 1 position"):
        check_finite("x", x, where="where")

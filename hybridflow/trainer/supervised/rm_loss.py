"""The Bradley–Terry reward-model objective.

Bradley & Terry (1952) model the probability that reply ``y_c`` is preferred to ``y_r`` as
``σ(r(x, y_c) − r(x, y_r))``; Ouyang et al. (2022, InstructGPT) train the reward model ``r`` by
maximising its log-likelihood over labelled pairs. Per pair::

    ℓ = −log σ(r_c − r_r) = log(1 + e^{−(r_c − r_r)})

and a mini-batch of N pairs has loss ``L = (1/N) Σ ℓ``. Each micro-batch contributes its share
``Σ_micro ℓ / N`` with the mini-batch's N, so the accumulated gradient — and the logged loss,
the sum of the shares — does not depend on how the mini-batch is split.

Both replies of a pair run through the model in the same forward pass (:func:`pair_rewards`),
as one batch of 2b sequences cut to the longest real row.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torch.distributed.fsdp import FSDPModule

from hybridflow.data.pair_dataset import (
    CHOSEN_ATTENTION_MASK,
    CHOSEN_INPUT_IDS,
    REJECTED_ATTENTION_MASK,
    REJECTED_INPUT_IDS,
)
from hybridflow.inference.sampling import NonFiniteLogitsError, nonfinite_message
from hybridflow.models.reward_model import last_token_scores
from hybridflow.trainer.supervised.sft_loss import NOT_TRAINABLE

CHOSEN_REWARDS = "chosen_rewards"
REJECTED_REWARDS = "rejected_rewards"


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Per-pair ``−log σ(r_c − r_r)`` (``logsigmoid`` keeps it finite for large margins)."""
    return -F.logsigmoid(chosen - rejected)


def pair_rewards(module: torch.nn.Module, micro: TensorDict) -> dict[str, torch.Tensor]:
    """``{"chosen_rewards": (b,), "rejected_rewards": (b,)}`` float32, read at each side's last token.

    Right padding past the micro-batch's longest side is cut first: it costs compute and
    changes nothing (real tokens never attend to later positions).
    """
    ids = torch.cat([micro[CHOSEN_INPUT_IDS], micro[REJECTED_INPUT_IDS]])
    mask = torch.cat([micro[CHOSEN_ATTENTION_MASK], micro[REJECTED_ATTENTION_MASK]])
    used = mask.bool().any(dim=0).nonzero().flatten()
    width = int(used[-1]) + 1 if used.numel() else 1
    score = sharded_last_token_scores if isinstance(module, FSDPModule) else last_token_scores
    rewards = score(module, ids[:, :width], mask[:, :width])
    bad = ~torch.isfinite(rewards)
    if bool(bad.any()):  # the head's logit is the reward: a NaN there is a broken model, not a pair to learn
        raise NonFiniteLogitsError(nonfinite_message(int(bad.sum()), bad.numel(), NOT_TRAINABLE))
    chosen, rejected = rewards.chunk(2)
    return {CHOSEN_REWARDS: chosen, REJECTED_REWARDS: rejected}


def sharded_last_token_scores(
    module: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """``last_token_scores`` for a model sharded by FSDP2, whose root weights (embeddings, final
    norm, head) are gathered only by the root module's own forward: the model is called whole.

    Its sequence-classification forward reads the head at the last token that is not
    ``config.pad_token_id``; for that call the padding gets a token id no real token of the batch
    uses (and the config names it), so that token is each row's last attended one.
    """
    config: Any = module.config  # a transformers PretrainedConfig (peft forwards the attribute)
    real = attention_mask.bool()
    used = torch.zeros(int(config.vocab_size), dtype=torch.bool)
    used[input_ids[real].cpu()] = True
    preferred = config.pad_token_id
    pad = int(preferred) if preferred is not None and not bool(used[preferred]) else int((~used).nonzero()[0])
    saved, config.pad_token_id = config.pad_token_id, pad
    try:
        out = module(
            input_ids=torch.where(real, input_ids, pad),
            attention_mask=attention_mask,
            position_ids=torch.clamp(attention_mask.long().cumsum(-1) - 1, min=0),
            use_cache=False,
        )
    finally:
        config.pad_token_id = saved
    return out.logits.float().squeeze(-1)


def rm_loss(
    outputs: dict[str, torch.Tensor], micro: TensorDict, *, batch_num_pairs: int, dp_size: int = 1
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """This micro-batch's share of the mini-batch mean loss; ``batch_num_pairs`` = N above,
    counted over all ``dp_size`` data-parallel ranks. The loss is × ``dp_size``: the ranks'
    gradients are averaged (FSDP), which takes that factor out again.

    Metrics are the micro-batch's shares of the mini-batch's mean, without that factor (summed
    over micro-batches and ranks they give the mean): ``loss``, ``accuracy`` (pairs with
    r_c > r_r) and ``margin`` (r_c − r_r).
    """
    chosen, rejected = outputs[CHOSEN_REWARDS], outputs[REJECTED_REWARDS]
    loss = bradley_terry_loss(chosen, rejected).sum() / batch_num_pairs * dp_size
    sums = pair_sums(chosen, rejected)
    return loss, {name: value / batch_num_pairs for name, value in sums.items()}


def pair_sums(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{"loss", "accuracy", "margin"}`` summed over pairs in float64, detached: averages over many
    batches (validation) are then exact sums divided by one count."""
    chosen, rejected = chosen.detach().double(), rejected.detach().double()
    return {
        "loss": bradley_terry_loss(chosen, rejected).sum(),
        "accuracy": (chosen > rejected).double().sum(),
        "margin": (chosen - rejected).sum(),
    }

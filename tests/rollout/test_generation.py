"""The sampling loop on a scripted decoder: stopping, padding, compaction, n, prompt dedup."""

from __future__ import annotations

import pytest
import torch

from hybridflow.inference.generation import generate
from hybridflow.inference.sampling import GenerationParams

EOS, PAD, FILL, VOCAB = 1, 0, 5, 8


class ScriptedDecoder:
    """Row with last prompt token ``k`` emits FILL tokens and EOS at step ``k`` (0-based).

    Logits are one-hot (value 10) so greedy and sampling agree; it records every call.
    """

    def __init__(self) -> None:
        self.tags = torch.empty(0, dtype=torch.long)
        self.step = 0
        self.prefill_rows: list[int] = []
        self.selects: list[list[int]] = []
        self.decode_rows: list[int] = []
        self.positions: list[list[int]] = []

    def _logits(self) -> torch.Tensor:
        logits = torch.zeros(self.tags.numel(), VOCAB)
        tokens = torch.where(self.tags == self.step, EOS, FILL)
        logits[torch.arange(self.tags.numel()), tokens] = 10.0
        return logits

    def prefill(self, input_ids, attention_mask, position_ids, max_len):
        self.prefill_rows.append(input_ids.shape[0])
        self.max_len = max_len
        self.tags = input_ids[:, -1].clone()
        self.step = 0
        return self._logits()

    def decode(self, tokens, positions):
        assert tokens.shape[0] == self.tags.numel()
        self.step += 1
        self.decode_rows.append(tokens.shape[0])
        self.positions.append(positions.tolist())
        return self._logits()

    def select_rows(self, index):
        self.selects.append(index.tolist())
        self.tags = self.tags[index]

    def refresh_weights(self):
        return 0

    def invalidate_weights(self):
        pass

    def release(self):
        pass


def _prompts(last_tokens, lengths):
    width = max(lengths)
    ids = torch.zeros(len(last_tokens), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (tok, length) in enumerate(zip(last_tokens, lengths)):
        ids[row, width - length :] = 7
        ids[row, -1] = tok
        mask[row, width - length :] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _run(last_tokens, lengths, steps=6, **kwargs):
    decoder = ScriptedDecoder()
    ids, mask, pos = _prompts(last_tokens, lengths)
    params = GenerationParams(max_new_tokens=steps, stop_token_ids=(EOS,), do_sample=False, **kwargs)
    return decoder, generate(decoder, ids, mask, pos, params, pad_token_id=PAD)


def test_rows_stop_at_eos_and_are_right_padded():
    decoder, out = _run([0, 2, 9, 4], [3, 1, 2, 3])
    assert out.lengths.tolist() == [1, 3, 6, 5]
    assert out.responses[0].tolist() == [EOS, PAD, PAD, PAD, PAD, PAD]
    assert out.responses[1].tolist() == [FILL, FILL, EOS, PAD, PAD, PAD]
    assert out.responses[2].tolist() == [FILL] * 6
    assert out.responses[3].tolist() == [FILL] * 4 + [EOS, PAD]
    assert (out.log_probs[0, 1:] == 0).all() and (out.log_probs[2] < 0).all()
    assert decoder.max_len == 3 + 6 - 1  # prompt width + steps − 1 columns


def test_finished_rows_are_dropped_from_the_batch():
    decoder, out = _run([0, 2, 9, 4], [3, 3, 3, 3])
    # step 0: row 0 ends (1 of 4 dead → compact); step 2: row 1 ends (1 of 3 → compact);
    # step 4: row 3 ends (1 of 2 → compact); row 2 runs to the end alone.
    assert decoder.selects == [[1, 2, 3], [1, 2], [0]]
    assert decoder.decode_rows == [3, 3, 2, 2, 1]
    assert out.lengths.tolist() == [1, 3, 6, 5]


def test_compaction_waits_for_a_quarter_of_the_rows():
    decoder, out = _run([1, 9, 10, 11, 12, 13, 14, 15], [2] * 8)
    # 1 dead row of 8 is below the quarter threshold: no compaction, row kept in the batch.
    assert decoder.selects == []
    assert decoder.decode_rows == [8] * 5
    assert out.lengths.tolist() == [2] + [6] * 7


def test_positions_continue_after_each_prompt():
    decoder, _ = _run([9, 9], [3, 1], steps=3)
    assert decoder.positions == [[3, 1], [4, 2]]


def test_n_samples_share_one_prefill_of_duplicate_prompts():
    decoder, out = _run([2, 3, 2], [2, 2, 2], n=2)
    assert decoder.prefill_rows == [2]  # rows 0 and 2 are the same prompt
    assert decoder.selects[0] == [0, 0, 1, 1, 0, 0]
    assert out.lengths.tolist() == [3, 3, 4, 4, 3, 3]


def test_ignore_eos_generates_full_length():
    _, out = _run([0, 2], [2, 2], ignore_eos=True)
    assert out.lengths.tolist() == [6, 6]
    assert out.responses[0, 0].item() == EOS


def test_all_rows_finished_stops_early():
    decoder, out = _run([0, 1], [2, 2], steps=8)
    assert out.lengths.tolist() == [1, 2]
    assert len(decoder.decode_rows) == 1


def test_bad_prompts_are_rejected():
    decoder = ScriptedDecoder()
    params = GenerationParams(max_new_tokens=2)
    ids = torch.ones(2, 3, dtype=torch.long)
    right_padded = torch.tensor([[1, 1, 0], [1, 1, 1]])
    with pytest.raises(ValueError, match="left-padded"):
        generate(decoder, ids, right_padded, right_padded.cumsum(-1), params, PAD)
    empty = torch.tensor([[0, 0, 0], [1, 1, 1]])
    with pytest.raises(ValueError, match=r"rows \[0\] have no tokens"):
        generate(decoder, ids, empty, empty, params, PAD)
    with pytest.raises(ValueError, match="position_ids shape"):
        generate(decoder, ids, torch.ones_like(ids), torch.ones(2, 2, dtype=torch.long), params, PAD)

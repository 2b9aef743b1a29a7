"""Constructor-argument checks the RL, SFT and preference-pair datasets share: the file list, the
truncation mode, and the tokenizer's chat template and pad token. Each raises ValueError with the
message the datasets have always given."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


def as_file_list(files: str | os.PathLike | Sequence[str | os.PathLike], owner: str) -> list[str]:
    """``files`` (one path or several) as a list of ``~``-expanded paths; none at all raises,
    naming ``owner`` (the dataset class)."""
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    result = [os.path.expanduser(os.fspath(f)) for f in files]
    if not result:
        raise ValueError(f"{owner} needs at least one data file")
    return result


def check_truncation(truncation: str, modes: Sequence[str]) -> None:
    """``truncation`` must be one of ``modes``."""
    if truncation not in modes:
        raise ValueError(f"truncation must be one of {', '.join(modes)}, got {truncation!r}")


def tokenizer_pad_id(tokenizer: Any, padded: str) -> int:
    """The tokenizer's pad token id, else its eos token id; with neither it raises, saying what
    would have been padded (``padded``: "prompts", "examples", "pairs")."""
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    raise ValueError(f"the tokenizer has neither a pad token nor an eos token to pad {padded} with")


def check_chat_dataset_args(
    tokenizer: Any, truncation: str, modes: Sequence[str], max_length: int, items: str, padded: str
) -> int:
    """The checks of a dataset of chat turns padded to ``max_length`` (SFT, preference pairs), in
    order: the truncation mode, ``max_length`` an integer ≥ 2, a tokenizer with a chat template
    (``items`` names the rows in the message), and a pad (or eos) token, whose id is returned."""
    check_truncation(truncation, modes)
    if not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an integer ≥ 2, got {max_length!r}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the tokenizer has no chat template; {items} are chat turns and need one")
    return tokenizer_pad_id(tokenizer, padded)

"""Tiny random models with a real tokenizer, built entirely in code (no download).

Tests and examples need a causal LM that behaves like the real thing (HF classes, a
byte-level BPE tokenizer with a ChatML chat template, tied embeddings like SmolLM2) but runs
in milliseconds. Everything here is deterministic: the tokenizer is trained on a fixed
built-in corpus and the weights come from a seeded generator.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

BOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD_TOKEN = "<|pad|>"
# Order fixes the ids: bos=0, im_start=1, im_end=2 (the eos, as in ChatML instruct models), pad=3.
SPECIAL_TOKENS: tuple[str, ...] = (BOS_TOKEN, IM_START, IM_END, PAD_TOKEN)
TINY_VOCAB_SIZE = 512
TINY_ARCHS: tuple[str, ...] = ("llama", "qwen2", "qwen3", "gemma3", "mistral")
# Gemma 3's local layers in the tiny model: shorter than a test's prompt + response, so the
# window changes the outputs (a sampler that ignored it would fail the parity tests).
TINY_GEMMA3_SLIDING_WINDOW = 8

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "What is 7 + 5? The answer is 12.",
    "Compute 123 * 4 = 492, then 492 - 17 = 475.",
    "You are a helpful assistant. Please answer the question step by step.",
    "Question: how many apples are left? Answer: #### 42",
    "def add(a, b):\n    return a + b\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000",
    "Punctuation !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ and tabs\tand newlines\n\n",
    "user\nassistant\nsystem\n",
    "Let's think. First, add the tens; then add the ones. So the result is 57.",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz",
    "Countdown: use 3, 8, 25 and 50 to make 75. <answer>50 + 25</answer>",
)


def build_tiny_tokenizer(vocab_size: int = TINY_VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained in code on a small built-in corpus.

    Byte-level pre-tokenization maps every byte to a symbol of the initial alphabet, so any
    ASCII text (including runs of spaces, tabs and newlines) encodes and decodes back exactly
    (non-ASCII text too, up to NFC normalisation). The normaliser / pre-tokenizer pipeline is
    the one ``Qwen2Tokenizer`` rebuilds from vocab + merges, because ``AutoTokenizer`` forces
    that class for a ``qwen2`` config: both loaders then give identical ids. Special tokens: ``<|endoftext|>`` (bos, id 0), ``<|im_start|>`` (1),
    ``<|im_end|>`` (eos, 2), ``<|pad|>`` (pad, 3). Nothing is added automatically on encode.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be >= {256 + len(SPECIAL_TOKENS)} (bytes + specials), got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(_CORPUS) * 4, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        clean_up_tokenization_spaces=False,  # the default would turn " ." into "." on decode
        padding_side="left",
        model_max_length=4096,
    )
    wrapped.chat_template = CHATML_TEMPLATE
    return wrapped


def build_tiny_model(
    tokenizer: PreTrainedTokenizerFast | None = None,
    arch: str = "llama",
    num_layers: int = 2,
    hidden_size: int = 128,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    tie_word_embeddings: bool = True,
    max_position_embeddings: int = 1024,
) -> PreTrainedModel:
    """A randomly initialised causal LM of family ``arch`` (one of :data:`TINY_ARCHS`).

    4 attention heads with 2 key/value heads (grouped-query attention, as in SmolLM2 / Qwen2),
    MLP width 2·hidden_size, vocabulary = ``len(tokenizer)``. Weights are drawn from a
    generator seeded with ``seed`` without disturbing the global RNG state.

    ``qwen3`` and ``gemma3`` (see :func:`_build_family`) also get random norm weights: HF
    initialises them to the identity, which would hide a sampler that skipped or misplaced a
    norm. ``mistral`` is Llama-shaped (no sliding window) and only used by tests.
    """
    tokenizer = tokenizer if tokenizer is not None else build_tiny_tokenizer()
    if hidden_size % 4 != 0:
        raise ValueError(f"hidden_size must be a multiple of 4 (4 heads), got {hidden_size}")
    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "initializer_range": 0.02,
    }
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny model arch {arch!r}; valid: {', '.join(map(repr, TINY_ARCHS))}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: PreTrainedModel
        if arch == "llama":
            model = LlamaForCausalLM(LlamaConfig(**common))
        elif arch == "qwen2":
            model = Qwen2ForCausalLM(Qwen2Config(**common))
        else:
            model = _build_family(arch, common)
    # transformers declares PreTrainedModel.to as functools.wraps(Module.to), which type checkers read unbound
    return model.to(dtype).eval()  # type: ignore[arg-type]


def _build_family(arch: str, common: dict[str, Any]) -> PreTrainedModel:
    """The tiny ``qwen3`` / ``gemma3`` / ``mistral`` model (inside the caller's seeded RNG)."""
    head_dim = common["hidden_size"] // common["num_attention_heads"]
    model: PreTrainedModel
    if arch == "mistral":
        return MistralForCausalLM(MistralConfig(**common, sliding_window=None))
    if arch == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=head_dim))
        center = 1.0  # Llama-style norms: w · norm(x)
    else:
        layers = common["num_hidden_layers"]
        config = Gemma3TextConfig(
            **common,
            head_dim=head_dim,
            # ≠ head_dim, so a sampler scaling scores by 1/√head_dim would be caught
            query_pre_attn_scalar=2 * head_dim,
            sliding_window=TINY_GEMMA3_SLIDING_WINDOW,
            # local, global, local, ...: with 2 layers one of each
            layer_types=["full_attention" if i % 2 else "sliding_attention" for i in range(layers)],
        )
        model = Gemma3ForCausalLM(config)
        center = 0.0  # Gemma's norms: (1 + w) · norm(x)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(center + 0.2 * torch.randn_like(param))
    return model


def save_tiny_model(
    path: str | os.PathLike, tokenizer: PreTrainedTokenizerFast | None = None, **model_kwargs: Any
) -> Path:
    """Write a Hugging Face model folder (config, safetensors, tokenizer) to ``path``; the model is
    :func:`build_tiny_model` ``(tokenizer, **model_kwargs)`` (``arch``, ``num_layers``, ``seed``, ...).

    The folder is written next to ``path`` and renamed into place, so an interrupted call never
    leaves a half-written model. ``tokenizer_config.json`` names ``PreTrainedTokenizerFast``
    so ``AutoTokenizer`` reloads the exact byte-level tokenizer whatever the model type.
    Returns the folder path.
    """
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"refusing to overwrite existing path {path}")
    tokenizer = tokenizer if tokenizer is not None else build_tiny_tokenizer()
    model = build_tiny_model(tokenizer, **model_kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path

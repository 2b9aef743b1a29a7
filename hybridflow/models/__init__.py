"""Loading models and tokenizers: HF folders, packaged GGUF models, tiny in-code models, Hub ids."""

from hybridflow.models.attention import ATTN_IMPLEMENTATIONS, choose_attn_implementation, policy_attn_implementation
from hybridflow.models.hub import HubModelError
from hybridflow.models.loader import (
    DTYPES,
    ModelLoadError,
    load_model_and_tokenizer,
    load_tokenizer,
    parse_dtype,
)
from hybridflow.models.sources import MODEL_SOURCES, cache_dir, resolve_model_path
from hybridflow.models.value_model import ValueHeadModel, load_value_model

__all__ = [
    "ATTN_IMPLEMENTATIONS",
    "DTYPES",
    "HubModelError",
    "MODEL_SOURCES",
    "ModelLoadError",
    "ValueHeadModel",
    "cache_dir",
    "choose_attn_implementation",
    "load_model_and_tokenizer",
    "load_tokenizer",
    "load_value_model",
    "parse_dtype",
    "policy_attn_implementation",
    "resolve_model_path",
]

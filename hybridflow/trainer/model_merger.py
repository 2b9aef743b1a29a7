"""Turn a training checkpoint into a Hugging Face model folder (verl's model merger).

Input: an actor checkpoint as the trainer writes it (any of these paths)::

    {default_local_dir}/                     → the step in latest_checkpointed_iteration.txt
    {default_local_dir}/global_step_N/       → its actor/
    {default_local_dir}/global_step_N/actor/ model.safetensors (+ optimizer.pt, extra_state.pt)
                                             tokenizer/   hf_config/ (config.json,
                                             generation_config.json, adapter_config.json if LoRA)

The weights are read by a checkpoint reader picked from ``CHECKPOINT_READERS`` (detected from
the folder, or named with ``backend``). A reader returns the full state dict under the training
module's names: the single-process ``torch`` engine's one ``model.safetensors``, or the ``fsdp``
engine's per-rank DCP shards (``model/__r_0.distcp`` + ``fsdp_meta.json``) reassembled into the
same full state dict.

Output (``target_dir``): ``model.safetensors`` + ``config.json`` + ``generation_config.json``
+ tokenizer files, loadable with ``AutoModelForCausalLM.from_pretrained``, and
``.hybridflow_export.json`` listing the files the export wrote with their sha256. The files are
written to a temporary folder first; a new or empty target is then replaced in one rename. A
non-empty target is written into only if an earlier export made it (its list is there) or with
``overwrite``; either way the export's files replace their namesakes and nothing else in the
folder is removed, except files an earlier export listed and this one does not write — and of
those only the ones still holding the content the export recorded, found inside the target
without passing through a symbolic link (the list itself could have been planted).
A target inside the checkpoint itself is refused, and so is a checkpoint whose files do not
match the checksums recorded when it was saved.

A LoRA checkpoint is exported either merged (``W + (α/r)·B·A`` folded into the base weights,
a plain model) or as the adapter alone (``adapter_model.safetensors`` + ``adapter_config.json``,
peft format, on top of the base model named in ``base_model_name_or_path``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from hybridflow.engine.checkpoint import MODEL_FILE, file_sha256, fsync_dir, fsync_tree
from hybridflow.engine.fsdp_checkpoint import is_fsdp_checkpoint, read_full_model_state
from hybridflow.models.hf_metadata import ADAPTER_CONFIG_FILE, CONFIG_FILE, GENERATION_CONFIG_FILE, HF_CONFIG_DIR
from hybridflow.trainer import checkpoint as ckpt
from hybridflow.trainer.checkpoint import LATEST_FILE
from hybridflow.utils.registry import Registry
from hybridflow.utils.errors import InputError

TOKENIZER_DIR = "tokenizer"  # the actor writes its tokenizer here, next to the weights
ACTOR_DIR = "actor"
LORA_MODES: tuple[str, ...] = ("merge", "adapter")
EXPORT_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_LORA_MARK = ".lora_"
EXPORT_MANIFEST = ".hybridflow_export.json"  # the files an export wrote: what a later export may replace

logger = logging.getLogger("hybridflow.export")


class CheckpointError(InputError, ValueError):
    """A checkpoint is missing, corrupt, or lacks what the export needs; the message says which."""


# --- readers -------------------------------------------------------------------------------

CheckpointReader = Callable[[Path], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class ReaderSpec:
    """How to recognise a reader's checkpoint folder, and a one-line description."""

    detect: Callable[[Path], bool]
    description: str


CHECKPOINT_READERS: Registry[CheckpointReader] = Registry("checkpoint reader")


def _is_torch_checkpoint(path: Path) -> bool:
    return (path / MODEL_FILE).is_file()


@CHECKPOINT_READERS.register("torch", meta=ReaderSpec(_is_torch_checkpoint, "single-process engine: one model.safetensors"))
def read_torch_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """The state dict in ``path/model.safetensors`` (tied tensors stored once, under one name)."""
    file = path / MODEL_FILE
    if not file.is_file():
        raise CheckpointError(f"{path}: no {MODEL_FILE} (found: {_listing(path)})")
    try:
        return load_file(str(file))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"{file}: not a readable safetensors file ({err}); the checkpoint is corrupt or truncated") from err


@CHECKPOINT_READERS.register(
    "fsdp", meta=ReaderSpec(is_fsdp_checkpoint, "FSDP engine: per-rank model/__r_0.distcp shards + fsdp_meta.json")
)
def read_fsdp_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """The full state dict reassembled from every rank's shard (no process group needed)."""
    try:
        return read_full_model_state(path)
    except (OSError, ValueError, RuntimeError) as err:  # DCP raises these for missing or corrupt shards
        raise CheckpointError(f"{path}: cannot reassemble the FSDP shards: {type(err).__name__}: {err}") from err


def detect_backend(path: Path) -> str:
    """The first registered reader whose ``detect`` accepts ``path``; a clear error otherwise."""
    for name in CHECKPOINT_READERS.names():
        if CHECKPOINT_READERS.meta(name).detect(path):
            return name
    readers = "; ".join(f"{n}: {CHECKPOINT_READERS.meta(n).description}" for n in CHECKPOINT_READERS.names())
    if any(path.glob("rank_*")):
        raise CheckpointError(
            f"{path} holds per-rank shards (rank_*/) but no registered reader recognises them; readers: {readers}"
        )
    raise CheckpointError(f"{path} is not an engine checkpoint folder (found: {_listing(path)}); readers: {readers}")


def _listing(path: Path) -> str:
    if not path.is_dir():
        return "the folder does not exist"
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in path.iterdir())
    return ", ".join(names) or "nothing"


# --- locating the parts of a checkpoint ----------------------------------------------------


@dataclass(frozen=True)
class CheckpointSource:
    """Where each part of one checkpoint is: weights (read by ``backend``), HF config, tokenizer."""

    weights_dir: Path
    backend: str
    hf_config_dir: Path
    tokenizer_dir: Path | None

    @property
    def is_lora(self) -> bool:
        return (self.hf_config_dir / ADAPTER_CONFIG_FILE).is_file()


def resolve_weights_dir(path: str | os.PathLike) -> Path:
    """A run folder → its latest step's ``actor/``; a ``global_step_N`` folder → its ``actor/``."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    latest = path / LATEST_FILE
    if latest.is_file():
        step = latest.read_text().strip()
        if not step.isdigit():
            raise CheckpointError(f"{latest} is corrupt: expected a step number, found {step!r}")
        path = path / f"global_step_{step}"
    if (path / ACTOR_DIR).is_dir():
        path = path / ACTOR_DIR
    return path


def locate_checkpoint(
    path: str | os.PathLike, hf_model_config_path: str | os.PathLike | None = None, backend: str = "auto"
) -> CheckpointSource:
    """The parts of the checkpoint at ``path``.

    The HF config comes from the checkpoint's ``hf_config/``; ``hf_model_config_path`` (the
    base model folder used for training) stands in for it in checkpoints written without one,
    and for a missing ``tokenizer/``.
    """
    weights_dir = resolve_weights_dir(path)
    verify_source(weights_dir)
    name = detect_backend(weights_dir) if backend == "auto" else backend
    CHECKPOINT_READERS.get(name)  # an unknown backend lists the registered ones
    fallback = Path(hf_model_config_path) if hf_model_config_path is not None else None
    own_config = weights_dir / HF_CONFIG_DIR
    if (own_config / CONFIG_FILE).is_file():
        config_dir = own_config
    elif fallback is not None and (fallback / CONFIG_FILE).is_file():
        config_dir = fallback
    else:
        raise CheckpointError(
            f"{weights_dir} has no {HF_CONFIG_DIR}/{CONFIG_FILE}"
            + (f" and {fallback} has no {CONFIG_FILE}" if fallback is not None else "")
            + "; pass --hf_model_config_path <the base model folder used for training>"
        )
    own_tokenizer = weights_dir / TOKENIZER_DIR
    tokenizer_dir = own_tokenizer if own_tokenizer.is_dir() else fallback
    return CheckpointSource(weights_dir, name, config_dir, tokenizer_dir)


def verify_source(weights_dir: Path) -> None:
    """Check a part of a committed checkpoint (``global_step_N/actor``) against the checksums
    its manifest recorded; a damaged file is refused by name. A folder outside a
    ``global_step_N`` checkpoint has no manifest to check against and is read as it is."""
    found = ckpt.checkpoint_of(weights_dir)
    if found is None:
        return
    root, part = found
    if not (root / ckpt.MANIFEST_FILE).is_file():
        logger.warning("note: %s has no %s (an older or uncommitted checkpoint): its files are not verified",
                       root, ckpt.MANIFEST_FILE)
        return
    try:
        verified = ckpt.verify_checkpoint(root, part or None)
    except ckpt.CheckpointError as err:
        raise CheckpointError(f"refusing to read a damaged checkpoint: {err}") from err
    if not verified:
        logger.warning("%s", ckpt.unverified_note(root))


# --- rebuilding the model ------------------------------------------------------------------


def build_model(source: CheckpointSource, trust_remote_code: bool = False) -> torch.nn.Module:
    """The trained module rebuilt from its config and checkpoint weights (a ``PeftModel`` for LoRA).

    Generation defaults come from the checkpoint's ``generation_config.json`` when present.
    """
    tensors = CHECKPOINT_READERS.get(source.backend)(source.weights_dir)
    config = AutoConfig.from_pretrained(source.hf_config_dir, local_files_only=True, trust_remote_code=trust_remote_code)
    config.use_cache = True  # training with gradient checkpointing turns the KV cache off; inference wants it
    lora_config = _lora_config(source)
    if lora_config is not None and lora_config.base_model_name_or_path:
        # peft re-points the adapter at the model's name_or_path: keep the real base model
        config.name_or_path = lora_config.base_model_name_or_path
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=trust_remote_code)
    if (source.hf_config_dir / GENERATION_CONFIG_FILE).is_file():
        model.generation_config = GenerationConfig.from_pretrained(source.hf_config_dir, local_files_only=True)
    if lora_config is not None:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config)
    elif any(_LORA_MARK in name for name in tensors):
        raise CheckpointError(
            f"{source.weights_dir} holds LoRA weights but {source.hf_config_dir} has no {ADAPTER_CONFIG_FILE} "
            "(rank, alpha and target modules are needed to rebuild the adapter)"
        )
    load_weights(model, tensors, source.weights_dir)
    return model.eval()


def _lora_config(source: CheckpointSource):
    """The checkpoint's ``peft.LoraConfig``, or None without LoRA (peft is imported only then)."""
    if not source.is_lora:
        return None
    from peft import LoraConfig

    return LoraConfig.from_pretrained(str(source.hf_config_dir))


def load_weights(module: torch.nn.Module, tensors: dict[str, torch.Tensor], where: Path) -> None:
    """Copy ``tensors`` into ``module``: every name must exist with the same shape, and every
    module tensor must be given (a tied alias counts as given when its partner is)."""
    expected = module.state_dict()
    aliases = _shared_names(expected)
    missing = [n for n in expected if n not in tensors and not any(a in tensors for a in aliases.get(n, ()))]
    unexpected = [n for n in tensors if n not in expected]
    wrong = [f"{n} {tuple(tensors[n].shape)} vs {tuple(expected[n].shape)}"
             for n in tensors if n in expected and tensors[n].shape != expected[n].shape]
    problems = [
        f"{label} ({len(items)}): {', '.join(items[:5])}{', ...' if len(items) > 5 else ''}"
        for label, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch, checkpoint vs config", wrong))
        if items
    ]
    if problems:
        raise CheckpointError(f"{where}: the weights do not fit the model config: " + "; ".join(problems))
    with torch.no_grad():
        module.load_state_dict(tensors, strict=False)


def _shared_names(state: dict[str, torch.Tensor]) -> dict[str, list[str]]:
    """name → the other names viewing the same storage (tied embeddings)."""
    by_storage: dict[tuple[int, int, tuple[int, ...]], list[str]] = {}
    for name, tensor in state.items():
        if tensor.numel():
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
            by_storage.setdefault(key, []).append(name)
    return {n: [m for m in group if m != n] for group in by_storage.values() if len(group) > 1 for n in group}


def merged_model(model: torch.nn.Module) -> torch.nn.Module:
    """A plain HF model: LoRA adapters folded into the base weights (``merge_and_unload``)."""
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def export_dtype(name: str, tensors_dtype: torch.dtype) -> torch.dtype:
    """``auto`` → the checkpoint's own dtype; else one of :data:`EXPORT_DTYPES`."""
    if name == "auto":
        return tensors_dtype
    if name not in EXPORT_DTYPES:
        raise ValueError(f"unknown export dtype {name!r}; valid: auto, {', '.join(EXPORT_DTYPES)}")
    return EXPORT_DTYPES[name]


# --- writing -------------------------------------------------------------------------------


def merge_checkpoint(
    local_dir: str | os.PathLike,
    target_dir: str | os.PathLike,
    *,
    hf_model_config_path: str | os.PathLike | None = None,
    backend: str = "auto",
    lora: str = "merge",
    dtype: str = "auto",
    base_model_name_or_path: str | None = None,
    trust_remote_code: bool = False,
    overwrite: bool = False,
) -> Path:
    """Export the checkpoint at ``local_dir`` as a Hugging Face folder ``target_dir``.

    ``target_dir`` must be new, empty, or an earlier export's folder; ``overwrite`` also allows
    a folder with other files (they are kept; see :func:`write_export`).
    ``lora``: ``merge`` (a plain model with merged weights) or ``adapter`` (the adapter alone;
    LoRA checkpoints only). ``dtype``: ``auto`` (as stored), ``fp32``, ``bf16`` or ``fp16``.
    ``base_model_name_or_path``: what an adapter export names as its base model (default: the
    model folder the training started from, as recorded in the adapter config).
    """
    if lora not in LORA_MODES:
        raise ValueError(f"lora must be one of {', '.join(LORA_MODES)}, got {lora!r}")
    source = locate_checkpoint(local_dir, hf_model_config_path, backend)
    if lora == "adapter" and not source.is_lora:
        raise CheckpointError(
            f"{source.weights_dir} was not trained with LoRA (no {ADAPTER_CONFIG_FILE}); export it with lora=merge"
        )
    target = Path(target_dir)
    earlier = check_export_target(target, source.weights_dir, overwrite)  # before any work or write
    model = build_model(source, trust_remote_code)
    if lora == "merge":
        model = merged_model(model)
    elif base_model_name_or_path is not None:
        for adapter_config in model.peft_config.values():
            adapter_config.base_model_name_or_path = base_model_name_or_path
    stored = next(p.dtype for p in model.parameters() if p.is_floating_point())
    model = model.to(export_dtype(dtype, stored))

    def write(folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        if source.tokenizer_dir is None:
            logger.warning("%s has no %s/ and no hf_model_config_path was given: exporting without a tokenizer",
                           source.weights_dir, TOKENIZER_DIR)
        else:
            tokenizer = AutoTokenizer.from_pretrained(
                source.tokenizer_dir, local_files_only=True, trust_remote_code=trust_remote_code
            )
            tokenizer.save_pretrained(folder)

    write_export(target, earlier, write)
    return target


# --- the target folder ---------------------------------------------------------------------


def check_export_target(target: Path, weights_dir: Path, overwrite: bool) -> dict[str, str]:
    """May the export write into ``target``? Returns the files an earlier export recorded there
    (name → sha256 of what it wrote: replaceable); raises :class:`CheckpointError` when the
    target must be left alone."""
    if target.exists() and not target.is_dir():
        raise CheckpointError(f"target_dir {target} exists and is not a folder")
    inside = target.resolve()
    if inside == weights_dir.resolve() or weights_dir.resolve() in inside.parents:
        raise CheckpointError(
            f"target_dir {target} is inside the checkpoint being exported ({weights_dir}): the export's "
            "model.safetensors would replace the checkpoint's; choose another folder"
        )
    if not target.is_dir() or not any(target.iterdir()):
        return {}
    if (target / EXPORT_MANIFEST).is_file():
        return _listed_files(target / EXPORT_MANIFEST)
    if overwrite:
        return {}
    entries = sorted(p.name + ("/" if p.is_dir() else "") for p in target.iterdir())
    shown = ", ".join(entries[:6]) + (", ..." if len(entries) > 6 else "")
    raise CheckpointError(
        f"target_dir {target} is not empty ({shown}) and was not written by hybridflow export; refusing to "
        "write into it. Choose a new folder, or pass --overwrite (overwrite=True) to write the export into it: "
        "files of the same names are replaced, nothing else is removed"
    )


def _listed_files(manifest: Path) -> dict[str, str]:
    """The files an earlier export recorded, name → sha256; names that would leave the folder are
    refused. Names without a recorded checksum (a list written before checksums, or one someone
    edited) are left out: nothing proves the export wrote them, so they are never removed."""
    try:
        record = json.loads(manifest.read_text(encoding="utf-8"))
        files = record["files"]
        hashes = record.get("sha256", {})
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{manifest} is damaged ({type(err).__name__}: {err}); remove it or choose another target") from err
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise CheckpointError(f"{manifest}: 'files' must be a list of file names")
    if not isinstance(hashes, dict) or not all(isinstance(h, str) for h in hashes.values()):
        raise CheckpointError(f"{manifest}: 'sha256' must map file names to checksums")
    bad = [f for f in files if PurePosixPath(f).is_absolute() or ".." in PurePosixPath(f).parts or not f]
    if bad:
        raise CheckpointError(f"{manifest} lists names outside the folder: {bad[:3]}")
    unproven = [f for f in files if f not in hashes]
    if unproven:
        logger.warning("%s lists %d file(s) without a checksum (%s): unless this export writes them again, "
                       "they are kept, never removed",
                       manifest, len(unproven), ", ".join(unproven[:3]) + (", ..." if len(unproven) > 3 else ""))
    return {f: hashes[f] for f in files if f in hashes}


def _symlink_on_the_way(target: Path, name: str) -> Path | None:
    """The first entry of ``target/name`` below ``target`` (its folders, then the file itself)
    that is a symbolic link, or None: an entry reached through a link may lie outside ``target``."""
    current = target
    for part in PurePosixPath(name).parts:
        current = current / part
        if current.is_symlink():
            return current
    return None


def _remove_own_file(target: Path, name: str, recorded: str) -> None:
    """Delete ``target/name`` if it is still the file an earlier export wrote: a regular file
    reached without a symbolic link, inside ``target``, with the recorded sha256. Otherwise it
    stays (with a warning saying why)."""
    path = target / name
    link = _symlink_on_the_way(target, name)
    if link is not None:
        logger.warning("kept %s: %s is a symbolic link, and an export deletes nothing through one", path, link)
        return
    if not path.is_file():
        return
    if target.resolve() not in path.resolve().parents:
        logger.warning("kept %s: it resolves outside %s", path, target)
        return
    if file_sha256(path) != recorded:
        logger.warning("kept %s: listed by an earlier export, but its content changed since", path)
        return
    path.unlink()


def write_export(target: Path, earlier: Mapping[str, str], write: Callable[[Path], None]) -> None:
    """Run ``write`` into a temporary folder next to ``target``, then move its files into place.

    A missing or empty ``target`` is replaced in one rename. Otherwise each written file
    replaces its namesake, files of ``earlier`` (an earlier export's, name → sha256) not
    written again are removed when they still hold what was recorded, and every other file
    stays. Nothing is written or removed through a symbolic link inside ``target``.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.export-", dir=target.parent))
    try:
        write(tmp)
        written = sorted(str(p.relative_to(tmp).as_posix()) for p in tmp.rglob("*") if p.is_file())
        record = {"files": written, "sha256": {name: file_sha256(tmp / name) for name in written}}
        (tmp / EXPORT_MANIFEST).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        fsync_tree(tmp)
        if not target.exists() or not any(target.iterdir()):
            if target.exists():
                target.rmdir()
            os.replace(tmp, target)
            fsync_dir(target.parent)
            return
        for name in [*written, EXPORT_MANIFEST]:
            # A folder of the target that is a link would carry the file elsewhere; the file's own
            # name being a link is fine (os.replace swaps the link, never writes through it).
            link = _symlink_on_the_way(target, str(PurePosixPath(name).parent)) if "/" in name else None
            if link is not None:
                raise CheckpointError(
                    f"target_dir {target}: {link} is a symbolic link; the export writes nothing through one "
                    f"(it would place {name} outside the target). Remove the link or choose another folder"
                )
        for name in [*written, EXPORT_MANIFEST]:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / name, target / name)
        for name in sorted(set(earlier) - set(written) - {EXPORT_MANIFEST}):
            _remove_own_file(target, name, earlier[name])
        fsync_dir(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

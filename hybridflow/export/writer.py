"""Write a checkpoint as a Hugging Face model folder (the second half of verl's model merger).

Output (``target_dir``): ``model.safetensors`` + ``config.json`` + ``generation_config.json``
+ tokenizer files, loadable with ``AutoModelForCausalLM.from_pretrained``, and
``.hybridflow_export.json`` listing the files the export wrote with their sha256. The files are
written to a temporary folder first; a new or empty target is then replaced in one rename. A
non-empty target is written into only if an earlier export made it (its list is there) or with
``overwrite``; either way the export's files replace their namesakes and nothing else in the
folder is removed, except files an earlier export listed and this one does not write — and of
those only the ones still holding the content the export recorded, found inside the target
without passing through a symbolic link (the list itself could have been planted).
A target inside the checkpoint itself is refused.

A LoRA checkpoint is exported either merged (``W + (α/r)·B·A`` folded into the base weights,
a plain model) or as the adapter alone (``adapter_model.safetensors`` + ``adapter_config.json``,
peft format, on top of the base model named in ``base_model_name_or_path``). Reading the
checkpoint is :mod:`hybridflow.export.reader`'s job.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath

import torch
from transformers import AutoTokenizer

from hybridflow.engine.checkpoint import file_sha256, fsync_dir, fsync_tree
from hybridflow.export.reader import (
    TOKENIZER_DIR,
    CheckpointError,
    CheckpointSource,
    build_model,
    locate_checkpoint,
    merged_model,
)
from hybridflow.models.hf_metadata import ADAPTER_CONFIG_FILE
from hybridflow.models.processor import load_processor, save_tokenizer_or_processor

LORA_MODES: tuple[str, ...] = ("merge", "adapter")
EXPORT_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
EXPORT_MANIFEST = ".hybridflow_export.json"  # the files an export wrote: what a later export may replace

logger = logging.getLogger("hybridflow.export")


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
    model = _export_model(source, lora, dtype, base_model_name_or_path, trust_remote_code)

    def write(folder: Path) -> None:
        save_model(model, folder)
        _save_tokenizer(source, folder, trust_remote_code)

    write_export(target, earlier, write)
    return target


def _export_model(
    source: CheckpointSource, lora: str, dtype: str, base_model_name_or_path: str | None, trust_remote_code: bool
) -> torch.nn.Module:
    """The checkpoint's module as it is exported: merged or the adapter (re-based), in ``dtype``."""
    model = build_model(source, trust_remote_code)
    if lora == "merge":
        model = merged_model(model)
    elif base_model_name_or_path is not None:
        from peft import PeftModel  # imported already: merge_checkpoint allows lora=adapter only for LoRA

        assert isinstance(model, PeftModel)  # build_model rebuilds a LoRA checkpoint as a PeftModel
        for adapter_config in model.peft_config.values():
            adapter_config.base_model_name_or_path = base_model_name_or_path
    stored = next(p.dtype for p in model.parameters() if p.is_floating_point())
    return model.to(export_dtype(dtype, stored))


def save_model(model: torch.nn.Module, folder: Path) -> None:
    """``model.save_pretrained(folder)`` as safetensors: a ``transformers`` model, or a ``PeftModel``
    (which saves its adapter)."""
    save_pretrained = getattr(model, "save_pretrained", None)
    if save_pretrained is None:
        raise AttributeError(f"{type(model).__name__} is not a Hugging Face model: it has no save_pretrained")
    save_pretrained(folder, safe_serialization=True)


def _save_tokenizer(source: CheckpointSource, folder: Path, trust_remote_code: bool) -> None:
    if source.tokenizer_dir is None:
        logger.warning(
            "%s has no %s/ and no hf_model_config_path was given: exporting without a tokenizer",
            source.weights_dir,
            TOKENIZER_DIR,
        )
        return
    processor = load_processor(source.tokenizer_dir)  # a vision-language model's, else None
    tokenizer = None
    if processor is None:
        tokenizer = AutoTokenizer.from_pretrained(
            source.tokenizer_dir, local_files_only=True, trust_remote_code=trust_remote_code
        )
    save_tokenizer_or_processor(tokenizer, processor, folder)


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
        raise CheckpointError(
            f"{manifest} is damaged ({type(err).__name__}: {err}); remove it or choose another target"
        ) from err
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        raise CheckpointError(f"{manifest}: 'files' must be a list of file names")
    if not isinstance(hashes, dict) or not all(isinstance(h, str) for h in hashes.values()):
        raise CheckpointError(f"{manifest}: 'sha256' must map file names to checksums")
    bad = [f for f in files if PurePosixPath(f).is_absolute() or ".." in PurePosixPath(f).parts or not f]
    if bad:
        raise CheckpointError(f"{manifest} lists names outside the folder: {bad[:3]}")
    unproven = [f for f in files if f not in hashes]
    if unproven:
        logger.warning(
            "%s lists %d file(s) without a checksum (%s): unless this export writes them again, "
            "they are kept, never removed",
            manifest,
            len(unproven),
            ", ".join(unproven[:3]) + (", ..." if len(unproven) > 3 else ""),
        )
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

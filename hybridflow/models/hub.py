"""Models named by a Hugging Face Hub id (``org/name`` or ``org/name@revision``), downloaded
once into huggingface_hub's own cache.

The download is :func:`huggingface_hub.snapshot_download`, called with its defaults, so every
setting huggingface_hub documents applies unchanged: ``HF_HOME`` / ``HF_HUB_CACHE`` (where the
cache is), ``HF_ENDPOINT`` (which Hub or mirror), ``HF_TOKEN`` (private and gated repos),
``HF_HUB_OFFLINE=1`` (cache only, no network), ``HF_HUB_DISABLE_PROGRESS_BARS``,
``HF_HUB_DOWNLOAD_TIMEOUT`` / ``HF_HUB_ETAG_TIMEOUT``. Nothing here re-reads them: they are
huggingface_hub's business, and a second reading could disagree with its own.

What is downloaded: only the repo's top-level files that loading needs (:data:`ALLOW_PATTERNS`)
— config and generation config, tokenizer files, the chat template, safetensors weights with
their index, and ``*.py`` files (used only with ``trust_remote_code=true``). Sub-folders
(``original/``, ``onnx/``...), GGUF files, Mistral's duplicate ``consolidated*`` weights and
weights in other formats are skipped. A repo without safetensors weights gets its
``pytorch_model*.bin`` files in a second pass (the loader reads them with ``weights_only=True``).

Several processes resolving the same id at once do not corrupt the cache: huggingface_hub
takes a lock per file, downloads to a process-unique temporary file and renames it into place.
A transfer cut mid-file is resumed with an HTTP Range request inside the same call (a few
times); a call that still fails raises :class:`HubModelError`, and running again keeps the
files already complete and fetches the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import constants, is_offline_mode, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    IncompleteSnapshotError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import validate_repo_id

from hybridflow.utils.errors import InputError

# Matched against top-level names only: IGNORE_PATTERNS drops everything in a sub-folder.
ALLOW_PATTERNS: tuple[str, ...] = (
    "*.json",  # config.json, generation_config.json, tokenizer*.json, *.safetensors.index.json
    "*.safetensors",
    "*.txt",  # merges.txt, vocab.txt
    "*.model",  # sentencepiece tokenizer.model
    "*.tiktoken",
    "*.jinja",  # chat_template.jinja
    "*.py",  # remote code, loaded only with trust_remote_code=true
)
PICKLE_WEIGHT_PATTERNS: tuple[str, ...] = ("pytorch_model*.bin",)
IGNORE_PATTERNS: tuple[str, ...] = ("*/*", "consolidated*")

# org/name, then an optional @revision (a branch, tag or commit; branch names may hold "/").
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[^\s@]+))?")


class HubModelError(InputError, FileNotFoundError):
    """A model named by a Hub id could not be found or downloaded; the message says why and what
    to do. A ``FileNotFoundError`` too, as a model path that does not exist always was."""


@dataclass(frozen=True)
class HubId:
    """A model repo on the Hub and, optionally, the revision to use (default: the main branch)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo_id if self.revision is None else f"{self.repo_id}@{self.revision}"


def parse_hub_id(text: str) -> HubId | None:
    """``text`` as a Hub id (``org/name`` or ``org/name@revision``), or None if it has not that
    form. A bare ``name`` is not taken: it is more often a mistyped known name or folder."""
    match = _HUB_ID.fullmatch(text)
    if match is None:
        return None
    try:
        validate_repo_id(match["repo"])
    except HFValidationError:
        return None
    return HubId(match["repo"], match["revision"])


def download_model(hub_id: HubId) -> Path:
    """The local snapshot folder of ``hub_id``: from the cache, or downloaded into it."""
    try:
        folder = _snapshot(hub_id, ALLOW_PATTERNS)
        if not any(folder.glob("*.safetensors")):
            folder = _snapshot(hub_id, ALLOW_PATTERNS + PICKLE_WEIGHT_PATTERNS)
    except Exception as err:  # any failure inside the download: transport, HTTP, cache, disk
        raise explain_failure(err, hub_id) from err
    return folder


def _snapshot(hub_id: HubId, allow_patterns: tuple[str, ...]) -> Path:
    folder = snapshot_download(
        hub_id.repo_id,
        revision=hub_id.revision,
        allow_patterns=list(allow_patterns),
        ignore_patterns=list(IGNORE_PATTERNS),
    )
    return Path(folder)


def explain_failure(err: BaseException, hub_id: HubId) -> HubModelError:
    """One line saying why ``hub_id`` could not be had and what to do about it."""
    endpoint, cache = constants.ENDPOINT, constants.HF_HUB_CACHE
    if isinstance(err, LocalEntryNotFoundError) and isinstance(err.__cause__, HfHubHTTPError):
        err = err.__cause__  # the Hub answered (gated, missing, refused): that is the reason, not the cache
    if isinstance(err, GatedRepoError):
        return HubModelError(
            f"{hub_id} on {endpoint} is a gated repo: accept its terms on its Hub page, then set HF_TOKEN "
            "to a token of an account with access"
        )
    if isinstance(err, RepositoryNotFoundError):
        return HubModelError(
            f"model path {str(hub_id)!r} is not a local folder and no model repo {hub_id.repo_id!r} was found "
            f"on {endpoint}; check the id, or set HF_TOKEN if the repo is private or gated"
        )
    if isinstance(err, RevisionNotFoundError):
        return HubModelError(
            f"revision {hub_id.revision or constants.DEFAULT_REVISION!r} of model repo {hub_id.repo_id!r} was not "
            f"found on {endpoint}; give an existing branch, tag or commit after '@'"
        )
    if isinstance(err, HfHubHTTPError) and _status(err) in (401, 403):
        return HubModelError(
            f"{endpoint} refused access to {hub_id} (HTTP {_status(err)}); set HF_TOKEN to a token with read access"
        )
    if isinstance(err, LocalEntryNotFoundError):
        return _not_cached(err, hub_id, endpoint, cache)
    return HubModelError(
        f"downloading {hub_id} from {endpoint} failed ({_summary(err)}); run again to retry "
        f"(files already complete stay in the cache at {cache})"
    )


def _not_cached(err: LocalEntryNotFoundError, hub_id: HubId, endpoint: str, cache: str) -> HubModelError:
    """The model is missing from the cache (or only partly there) and could not be downloaded."""
    what = "only partly in" if isinstance(err, IncompleteSnapshotError) else "not in"
    if is_offline_mode():
        return HubModelError(
            f"model {hub_id} is {what} the Hugging Face cache at {cache} and HF_HUB_OFFLINE=1 forbids "
            "downloading: unset HF_HUB_OFFLINE (or run once with network access) to download it, or pass "
            "a local model folder"
        )
    cause = err.__cause__ if err.__cause__ is not None else err
    return HubModelError(
        f"could not reach {endpoint} to download {hub_id} ({_summary(cause)}) and it is {what} the Hugging Face "
        f"cache at {cache}; check the network and HF_ENDPOINT, or pass a local model folder"
    )


def _status(err: HfHubHTTPError) -> int | None:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)


def _summary(err: BaseException) -> str:
    """``Type: first line of the message``, short enough for a one-line error."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__

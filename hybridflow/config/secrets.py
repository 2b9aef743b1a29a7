"""Which config values are secrets, and how they are hidden wherever a config leaves the process.

The rule is by key name, in this one place (:func:`is_secret_key`), because secrets sit in
free-form option dicts as often as in declared fields: ``actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.api_key``,
a judge's key in ``custom_reward_function.reward_kwargs``, an ``Authorization`` header. A key
is secret when its name (case and ``-``/``_`` aside) is or ends in ``api_key``, ``apikey``,
``access_key``, ``private_key``, ``token`` (``hf_token``, ``auth_token``; not a tokenizer's
``pad_token``/``eos_token``/...), contains ``secret`` or ``password``/``passwd``, or is
``authorization``, ``auth``, ``cookie``, ``credentials``. Column names such as ``prompt_key``
are not secrets and do not match.

:func:`redact` replaces every such value (at any depth) by :data:`REDACTED`, and the password
of a ``scheme://user:password@host`` URL anywhere in the tree; the config printer
(``hybridflow config``) and the trackers (``Tracking(config=...)``: W&B) apply it. A config
holding :data:`REDACTED` as a secret's value — a printed config fed back as ``--config`` — is
refused at load (:func:`redacted_secrets`), so the placeholder is never sent as a real key:
the key must come from the user's current config, an override, or ``${oc.env:VAR}``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"

_TOKENIZER_TOKENS = frozenset(
    {
        "pad_token",
        "eos_token",
        "bos_token",
        "unk_token",
        "sep_token",
        "cls_token",
        "mask_token",
        "additional_special_token",
        "special_token",
    }
)
_SECRET_NAME = re.compile(
    r"(^|_)(api_?key|access_?key|private_?key|token)$"
    r"|secret|password|passwd"
    r"|^(authorization|auth|cookie|credentials?|bearer)$"
)
# scheme://user:password@host — the password part, up to the '@'
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)(?P<password>[^/\s@]+)(?P<at>@)")


def is_secret_key(name: str) -> bool:
    """Whether a config key of this name holds a secret (see the module docstring)."""
    key = name.strip().lower().replace("-", "_")
    if key in _TOKENIZER_TOKENS:
        return False
    return bool(_SECRET_NAME.search(key))


def redact(value: Any) -> Any:
    """A copy of ``value`` (plain dicts, lists, scalars: ``to_dict`` output) with secrets hidden.

    A secret key's value becomes :data:`REDACTED` unless it is empty (``None``, ``""``): an
    unset key is shown as unset. Strings elsewhere keep everything but a URL's password.
    """
    if isinstance(value, Mapping):
        return {k: _redacted_value(v) if is_secret_key(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return _URL_PASSWORD.sub(lambda m: m["head"] + REDACTED + m["at"], value)
    return value


def _redacted_value(value: Any) -> Any:
    return value if value is None or value == "" else REDACTED


def redacted_secrets(tree: Any, prefix: str = "") -> list[str]:
    """Dotted keys of ``tree`` whose secret value is the :data:`REDACTED` placeholder (or a URL
    whose password is): values copied from a redacted print-out, not real keys."""
    found: list[str] = []
    if isinstance(tree, Mapping):
        for key, value in tree.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, str) and ((is_secret_key(str(key)) and value == REDACTED) or f":{REDACTED}@" in value):
                found.append(path)
            else:
                found += redacted_secrets(value, path)
    elif isinstance(tree, (list, tuple)):
        for i, value in enumerate(tree):
            found += redacted_secrets(value, f"{prefix}[{i}]")
    return found

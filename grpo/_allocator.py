"""Keep freed memory in the process heap, so large tensors are not page-faulted in on every call.

glibc returns each freed block above its mmap threshold (a few MB after warm-up) to the OS;
allocating it again costs a page fault per 4 KiB, and ``evaluate`` allocates dozens of (B, T)
tensors per call. Raising the thresholds once halves its time on a 256 x 4096 batch (see
bench/core.py). It changes the whole process's allocator, so the program decides: the CLI and
bench/core.py call ``keep_freed_memory()``; ``import grpo`` never does. Set
GRPO_LENS_KEEP_MALLOC=1 to leave the allocator alone even then.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
applied = False
"""True once keep_freed_memory() has changed this process's allocator."""


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds; True when it took effect."""
    global applied
    if os.environ.get("GRPO_LENS_KEEP_MALLOC") or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        return False
    ok_mmap = mallopt(M_MMAP_THRESHOLD, 512 * 1024 * 1024)
    ok_trim = mallopt(M_TRIM_THRESHOLD, 1024 * 1024 * 1024)
    applied = bool(ok_mmap and ok_trim)
    return applied

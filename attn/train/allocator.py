"""Keep freed memory for reuse, so a training step does not page-fault its arrays in afresh.

numpy takes every array from malloc. glibc serves a request above its mmap
threshold (128 KiB at start, raised as large blocks are freed) with a fresh
mmap and unmaps it on free, and hands heap memory above its trim threshold
back to the kernel. A training step creates and drops the same large
temporaries every step (X, [K V], the embedding gathers), so each step
faults them in again, page by page (docs/bench.md's devices table gives
what that costs a sweep). Fixing both
thresholds with mallopt keeps freed blocks in the heap for the next step
(up to 32 MiB a block, glibc's ceiling on 64-bit); the price is that the
process keeps its peak heap until it exits.

A process-wide setting: every stack of runs calls `keep_freed_memory()`
(attn.train.lifecycle.execute_stack), and so do the benchmarks; it does nothing where the C
library has no glibc mallopt (macOS, musl).
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 2**20  # the largest value glibc accepts on 64-bit
TRIM_THRESHOLD = 2**31 - 1  # never trim


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds; True if the C library took both."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):  # TypeError: Windows' CDLL(None)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1

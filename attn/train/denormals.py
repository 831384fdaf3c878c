"""Flush subnormal floats to zero while training, as XLA and TensorFlow do on CPU.

A saturated softmax (the unscaled head at large d_k, and every head once it
has learned) passes back gradients of W_q, W_k of 1e-30 and below in
float32. Their products with the d_k-wide weights, and the optimiser's
update, land below float32's smallest normal number (1.2e-38), and x86 CPUs
compute with such subnormal operands and results in microcode, many times
slower than with normal ones (`attn bench` times the two side by side).
With the SSE control register's flush-to-zero and denormals-are-zero bits
set, they are 0 instead.

What that changes: a value below 1.2e-38 in float32 (2.2e-308 in float64)
is 0. SGD moves a weight w by lr * grad, lost in w's rounding unless it is
above about 6e-8 |w|, so a weight is moved by a flushed update only if it
is itself below ~1e-30. Norms are summed in float64 (attn.optim,
attn.model.mechanism), so a logged gradient norm reads 0 only when every
entry was below 1.2e-38. Bit-exact runs are promised per platform, and a
run's provenance says which mode it was made in (`training_mode`).

The mode belongs to a thread. `flushing()` sets it on the thread that
trains (attn.train.lifecycle.execute_stack) and restores it after; BLAS's
own threads take the mode of the thread that starts them, when numpy
loads, so the command line sets it before numpy loads (attn.cli) and a
process that did not trains fully flushed only with one BLAS thread (as a
sweep's workers do). Only on 64-bit x86 with glibc (the MXCSR is the last
4 bytes of its fenv_t); elsewhere nothing changes. numpy is not imported
here: the command line imports this module before numpy loads.
"""

from __future__ import annotations

import ctypes
import platform
import struct
import sys
from contextlib import contextmanager

FTZ_DAZ = 0x8040  # MXCSR bits: flush to zero (15), denormals are zero (6)


class _Environment(ctypes.Structure):
    """glibc's x86-64 fenv_t: the x87 environment (28 bytes), then the MXCSR."""

    _fields_ = [("x87", ctypes.c_uint8 * 28), ("mxcsr", ctypes.c_uint32)]


def _libm():
    if platform.machine() not in ("x86_64", "AMD64") or struct.calcsize("P") != 8 or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libm.so.6")
    except OSError:
        return None


_LIBM = _libm()
_before_numpy = False  # flushing was set before numpy loaded: BLAS's threads flush too


def _bits(new: int | None = None) -> int | None:
    """This thread's FTZ and DAZ bits; with `new`, set them to it first and
    return the bits before (None where they cannot be read, or set)."""
    environment = _Environment()
    if _LIBM is None or _LIBM.fegetenv(ctypes.byref(environment)) != 0:
        return None
    before = environment.mxcsr & FTZ_DAZ
    if new is None:
        return before
    environment.mxcsr = environment.mxcsr & ~FTZ_DAZ | new
    if _LIBM.fesetenv(ctypes.byref(environment)) != 0 or _bits() != new:
        return None
    return before


def _set(flush: bool) -> int | None:
    """This thread's mode set; the bits before. numpy computes a float type's
    limits on first use (np.finfo) and keeps them; computed while flushing,
    the smallest subnormal comes out 0, with a warning: so they are computed
    first, with subnormals kept."""
    global _before_numpy
    if flush and "numpy" in sys.modules:
        import numpy as np

        kept = _bits(0)
        for dtype in (np.float32, np.float64):
            np.finfo(dtype)
        _bits(kept)
    elif flush:
        _before_numpy = _bits() is not None
    return _bits(FTZ_DAZ if flush else 0)


def set_flushing(flush: bool) -> bool | None:
    """Set this thread's mode; returns whether it was flushing (None: cannot be set here)."""
    before = _set(flush)
    return None if before is None else before == FTZ_DAZ


@contextmanager
def flushing(flush: bool = True):
    """This thread's mode set to `flush` inside, its bits as before after."""
    before = _set(flush)
    try:
        yield
    finally:
        if before is not None:
            _bits(before)


def can_flush() -> bool:
    """Whether this platform can flush subnormals (64-bit x86 with glibc)."""
    return _bits() is not None


def training_mode(blas_threads: int) -> str:
    """What training in this process does, for a run's provenance."""
    if not can_flush():
        return "kept"
    if _before_numpy or blas_threads <= 1:
        return "flushed to zero"
    return f"flushed to zero on the training thread, kept on BLAS's {blas_threads - 1} other thread(s)"

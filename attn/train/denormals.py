"""Flush subnormal floats to zero while training, as XLA and TensorFlow do on CPU.

A saturated softmax (the unscaled head at large d_k, and every head once it
has learned) passes back gradients of W_q, W_k of 1e-30 and below in
float32. Their products with the d_k-wide weights, and the optimiser's
update, land below float32's smallest normal number (1.2e-38), and x86 CPUs
compute with such subnormal operands and results in microcode, many times
slower than with normal ones (`attn bench --sizes saturated` measures it).
With the SSE control register's flush-to-zero and denormals-are-zero bits
set, they are 0 instead.

What that changes: a value below 1.2e-38 in float32 (2.2e-308 in float64)
is 0. SGD moves a weight w by lr * grad, lost in w's rounding unless it is
above about 6e-8 |w|, so a weight is moved by a flushed update only if it
is itself below ~1e-30; a logged gradient norm whose entries are all
subnormal reads 0. Bit-exact runs are promised per platform, and a run's
provenance says which mode it ran in (`training_mode`).

The mode belongs to a thread. `flushing()` sets it, and restores it after,
on the thread that trains; BLAS's own threads take the mode of the thread
that starts them, when numpy loads, so the command line sets it before
(attn.cli). Only on x86-64 with glibc (the MXCSR is the last 4 bytes of
its fenv_t); elsewhere nothing changes and `training_mode` says "kept". numpy
is not imported here: the command line imports this module before numpy loads.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from contextlib import contextmanager

FTZ_DAZ = 0x8040  # MXCSR bits: flush to zero (15), denormals are zero (6)


class _Environment(ctypes.Structure):
    """glibc's x86-64 fenv_t: the x87 environment (28 bytes), then the MXCSR."""
    _fields_ = [("x87", ctypes.c_uint8 * 28), ("mxcsr", ctypes.c_uint32)]


def _libm():
    if platform.machine() not in ("x86_64", "AMD64") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libm.so.6")
    except OSError:
        return None


_LIBM = _libm()


def _environment() -> _Environment | None:
    environment = _Environment()
    if _LIBM is None or _LIBM.fegetenv(ctypes.byref(environment)) != 0:
        return None
    return environment


def set_flushing(flush: bool) -> bool | None:
    """Set this thread's mode; returns the mode it had (None: cannot be set here)."""
    environment = _environment()
    if environment is None:
        return None
    if flush and "numpy" in sys.modules:
        _keep_numpy_limits()
    before = environment.mxcsr & FTZ_DAZ == FTZ_DAZ
    environment.mxcsr = environment.mxcsr | FTZ_DAZ if flush else environment.mxcsr & ~FTZ_DAZ
    return before if _LIBM.fesetenv(ctypes.byref(environment)) == 0 else None


def _keep_numpy_limits() -> None:
    """numpy computes a float type's limits on first use (np.finfo) and keeps
    them; computed while flushing, the smallest subnormal comes out 0, with a
    warning. So compute them first, with subnormals kept."""
    import numpy as np

    environment = _environment()
    flushing_now = environment.mxcsr & FTZ_DAZ
    if flushing_now:
        environment.mxcsr &= ~FTZ_DAZ
        _LIBM.fesetenv(ctypes.byref(environment))
    for dtype in (np.float32, np.float64):
        np.finfo(dtype)
    if flushing_now:
        environment.mxcsr |= FTZ_DAZ
        _LIBM.fesetenv(ctypes.byref(environment))


@contextmanager
def flushing(flush: bool = True):
    """This thread's mode set to `flush` inside, as before after."""
    before = set_flushing(flush)
    try:
        yield
    finally:
        if before is not None:
            set_flushing(before)


def training_mode() -> str:
    """What training does on this platform, for a run's provenance: "flushed to zero" or "kept"."""
    return "flushed to zero" if _environment() is not None else "kept"

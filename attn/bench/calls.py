"""How many calls attn's training step makes: the per-call overhead that is the step at small sizes.

    numpy_calls(step, steps)     {(file, function): numpy calls} over `steps` calls of step(),
                                 whose arrays were made `counted`
    function_calls(step, steps)  every Python and C function call, as cProfile counts them

A numpy call is counted each time attn's own code (a frame in the attn
package) enters numpy:
- calls a numpy function (np.empty, np.concatenate, np.moveaxis, ...),
  whatever it calls inside numpy not counted again;
- calls a method of an array (a.sum(), a.reshape(...), a.swapaxes(...));
- applies a ufunc to an array: operators (a + b, a @ b, -a), in-place
  operators (a += b), comparisons and explicit ufuncs (np.exp(a, out=a),
  np.matmul(a, b, out=c));
- indexes an array or assigns into one (a[i], a[i] = v).
Not counted: reads of an array's attributes (shape, dtype, flags) and
arithmetic on numpy scalars.

How. The arrays the step starts from (its parameters, optimiser state and
batches) are views of a subclass (`counted`) whose ufunc, index and
assignment hooks count, and whose results are again such views, so every
array the step makes from them is counted; numpy's functions are wrapped
while counting, their results made such views; array methods are seen
through sys.setprofile. A count is of code paths, not of time: the same
step gives the same count on any machine.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np

PACKAGE = str(Path(__file__).resolve().parents[1])  # attn/: the frames whose entries into numpy count
HERE = str(Path(__file__).resolve())


def _is_attn(frame) -> bool:
    filename = frame.f_code.co_filename
    return filename.startswith(PACKAGE) and filename != HERE


class _Tally:
    """The calls counted so far, by the attn function that made them (None: not counting)."""

    counts: Counter | None = None

    @classmethod
    def add(cls, frame) -> None:
        if cls.counts is not None and _is_attn(frame):
            cls.counts[(Path(frame.f_code.co_filename).name, frame.f_code.co_name)] += 1


def _plain(a):
    return a.view(np.ndarray) if isinstance(a, Counted) else a


def _counted(a):
    return a.view(Counted) if type(a) is np.ndarray else a


class Counted(np.ndarray):
    """An array whose ufunc applications, indexing and assignments are counted (module docstring)."""

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        _Tally.add(sys._getframe(1))
        if out is not None:
            kwargs["out"] = tuple(_plain(a) for a in out)
        result = getattr(ufunc, method)(*(_plain(a) for a in inputs), **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return tuple(map(_counted, result)) if isinstance(result, tuple) else _counted(result)

    def __getitem__(self, index):
        _Tally.add(sys._getframe(1))
        return _counted(np.ndarray.__getitem__(self.view(np.ndarray), index))

    def __setitem__(self, index, value):
        _Tally.add(sys._getframe(1))
        np.ndarray.__setitem__(self.view(np.ndarray), index, _plain(value))


def counted(a: np.ndarray) -> Counted:
    """A counted view of the same memory (in-place updates reach the original)."""
    return a.view(Counted)


def _wrapped(function: Callable) -> Callable:
    def call(*args, **kwargs):
        caller = sys._getframe(1)
        if not _is_attn(caller):
            return function(*args, **kwargs)
        _Tally.add(caller)
        result = function(*args, **kwargs)
        return tuple(map(_counted, result)) if isinstance(result, tuple) else _counted(result)

    return call


def _numpy_functions() -> dict[str, Callable]:
    """numpy's top-level functions (not its types, ufuncs or modules): those wrapped while counting."""
    return {
        name: value
        for name, value in vars(np).items()
        if callable(value) and not isinstance(value, (type, np.ufunc)) and not name.startswith("_")
    }


def _profile(frame, event, arg) -> None:
    if event == "c_call" and isinstance(getattr(arg, "__self__", None), np.ndarray):
        _Tally.add(frame)


def numpy_calls(step: Callable[[], object], steps: int = 1) -> Counter:
    """{(file, function): numpy calls} made by `steps` calls of step(), whose
    arrays were made `counted` (module docstring)."""
    functions = _numpy_functions()
    _Tally.counts = Counter()
    for name, function in functions.items():
        setattr(np, name, _wrapped(function))
    try:
        _profiled(_profile, step, steps)
    finally:
        for name, function in functions.items():
            setattr(np, name, function)
        counts, _Tally.counts = _Tally.counts, None
    return counts


def function_calls(step: Callable[[], object], steps: int = 1) -> int:
    """Every call of a Python or C function made by `steps` calls of step()
    (plain arrays), numpy's own inside it included: what cProfile counts."""
    made = [0]

    def profile(frame, event, arg) -> None:
        if event in ("call", "c_call"):
            made[0] += 1

    _profiled(profile, step, steps)
    return made[0] - steps - 1  # less the step() calls themselves and sys.setprofile(None)


def _profiled(profile: Callable, step: Callable[[], object], steps: int) -> None:
    """step() `steps` times with `profile` as the profiling function, and it removed however they end."""
    sys.setprofile(profile)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.setprofile(None)

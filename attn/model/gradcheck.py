"""Finite-difference gradient checks for any scalar function of arrays.

    numeric[i] = (8 [f(x + h e_i) - f(x - h e_i)] - [f(x + 2h e_i) - f(x - 2h e_i)]) / (12 h)
    rel_err[i] = |a - n| / max(1e-8, |a| + |n|)

That is the fourth-order central difference: its truncation error is
O(h^4) rather than O(h^2), so h can be 1e-3 instead of 1e-6, and the
rounding error, about |f| * 1e-16 / h, shrinks a thousandfold. With the
plain two-point rule, entries of the gradient near 1e-6 of |f| cannot be
checked to 1e-6 relative error at all.

Run it in float64: in float32 the differences drown in rounding. To check a
layer whose output is an array, reduce it with a random upstream gradient,
f = sum(out * dout), never with all ones (that would hide transposes and
sign errors that happen to cancel).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np


@dataclass(frozen=True)
class WorstEntry:
    """The entry of one array whose analytic and numeric gradients disagree most."""

    rel_error: float
    index: tuple[int, ...]
    analytic: float
    numeric: float


def relative_error(analytic: np.ndarray, numeric: np.ndarray) -> np.ndarray:
    """Elementwise |a - n| / max(1e-8, |a| + |n|)."""
    return np.abs(analytic - numeric) / np.maximum(1e-8, np.abs(analytic) + np.abs(numeric))


def numeric_gradient(f: Callable[[], float], x: np.ndarray, eps: float = 1e-3) -> np.ndarray:
    """Fourth-order central-difference gradient of f() w.r.t. x, perturbing x in place.

    f takes no arguments and reads x (and anything else) from its closure.
    x is restored exactly after each perturbation.
    """
    if x.dtype != np.float64:
        raise TypeError(f"gradient checks need float64 arrays, got {x.dtype}")
    grad = np.zeros_like(x)
    flat_x, flat_grad = x.reshape(-1), grad.reshape(-1)  # views
    for i in range(flat_x.size):
        original = flat_x[i]
        values = []
        for offset in (eps, -eps, 2 * eps, -2 * eps):
            flat_x[i] = original + offset
            values.append(float(f()))
        flat_x[i] = original
        f1, f_1, f2, f_2 = values
        flat_grad[i] = (8 * (f1 - f_1) - (f2 - f_2)) / (12 * eps)
    return grad


def check_gradients(
    f: Callable[[], float],
    arrays: Mapping[str, np.ndarray],
    analytic: Mapping[str, np.ndarray],
    eps: float = 1e-3,
) -> dict[str, WorstEntry]:
    """Compare `analytic[name]` with the numeric gradient of f() for each array.

    `arrays` are the float64 inputs f reads (perturbed in place, restored);
    returns name -> the worst entry, so `max(r.rel_error for r in ...)` is
    the check's verdict.
    """
    report = {}
    for name, x in arrays.items():
        numeric = numeric_gradient(f, x, eps)
        a = np.asarray(analytic[name], dtype=np.float64)
        if a.shape != x.shape:
            raise ValueError(f"{name}: analytic gradient has shape {a.shape}, array has {x.shape}")
        err = relative_error(a, numeric)
        worst = np.unravel_index(int(np.argmax(err)), err.shape)
        report[name] = WorstEntry(
            float(err[worst]), tuple(int(i) for i in worst), float(a[worst]), float(numeric[worst])
        )
    return report


def check_model(
    params: dict, loss_fn: Callable[[dict], tuple], eps: float = 1e-3, loss: Callable[[dict], float] | None = None
) -> dict[str, WorstEntry]:
    """Whole-model check: loss_fn(params) -> (loss, grads, ...) in float64.

    Perturbs every entry of every parameter and compares with the grads the
    model's backward pass returned for the unperturbed parameters. `loss`:
    params -> the same loss from the forward pass alone, so that the four
    evaluations per entry skip the backward pass (default: loss_fn's first value).
    """
    _, grads, *_ = loss_fn(params)
    value = loss or (lambda p: loss_fn(p)[0])
    return check_gradients(lambda: value(params), params, grads, eps)


def format_report(report: Mapping[str, WorstEntry]) -> str:
    """One line per array: its worst relative error and where."""
    return "\n".join(
        f"{name:>8}  worst rel err {r.rel_error:.2e} at {r.index}  "
        f"(analytic {r.analytic:+.6e}, numeric {r.numeric:+.6e})"
        for name, r in report.items()
    )

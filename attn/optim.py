"""Hand-written optimisers with their state kept as named arrays.

Parameters, gradients and optimiser state are dicts keyed by parameter name,
so an update is a loop over keys. Every update is in place. The learning
rate of parameter p is lr * lr_mult.get(p, 1).

A stack of M runs (attn.train.stack) steps as one: its parameters carry a leading
member axis, and lr (and any lr_mult value) may be one number per member,
(M,); Adam's step count t is then one per member too. Member m's update is
exactly the one it would get alone.

SGD (with weight decay wd, momentum mu, dampening 0):
    g = grad + wd * w
    heavy-ball:  b = mu * b + g;  w -= lr * b
    Nesterov:    b = mu * b + g;  w -= lr * (g + mu * b)
    plain:       w -= lr * g                              (mu = 0)

Adam (Kingma & Ba) / AdamW (Loshchilov & Hutter), t counts updates from 1:
    Adam:  g = grad + wd * w                 AdamW: w -= lr * wd * w first
    m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
    w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
"""

from __future__ import annotations

import math

import numpy as np

# The optimisers whose every update is linear in the weights and gradients, so that weights stay in the span
# of their initial rows (attn.model.widthfree): SGD, with momentum, Nesterov, weight decay, schedules, clipping.
SUBSPACE_OPTIMIZERS = ("sgd",)


def squared_norm(a: np.ndarray) -> float:
    """sum(a**2) accumulated in float64 by numpy's pairwise summation: float32
    arrays neither overflow nor lose precision, and unlike np.vdot (a BLAS dot)
    the result does not depend on the number of BLAS threads."""
    a64 = np.asarray(a, dtype=np.float64)  # a copy unless a is float64 already (an array or a scalar)
    squares = np.multiply(a64, a64, out=a64 if a64 is not a else None)  # in place when asarray copied
    return float(squares.sum())


def squared_norms(a: np.ndarray) -> np.ndarray:
    """squared_norm of each member's slice a[m], (M,): the squares formed for
    the whole stack at once, in float64 and C order (each entry's square the
    one squared_norm forms), then summed one reduction per member over its
    contiguous slice, as squared_norm sums a model's own, so a member's
    figure does not depend on the others (numpy orders a reduction over a
    stack by its shape)."""
    squares = np.array(a, dtype=np.float64, order="C")  # a copy: (M, ...), each member's slice contiguous
    np.multiply(squares, squares, out=squares)
    return np.array([member.sum() for member in squares])


def global_norm(grads: dict[str, np.ndarray]) -> float:
    """sqrt of the sum of squares of every gradient entry."""
    return math.sqrt(sum(squared_norm(g) for g in grads.values()))


def clip_by_global_norm(grads: dict[str, np.ndarray], max_norm, stacked: bool = False):
    """Scale all grads in place so their global norm is at most max_norm.
    Returns the norm before clipping. For a stack, norms and max_norm are
    one per member (a max_norm of inf never clips)."""
    if not stacked:
        norm = global_norm(grads)
        if norm > max_norm:
            factor = max_norm / norm
            for g in grads.values():
                g *= g.dtype.type(factor)
        return norm
    norms = np.sqrt(sum(squared_norms(g) for g in grads.values()))  # (M,)
    factor = np.where(norms > max_norm, max_norm / norms, 1.0)
    for g in grads.values():
        g *= per_member(factor, g)
    return norms


def per_member(value, w: np.ndarray) -> np.ndarray:
    """A scalar, or one value per member (M,), as w's dtype, shaped to
    broadcast over w (M, ...): the factor an update multiplies w's entries by."""
    if isinstance(value, float):  # one model's: a scalar of w's dtype, rounded as the array's would be
        return w.dtype.type(value)
    value = np.asarray(value, dtype=np.float64).astype(w.dtype)
    if value.ndim == 0:
        return value  # a 0-d array: numpy broadcasts it as a scalar, faster than a (1, 1) array
    return value.reshape(value.shape + (1,) * (w.ndim - value.ndim))


def learning_rate(
    step: int, base_lr: float, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float
) -> float:
    """lr for update number `step` (0-based).

    constant: base_lr after a linear warm-up over warmup_steps.
    cosine:   linear warm-up, then cosine decay from base_lr to
              min_lr_ratio * base_lr at total_steps.
    """
    if step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return base_lr
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return base_lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class Temporaries:
    """Arrays an update writes its intermediate results into, kept across
    steps (not optimiser state: nothing in them outlives a step), so that an
    update allocates no d_k-wide array per operation."""

    def __init__(self, count: int):
        self.count, self.arrays = count, {}

    def like(self, name: str, w: np.ndarray) -> tuple[np.ndarray, ...]:
        """`count` arrays of w's shape and dtype for `name`, made again only
        when that changes (a stack whose members finished)."""
        arrays = self.arrays.get(name)
        if arrays is None or arrays[0].shape != w.shape or arrays[0].dtype != w.dtype:
            arrays = self.arrays[name] = tuple(np.empty_like(w) for _ in range(self.count))
        return arrays


class SGD:
    """SGD with optional heavy-ball or Nesterov momentum and L2 weight decay."""

    def __init__(
        self,
        params: dict,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        lr_mult: dict | None = None,
    ):
        self.momentum, self.nesterov, self.weight_decay = momentum, nesterov, weight_decay
        self.lr_mult = dict(lr_mult or {})
        self.state = {f"momentum/{n}": np.zeros_like(p) for n, p in params.items()} if momentum else {}
        self.temporaries = Temporaries(1)

    def step(self, params: dict, grads: dict, lr: float) -> None:
        rates = {}  # the rate per_member makes for a weight, formed once for all the weights that share it
        for name, w in params.items():
            g = grads[name]
            if self.weight_decay:
                g = g + w.dtype.type(self.weight_decay) * w
            shared = (name if name in self.lr_mult else None, w.ndim, w.dtype)
            if shared not in rates:
                rates[shared] = per_member(lr * self.lr_mult.get(name, 1.0), w)  # a float, or (M,) for a stack
            step_lr = rates[shared]
            if self.momentum:
                buf = self.state[f"momentum/{name}"]
                buf *= w.dtype.type(self.momentum)
                buf += g
                g = g + w.dtype.type(self.momentum) * buf if self.nesterov else buf
            w -= np.multiply(step_lr, g, out=self.temporaries.like(name, w)[0])


class Adam:
    """Adam, or AdamW with decoupled weight decay when `decoupled`."""

    def __init__(
        self,
        params: dict,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled: bool = False,
        lr_mult: dict | None = None,
    ):
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.weight_decay, self.decoupled = weight_decay, decoupled
        self.lr_mult = dict(lr_mult or {})
        self.state = {"t": np.zeros((), dtype=np.int64)}
        for n, p in params.items():
            self.state[f"m/{n}"] = np.zeros_like(p)
            self.state[f"v/{n}"] = np.zeros_like(p)
        self.temporaries = Temporaries(2)

    def step(self, params: dict, grads: dict, lr: float) -> None:
        self.state["t"] += 1
        t = self.state["t"].astype(np.float64)  # () or one per member (M,)
        bias1, bias2 = 1 - self.beta1**t, 1 - self.beta2**t
        for name, w in params.items():
            dt = w.dtype.type
            g = grads[name]
            step_lr = np.multiply(lr, self.lr_mult.get(name, 1.0))
            if self.weight_decay and self.decoupled:
                w -= per_member(step_lr * self.weight_decay, w) * w
            elif self.weight_decay:
                g = g + dt(self.weight_decay) * w
            m, v = self.state[f"m/{name}"], self.state[f"v/{name}"]
            scratch, update = self.temporaries.like(name, w)
            # the textbook's operations in its order, each into a buffer kept across steps (Temporaries)
            m *= dt(self.beta1)
            m += np.multiply(dt(1 - self.beta1), g, out=scratch)  # m = b1 m + (1 - b1) g
            v *= dt(self.beta2)
            np.multiply(g, g, out=scratch)
            scratch *= dt(1 - self.beta2)
            v += scratch  # v = b2 v + (1 - b2) g^2
            np.divide(v, per_member(bias2, w), out=scratch)
            np.sqrt(scratch, out=scratch)
            scratch += dt(self.eps)  # sqrt(v / (1 - b2^t)) + eps
            np.multiply(per_member(step_lr / bias1, w), m, out=update)
            update /= scratch
            w -= update  # w -= lr / (1 - b1^t) m / (sqrt(v / (1 - b2^t)) + eps)

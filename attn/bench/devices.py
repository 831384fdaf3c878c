"""The fast path's devices, each with what switching it off means: the plain computation it stands for.

    with switched_off(["lookups"]):   # the step computes as if attn.model had no lookups through the tables
        fast.loss_and_grads(...)

The library has no flags for them. A device is switched off here, from the bench's side, by putting its
plain alternative in place of its decision function (a cost rule answers "no") or of the function that is
the device, for as long as the block runs; the same loss comes out, to float rounding. A device that acts
once per process (flush-to-zero in a sweep, the allocator) is switched off in every process of a sweep through
ENVIRONMENT, which the sitecustomize module that `sweep_environment` writes reads when Python starts (a
sweep's workers are spawned, so a patch in the parent would not reach them).

attn.bench.device_gains measures what each saves, side by side with it off.
"""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from attn.config import loading
from attn.model import head, pairs
from attn.train import allocator, denormals

ENVIRONMENT = "ATTN_BENCH_DEVICES_OFF"  # comma-separated Device.key of the devices a sweep's processes switch off


@dataclass(frozen=True)
class Device:
    """One device of the fast path: where it is, what "off" computes instead, and its patches
    (module or class, attribute, plain replacement), which switched_off puts in place.
    `scope`: "step" (switchable between two calls of one process), "build" (the model is built
    so: its weights' shapes), or "process" (set once per process: measured by sweeps)."""

    key: str
    name: str
    where: str
    off: str
    patches: Callable[[], list[tuple[object, str, object]]]
    scope: str = "step"
    required: str | None = None  # why it stays whatever it saves, if it must


def _projected_only(B, P, T, D, d_k, d_v, width_free=False, normed=False) -> str:
    """choose_association with the bilinear form gone: the head as written."""
    return "projected"


def _never(*_args, **_kwargs) -> bool:
    return False


# choose_association is cached on its arguments, but its answer depends on keep_factored: while gradients are
# formed, the rule is asked again, through a cache of its own.
_choose_association_formed = functools.lru_cache(maxsize=64)(head.choose_association.__wrapped__)


def _row_major_product(keys, queries: np.ndarray) -> np.ndarray:
    """queries @ keys^T (..., P, T) as numpy lays it out (rows of T): head._key_major_product without
    the keys outermost; through the tables, the lookups summed in the scores' own layout."""
    if isinstance(keys, pairs.LazyEmbeddings):
        y = queries
        products = y.reshape(*y.shape[:-3], -1, y.shape[-1]) @ keys._table_transposed  # (*M, B P, V)
        return np.add.reduce(products.take(keys._flat_indices_for(y.shape[-2], keys_first=False)), axis=0)
    return queries @ keys.swapaxes(-1, -2)


def _row_major_cross_entropy(logits: np.ndarray, targets: np.ndarray, target_mask: np.ndarray):
    """pairs.cross_entropy_forward with the classes innermost, as the logits come: its cache the same."""
    z = logits - np.maximum.reduce(logits, axis=-1, keepdims=True)  # (*M, B, T, C)
    onehot = np.arange(z.shape[-1]) == targets[..., None]  # (*M, B, T, C) bool
    picked = np.add.reduce(z * onehot, axis=-1)
    np.exp(z, out=z)
    sum_exp = np.add.reduce(z, axis=-1)
    z /= sum_exp[..., None]
    counts = np.add.reduce(target_mask, axis=(-2, -1), keepdims=True)
    weight = np.divide(target_mask, counts, dtype=logits.dtype)
    loss = np.add.reduce((np.log(sum_exp) - picked) * weight, axis=(-2, -1), dtype=logits.dtype)
    return loss, (z, onehot, weight)


def _plain_product(like: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b in numpy's layout, whatever `like`'s (pairs._product_laid_out_as without the transpose)."""
    return a @ b


@contextlib.contextmanager
def _keeping_subnormals(flush: bool = True):
    """denormals.flushing that leaves the thread's mode as it is: subnormals kept, as numpy computes by default."""
    yield


DEVICES = (
    Device(
        "bilinear",
        "bilinear association",
        "attn.model.head.choose_association, head_costs",
        "the head as written (projected): K, V formed at every position, S = (s X_Q W_q) Kᵀ, out = (A V) W_o",
        lambda: [(head, "choose_association", _projected_only)],
    ),
    Device(
        "widthfree",
        "width-free head",
        "attn.model.widthfree; attn.config.loading.runs_width_free",
        "W_q, W_k (W_v, W_o) carried d_k wide, materialized",
        lambda: [(loading, "runs_width_free", _never)],
        scope="build",
        required="d_k 2^20 materialized needs 2 GiB a run: the headline's widest cells run only width-free",
    ),
    Device(
        "lookups",
        "lookups through the tables",
        "attn.model.pairs.LazyEmbeddings products, lookup_is_cheaper, MOVE_COST",
        "X formed (its rows gathered and summed), its products with the queries taken with X",
        lambda: [(head, "lookup_is_cheaper", _never)],
    ),
    Device(
        "factored",
        "gradients kept as factors",
        "attn.model.pairs.Factored, keep_factored; head._key_value_backward",
        "dX formed (B, T, D); the embeddings' gradient one one-hot product",
        lambda: [(head, "keep_factored", _never), (head, "choose_association", _choose_association_formed)],
    ),
    Device(
        "merged",
        "merged maps",
        "attn.model.pairs.merge_is_cheaper, factorised_linear_forward",
        "always chained, (x U) V: W_QK = W_q W_kᵀ and W_OV = W_v W_o never formed",
        lambda: [(pairs, "merge_is_cheaper", _never)],
    ),
    Device(
        "keymajor",
        "key-major layouts",
        "attn.model.head._key_major_product, LazyEmbeddings.key_major_product; "
        "pairs.cross_entropy_forward (classes outermost)",
        "S = Q Kᵀ and the logits' softmax in numpy's own layout (keys, classes innermost)",
        lambda: [
            (head, "_key_major_product", _row_major_product),
            (pairs, "cross_entropy_forward", _row_major_cross_entropy),
        ],
    ),
    Device(
        "weightlayout",
        "gradients in their weight's layout",
        "attn.model.pairs._product_laid_out_as",
        "dW_k = a @ b in numpy's layout, whatever W_kᵀ's",
        lambda: [(pairs, "_product_laid_out_as", _plain_product)],
        required="without it a stacked run's numbers differ in the last bits from the same run alone "
        "(tests/test_reference_loop)",
    ),
    Device(
        "ftz",
        "flush-to-zero",
        "attn.train.denormals",
        "subnormal floats kept (numpy's default): computed in microcode",
        lambda: [(denormals, "flushing", _keeping_subnormals), (denormals, "set_flushing", _never)],
        scope="process",
    ),
    Device(
        "allocator",
        "the allocator",
        "attn.train.allocator.keep_freed_memory",
        "glibc's own thresholds: large temporaries mapped and unmapped each step",
        lambda: [(allocator, "keep_freed_memory", _never)],
        scope="process",
    ),
)
BY_KEY = {device.key: device for device in DEVICES}


@contextlib.contextmanager
def switched_off(keys):
    """Inside, the devices of `keys` (Device.key) are off: their plain alternatives in their place."""
    patches = [patch for key in keys for patch in BY_KEY[key].patches()]
    before = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    try:
        for owner, name, plain in patches:
            setattr(owner, name, plain)
        yield
    finally:
        for owner, name, value in reversed(before):
            setattr(owner, name, value)


def switch_off_from_environment() -> list[str]:
    """Switch off, for the rest of this process, the devices ENVIRONMENT names; the keys switched off."""
    keys = [key for key in os.environ.get(ENVIRONMENT, "").split(",") if key]
    unknown = [key for key in keys if key not in BY_KEY]
    if unknown:
        raise ValueError(f"{ENVIRONMENT}: got {', '.join(unknown)}; expected some of {', '.join(BY_KEY)}")
    for owner, name, plain in (patch for key in keys for patch in BY_KEY[key].patches()):
        setattr(owner, name, plain)
    return keys


SITECUSTOMIZE = f"""import os
if os.environ.get({ENVIRONMENT!r}):
    from attn.bench import devices
    devices.switch_off_from_environment()
"""


def sweep_environment(keys, directory: Path, code: Path) -> dict:
    """The environment of a sweep whose every process (its workers too) runs with the devices of `keys`
    off: a sitecustomize.py written into `directory` that switches them off when Python starts."""
    (Path(directory) / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {"PYTHONPATH": f"{code}{os.pathsep}{directory}", ENVIRONMENT: ",".join(keys)}

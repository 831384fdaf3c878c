"""The run configuration's schema: every field's type, default, description
and accepted values, as frozen dataclasses (Config and its sections), and
what can be read off the schema alone: its dotted keys, the nearest key to a
misspelt one, the fields that change no result, the fields only one task or
score mode reads, and its description for `attn config`.

Reading values into it (files, overrides, coercion, validation) is attn.config.loading.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import typing
from dataclasses import dataclass, field

from attn.config.yamlio import yaml_line
from attn.model.head import SCORE_SCALES
from attn.model.scores import SCORE_MODES


class FrozenMapping(collections.abc.Mapping):
    """A read-only dict (for optim.lr_mult), so a frozen config is frozen all the way down."""

    def __init__(self, items=()):
        self._items = dict(items)

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"FrozenMapping({self._items!r})"


def F(default, help: str, *, choices=None, ge=None, gt=None, le=None, lt=None, task=None, mode=None, score=None,
      neutral=False):
    """A schema field: its default, description and accepted range; for a task
    field, the one task that reads it (None: every task) and the one task.mode
    of that task that reads it (None: every mode); for a model field, the one
    score mode that reads it; `neutral`: it changes no logged number (where the
    run lives, which files it draws), so runs that differ only in such fields
    are the same experiment cell (RESULT_NEUTRAL_KEYS)."""
    meta = dict(help=help, choices=choices, ge=ge, gt=gt, le=le, lt=lt, task=task, mode=mode, score=score,
                neutral=neutral)
    if isinstance(default, dict):
        return field(default_factory=lambda: FrozenMapping(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = F(64, "width of the embeddings and of the head's output", gt=0)
    d_k: int = F(32, "width of queries and keys", gt=0)
    d_v: typing.Optional[int] = F(None, "width of values; null means d_k", gt=0)
    scale: str = F("sqrt", "score scale s in s*QK^T: sqrt = 1/sqrt(d_k), none = 1, linear = 1/d_k",
                   choices=tuple(SCORE_SCALES))
    causal: bool = F(False, "mask keys after the query (causal attention)")
    mask_self: bool = F(False, "retrieval: mask the query's own position out of its keys (-inf before the softmax)",
                        task="retrieval")
    residual: bool = F(True, "add the head's output to its input before the readout")
    positional: str = F("learned", "position information added to X (none: X is its tokens' embeddings alone)",
                        choices=("learned", "sinusoidal", "none"))
    qk_gain: float = F(1.0, "init gain of W_q and W_k: q, k components have variance qk_gain^2", gt=0)
    v_gain: float = F(1.0, "init gain of W_v", gt=0)
    o_gain: float = F(1.0, "init gain of W_o", gt=0)
    readout_gain: float = F(1.0, "init gain of the readout W_out", gt=0)
    score: str = F("dot", "how scores are made (attn.model.scores): dot = s q.k; qk_norm, softcap, temperature, mup, "
                   "sigma_reparam, log_length: the fixes", choices=SCORE_MODES)
    qk_norm: str = F("rms", "qk_norm: RMSNorm or LayerNorm of q and k over d_k", choices=("rms", "layer"),
                     score="qk_norm")
    qk_norm_gain: str = F("vector", "qk_norm: a learned gain per dimension, one scalar, or none",
                          choices=("vector", "scalar", "none"), score="qk_norm")
    softcap: float = F(10.0, "softcap: c in c tanh(s q.k / c)", gt=0, score="softcap")
    temperature_init: typing.Optional[float] = F(None, "temperature: theta at init (s = exp(theta)); null = ln of "
                                                 "model.scale's s", score="temperature")
    length_scale_init: typing.Optional[float] = F(None, "log_length: s_len at init; null = 1 / ln T", gt=0,
                                                  score="log_length")
    mup_zero_init_q: bool = F(True, "mup: W_q starts at zero (every score 0: uniform attention)", score="mup")


@dataclass(frozen=True)
class TaskConfig:
    name: str = F("retrieval", "which task", choices=("retrieval", "copy"))
    n_keys: int = F(16, "retrieval: number of distinct keys", gt=0, task="retrieval")
    n_values: int = F(16, "retrieval: number of distinct values (the classes)", ge=2, task="retrieval")
    n_pairs: int = F(8, "retrieval: (key, value) pairs per sequence; T = n_pairs + 1", ge=1, task="retrieval")
    vocab_size: int = F(16, "copy: number of distinct tokens (the classes)", ge=2, task="copy")
    length: int = F(8, "copy: sequence length T", ge=2, task="copy")
    mode: str = F("reverse", "copy: target i is input T-1-i (reverse) or (i+shift) mod T (shift)",
                  choices=("reverse", "shift"), task="copy")
    shift: int = F(1, "copy: offset for mode shift", ge=1, task="copy", mode="shift")
    eval_size: int = F(512, "examples in the fixed held-out evaluation set", gt=0)


@dataclass(frozen=True)
class OptimConfig:
    name: str = F("sgd", "optimiser", choices=("sgd", "adam", "adamw"))
    lr: float = F(0.5, "base learning rate", gt=0)
    momentum: float = F(0.0, "sgd: momentum (0 = plain SGD)", ge=0, lt=1)
    nesterov: bool = F(False, "sgd: Nesterov momentum instead of heavy-ball")
    weight_decay: float = F(0.0, "L2 decay (sgd, adam) or decoupled decay (adamw)", ge=0)
    beta1: float = F(0.9, "adam: first-moment decay", ge=0, lt=1)
    beta2: float = F(0.999, "adam: second-moment decay", ge=0, lt=1)
    eps: float = F(1e-8, "adam: denominator epsilon", gt=0)
    clip_norm: typing.Optional[float] = F(None, "clip gradients to this global norm; null = no clipping", gt=0)
    schedule: str = F("constant", "learning-rate schedule after warm-up", choices=("constant", "cosine"))
    warmup_steps: int = F(0, "linear warm-up steps", ge=0)
    min_lr_ratio: float = F(0.0, "cosine: final lr as a fraction of lr", ge=0, le=1)
    lr_mult: dict[str, float] = F({}, "per-parameter lr multipliers, e.g. {W_q: 0.1, W_k: 0.1}", gt=0)
    qk_lr_exponent: float = F(0.0, "W_q and W_k learn at lr * d_k^e (times lr_mult): e = -0.5 undoes the unscaled "
                              "model's larger effective rate; e = 1 is muP's SGD rule for W_q, W_k of width d_k")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = F(1500, "number of optimiser updates", gt=0)
    batch_size: int = F(64, "examples per update", gt=0)
    on_nonfinite: str = F("stop", "on a NaN/inf loss or gradient: stop the run, or continue and record it",
                          choices=("stop", "continue"))


@dataclass(frozen=True)
class LoggingConfig:
    log_every: int = F(25, "steps between metric records (each runs an evaluation)", gt=0)
    checkpoint_every: int = F(500, "steps between checkpoints", gt=0, neutral=True)
    plots: bool = F(True, "draw the run's figures when it ends", neutral=True)
    attention_examples: int = F(4, "evaluation examples kept for the attention heat-map", ge=0, neutral=True)
    mechanism_step: typing.Optional[int] = F(10, "measure each query row's saturation and gradient (attn.model.mechanism) "
                                             "at step 0 and at this step; null = never", ge=0)


@dataclass(frozen=True)
class Config:
    name: typing.Optional[str] = F(None, "run directory name under runs_dir; null = <config>-<time>", neutral=True)
    seed: int = F(0, "seed of every random draw (init, batches, eval set)", ge=0)
    dtype: str = F("float32", "floating-point type of the whole training path", choices=("float32", "float64"))
    runs_dir: str = F("runs", "where run directories are created", neutral=True)
    model: ModelConfig = field(default_factory=ModelConfig, metadata=dict(help="the model"))
    task: TaskConfig = field(default_factory=TaskConfig, metadata=dict(help="the task"))
    optim: OptimConfig = field(default_factory=OptimConfig, metadata=dict(help="the optimiser"))
    train: TrainConfig = field(default_factory=TrainConfig, metadata=dict(help="the training loop"))
    logging: LoggingConfig = field(default_factory=LoggingConfig, metadata=dict(help="what is recorded"))


def section_fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


_HINTS: dict[type, dict] = {}


def field_hints(cls) -> dict:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def all_keys(cls=None, prefix: str = "") -> list[str]:
    """Every dotted field name of the schema, e.g. 'optim.lr'."""
    cls = cls or Config
    keys = []
    for name, hint in field_hints(cls).items():
        if dataclasses.is_dataclass(hint):
            keys += all_keys(hint, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def _neutral_keys(cls=None, prefix: str = "") -> tuple[str, ...]:
    """The dotted names of the fields declared neutral (F(..., neutral=True))."""
    keys = ()
    for f in dataclasses.fields(cls or Config):
        hint = field_hints(cls or Config)[f.name]
        if dataclasses.is_dataclass(hint):
            keys += _neutral_keys(hint, f"{prefix}{f.name}.")
        elif f.metadata.get("neutral"):
            keys += (prefix + f.name,)
    return keys


RESULT_NEUTRAL_KEYS = _neutral_keys()  # runs that differ only in these are the same experiment cell


def nearest_key(key: str) -> str | None:
    """The valid dotted key (or section) closest to `key`, for 'did you mean' hints:
    a known leaf in the wrong place first (`lr` -> `optim.lr`), then the closest
    spelling, then the leaf closest in spelling."""
    keys = all_keys()
    leaf = key.rsplit(".", 1)[-1]
    leaves = {k.rsplit(".", 1)[-1]: k for k in keys}
    if leaf in leaves:
        return leaves[leaf]
    sections = [name for name, hint in field_hints(Config).items() if dataclasses.is_dataclass(hint)]
    match = difflib.get_close_matches(key, keys + (sections if "." not in key else []), n=1, cutoff=0.6)
    if match:
        return match[0]
    match = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.6)
    return leaves[match[0]] if match else None


def describe_accepted(hint, meta) -> str:
    base = typing.get_origin(hint)
    args = typing.get_args(hint)
    nullable = base is typing.Union and type(None) in args
    if nullable:
        hint = next(a for a in args if a is not type(None))
    if meta.get("choices"):
        text = "one of " + ", ".join(meta["choices"])
    elif typing.get_origin(hint) is dict:
        text = "a mapping of parameter name to a float"
    else:
        text = {int: "an integer", float: "a float", bool: "true or false", str: "a string"}[hint]
    bounds = [f"{op} {meta[k]}" for k, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
              if meta.get(k) is not None]
    if bounds and hint in (int, float):
        text += " " + " and ".join(bounds)
    elif bounds:
        text += " (values " + " and ".join(bounds) + ")"
    return text + (", or null" if nullable else "")


def to_dict(config) -> dict:
    """Nested plain dict of a config (for YAML output and comparisons)."""
    return {f.name: yaml_plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


def yaml_plain(value):
    """A field's value as plain YAML data."""
    if dataclasses.is_dataclass(value):
        return to_dict(value)
    return dict(value) if isinstance(value, FrozenMapping) else value


# Who decides whether a field is read: a field declared for one task (F's task=), one copy mode
# (mode=) or one score mode (score=) is read only when that setting has that value.
_DECIDERS = {"task": "task.name", "mode": "task.mode", "score": "model.score"}


def read_only_by() -> dict[str, tuple[str, str]]:
    """Dotted key -> (the setting that decides whether it is read, the value for which it is),
    for every field read only sometimes (copy's shift: by task.mode shift, which only copy has)."""
    out = {}
    for section, cls in (("task", TaskConfig), ("model", ModelConfig)):
        for f in dataclasses.fields(cls):
            for meta, decider in _DECIDERS.items():
                if f.metadata.get(meta):
                    out[f"{section}.{f.name}"] = (decider, f.metadata[meta])
    return out


def unread_keys(flat: dict) -> set[str]:
    """The keys of a flattened config (flatten_config) that nothing reads: the
    other task's fields, copy's shift outside mode shift, other score modes' fields."""
    return {key for key, (decider, value) in read_only_by().items()
            if flat.get(decider) != value or (key == "task.shift" and flat.get("task.name") != "copy")}


def describe_schema() -> list[tuple[str, str, str, str]]:
    """(dotted key, accepted values, default, description) for every field."""
    rows = []

    def walk(cls, prefix):
        hints = field_hints(cls)
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                walk(hint, prefix + f.name + ".")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            rows.append((prefix + f.name, describe_accepted(hint, dict(f.metadata)), yaml_line(yaml_plain(default)),
                         f.metadata["help"]))

    walk(Config, "")
    return rows

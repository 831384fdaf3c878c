"""The run configuration's schema: every field's type, default, description
and accepted values, as frozen dataclasses (Config and its sections), and
what can be read off the schema alone: its dotted keys, the nearest key to a
misspelt one, the keys declaring a fact (result-neutral, per stack member,
forkable, replicate), the fields only one task, score mode or optimiser reads, and its
description for `attn config`.

Reading values into it (files, overrides, coercion, validation) is attn.config.loading.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import typing
from dataclasses import dataclass, field

from attn.config.yamlio import closest, yaml_line
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


SET = "set"  # in config_field's unread_with: the field named has any value but null


def config_field(
    default,
    help: str,
    *,
    choices=None,
    ge=None,
    gt=None,
    le=None,
    lt=None,
    task=None,
    mode=None,
    score=None,
    unread_with=(),
    neutral=False,
    algorithm=False,
    replicate=False,
    per_member=False,
    forkable=False,
):
    """A config field, with every fact the rest of attn reads off it.

    default, help, choices and the bounds ge, gt, le, lt: its value, what it means, what is accepted.
    task, mode, score: the one task, task.mode or score mode that reads it (None: every one).
    unread_with: settings under which it is not read, each a mapping of dotted key to value
        (SET: any value but null), e.g. model.scale under model.score mup.
    neutral: it changes no logged number (where the run lives, which files it draws), so runs that
        differ only in it are one experiment cell.
    algorithm: it chooses how the same maths is computed (its rounding, not its model). A report
        counts a run made either way as the cell's and says which. A sweep never resumes one as the other.
    replicate: runs that differ only in it are replicates of one setting (the seed).
    per_member: the members of one stack may differ in it.
    forkable: True if a fork may change it; else the reason it may not, where the generic one
        (shapes, optimiser state, data) does not apply."""
    meta = dict(
        help=help,
        choices=choices,
        ge=ge,
        gt=gt,
        le=le,
        lt=lt,
        task=task,
        mode=mode,
        score=score,
        unread_with=tuple(unread_with),
        neutral=neutral,
        algorithm=algorithm,
        replicate=replicate,
        per_member=per_member,
        forkable=forkable,
    )
    if isinstance(default, dict):
        return field(default_factory=lambda: FrozenMapping(default), metadata=meta)
    return field(default=default, metadata=meta)


GAIN_MAX = 1e3  # an init gain's largest accepted: a policy, far above any gain that trains (init_scale's reach 4)
INIT_ONLY = "it is read only at initialisation, and a fork starts from the checkpoint's parameters"
SEED_FIXES_DATA = "the seed fixes the batches and the eval set, which a fork continues from its source"


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = config_field(64, "width of the embeddings and of the head's output", gt=0)
    d_k: int = config_field(32, "width of queries and keys", gt=0)
    d_v: typing.Optional[int] = config_field(
        32,
        "width of values; it does not follow d_k (the experiments vary the query-key circuit only); "
        "null, as runs made before it had a default recorded it, means d_k",
        gt=0,
    )
    scale: str = config_field(
        "sqrt",
        "score scale s in s*QK^T: sqrt = 1/sqrt(d_k), none = 1, linear = 1/d_k (not read by "
        "mup, log_length, or temperature with temperature_init set: their s is their own)",
        choices=tuple(SCORE_SCALES),
        unread_with=(
            {"model.score": "mup"},
            {"model.score": "log_length"},
            {"model.score": "temperature", "model.temperature_init": SET},
        ),
        per_member=True,
        forkable=True,
    )
    causal: bool = config_field(False, "mask keys after the query (causal attention)")
    mask_self: bool = config_field(
        False, "retrieval: mask the query's own position out of its keys (-inf before the softmax)", task="retrieval"
    )
    residual: bool = config_field(True, "add the head's output to its input before the readout")
    positional: str = config_field(
        "learned",
        "position information added to X (none: X is its tokens' embeddings alone)",
        choices=("learned", "sinusoidal", "none"),
    )
    qk_gain: float = config_field(
        1.0,
        "init gain of W_q and W_k: q, k components have variance qk_gain^2",
        gt=0,
        le=GAIN_MAX,
        per_member=True,
        forkable=INIT_ONLY,
    )
    qk_gain_exponent: float = config_field(
        0.0,
        "W_q and W_k start at gain qk_gain * d_k^e: e = -1/4 gives Var(q.k) = 1 at init without the scale, "
        "a width-independent setting for experiments over d_k (issue 45's factorial)",
        ge=-1,
        le=1,
        per_member=True,
        forkable=INIT_ONLY,
    )
    v_gain: float = config_field(1.0, "init gain of W_v", gt=0, le=GAIN_MAX, per_member=True, forkable=INIT_ONLY)
    o_gain: float = config_field(1.0, "init gain of W_o", gt=0, le=GAIN_MAX, per_member=True, forkable=INIT_ONLY)
    readout_gain: float = config_field(
        1.0, "init gain of the readout W_out", gt=0, le=GAIN_MAX, per_member=True, forkable=INIT_ONLY
    )
    score: str = config_field(
        "dot",
        "how scores are made (attn.model.scores): dot = s q.k; qk_norm, softcap, temperature, mup, "
        "sigma_reparam, log_length: the fixes",
        choices=SCORE_MODES,
    )
    qk_norm: str = config_field(
        "rms", "qk_norm: RMSNorm or LayerNorm of q and k over d_k", choices=("rms", "layer"), score="qk_norm"
    )
    qk_norm_gain: str = config_field(
        "vector",
        "qk_norm: a learned gain per dimension, one scalar, or none",
        choices=("vector", "scalar", "none"),
        score="qk_norm",
    )
    softcap: float = config_field(10.0, "softcap: c in c tanh(s q.k / c)", gt=0, le=1e6, score="softcap")
    temperature_init: typing.Optional[float] = config_field(
        None,
        "temperature: theta at init (s = exp(theta)); null = ln of model.scale's s",
        ge=-20,
        le=20,
        score="temperature",
        forkable=INIT_ONLY,
    )
    length_scale_init: typing.Optional[float] = config_field(
        None, "log_length: s_len at init; null = 1 / ln T", gt=0, le=1e6, score="log_length", forkable=INIT_ONLY
    )
    mup_zero_init_q: bool = config_field(
        True, "mup: W_q starts at zero (every score 0: uniform attention)", score="mup", forkable=INIT_ONLY
    )
    width_free: bool = config_field(
        True,
        "carry W_q, W_k (W_v, W_o) wider than 2 d_model as coordinates over their initial "
        "span when the optimiser and score mode keep them there and it is cheaper "
        "(attn.model.widthfree); false: always the d_k-wide weights",
        algorithm=True,
    )


@dataclass(frozen=True)
class TaskConfig:
    name: str = config_field("retrieval", "which task", choices=("retrieval", "copy"))
    n_keys: int = config_field(16, "retrieval: number of distinct keys", gt=0, task="retrieval")
    n_values: int = config_field(16, "retrieval: number of distinct values (the classes)", ge=2, task="retrieval")
    n_pairs: int = config_field(
        8, "retrieval: (key, value) pairs per sequence; T = n_pairs + 1", ge=1, task="retrieval"
    )
    vocab_size: int = config_field(16, "copy: number of distinct tokens (the classes)", ge=2, task="copy")
    length: int = config_field(8, "copy: sequence length T", ge=2, task="copy")
    mode: str = config_field(
        "reverse",
        "copy: target i is input T-1-i (reverse) or (i+shift) mod T (shift)",
        choices=("reverse", "shift"),
        task="copy",
    )
    shift: int = config_field(1, "copy: offset for mode shift", ge=1, task="copy", mode="shift")
    eval_size: int = config_field(512, "examples in the fixed held-out evaluation set", gt=0)


SGD, ADAM = ({"optim.name": "sgd"},), ({"optim.name": "adam"}, {"optim.name": "adamw"})  # unread_with an optimiser


@dataclass(frozen=True)
class OptimConfig:
    name: str = config_field("sgd", "optimiser", choices=("sgd", "adam", "adamw"))
    lr: float = config_field(0.5, "base learning rate", gt=0, per_member=True, forkable=True)
    momentum: float = config_field(0.0, "sgd: momentum (0 = plain SGD)", ge=0, lt=1, unread_with=ADAM)
    nesterov: bool = config_field(
        False,
        "sgd: Nesterov momentum instead of heavy-ball",
        forkable=True,
        unread_with=(*ADAM, {"optim.momentum": 0.0}),
    )
    weight_decay: float = config_field(0.0, "L2 decay (sgd, adam) or decoupled decay (adamw)", ge=0, forkable=True)
    beta1: float = config_field(0.9, "adam: first-moment decay", ge=0, lt=1, forkable=True, unread_with=SGD)
    beta2: float = config_field(0.999, "adam: second-moment decay", ge=0, lt=1, forkable=True, unread_with=SGD)
    eps: float = config_field(1e-8, "adam: denominator epsilon", gt=0, forkable=True, unread_with=SGD)
    clip_norm: typing.Optional[float] = config_field(
        None, "clip gradients to this global norm; null = no clipping", gt=0, per_member=True, forkable=True
    )
    schedule: str = config_field(
        "constant",
        "learning-rate schedule after warm-up",
        choices=("constant", "cosine"),
        per_member=True,
        forkable=True,
    )
    warmup_steps: int = config_field(0, "linear warm-up steps", ge=0, per_member=True, forkable=True)
    min_lr_ratio: float = config_field(
        0.0,
        "cosine: final lr as a fraction of lr",
        ge=0,
        le=1,
        per_member=True,
        forkable=True,
        unread_with=({"optim.schedule": "constant"},),
    )
    lr_mult: dict[str, float] = config_field(
        {}, "per-parameter lr multipliers, e.g. {W_q: 0.1, W_k: 0.1}", gt=0, per_member=True, forkable=True
    )
    qk_lr_exponent: float = config_field(
        0.0,
        "W_q and W_k learn at lr * d_k^e (times lr_mult): unscaled, e = -0.5 gives W_q, W_k the scaled head's "
        "SGD step and e = -1 gives it to the scores; e = 1 is muP's SGD rule for W_q, W_k of width d_k",
        ge=-2,
        le=2,
        per_member=True,
        forkable=True,
    )


@dataclass(frozen=True)
class TrainConfig:
    steps: int = config_field(1500, "number of optimiser updates", gt=0, per_member=True, forkable=True)
    batch_size: int = config_field(64, "examples per update", gt=0)
    on_nonfinite: str = config_field(
        "stop",
        "on a NaN/inf loss or gradient: stop the run, or continue and record it",
        choices=("stop", "continue"),
        per_member=True,
        forkable=True,
    )


@dataclass(frozen=True)
class LoggingConfig:
    log_every: int = config_field(
        25,
        "steps between metric records (each runs an evaluation)",
        gt=0,
        per_member=True,
        forkable="a fork keeps its source's records before the fork",
    )
    checkpoint_every: int = config_field(
        500, "steps between checkpoints", gt=0, neutral=True, per_member=True, forkable=True
    )
    keep_checkpoints: typing.Optional[int] = config_field(
        2,
        "checkpoints kept (checkpoint-<step>.npz, to resume or fork from): "
        "the last K; older ones are removed once a new one is written; "
        "null = every one (a sweep keeps 1 unless its experiment sets this)",
        ge=1,
        neutral=True,
        per_member=True,
        forkable=True,
    )
    keep_every: typing.Optional[int] = config_field(
        None,
        "also keep every checkpoint whose step is a multiple of this, for forks; null = none beyond keep_checkpoints",
        gt=0,
        neutral=True,
        per_member=True,
        forkable=True,
    )
    plots: bool = config_field(
        True, "draw the run's figures when it ends", neutral=True, per_member=True, forkable=True
    )
    attention_examples: int = config_field(
        4,
        "evaluation examples kept for the attention heat-map",
        ge=0,
        neutral=True,
        per_member=True,
        forkable="a fork keeps its source's attention snapshot at step 0",
    )
    mechanism_step: typing.Optional[int] = config_field(
        10,
        "measure each query row's saturation and gradient "
        "(attn.model.mechanism) at step 0 and at this step; null = never",
        ge=0,
        per_member=True,
        forkable=True,
    )
    mechanism_trace: bool = config_field(
        True,
        "also measure them at steps 0, 1, 2, 5, 10, 20, 50, ... and keep their medians "
        "(mechanism_trace.npz), for the run's mechanism figure",
        neutral=True,
        per_member=True,
        forkable=True,
    )


@dataclass(frozen=True)
class Config:
    name: typing.Optional[str] = config_field(
        None, "run directory name under runs_dir; null = <config>-<time>", neutral=True, per_member=True, forkable=True
    )
    seed: int = config_field(
        0,
        "seed of every random draw (init, batches, eval set)",
        ge=0,
        replicate=True,
        per_member=True,
        forkable=SEED_FIXES_DATA,
    )
    dtype: str = config_field(
        "float32", "floating-point type of the whole training path", choices=("float32", "float64")
    )
    runs_dir: str = config_field(
        "runs", "where run directories are created", neutral=True, per_member=True, forkable=True
    )
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


def declared(fact: str, cls=None) -> dict:
    """Dotted key -> the value of `fact` (a config_field keyword such as per_member) for every
    field declaring it, in schema order; read off the schema at call time, so
    stacking, forking and grouping follow a field's declaration."""
    return dict(_declared(fact, cls or Config))


@functools.lru_cache(maxsize=None)
def _declared(fact: str, cls, prefix: str = "") -> tuple:
    found = ()
    for f in dataclasses.fields(cls):
        hint = field_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            found += _declared(fact, hint, f"{prefix}{f.name}.")
        elif f.metadata.get(fact):
            found += ((prefix + f.name, f.metadata[fact]),)
    return found


def neutral_keys() -> tuple[str, ...]:
    """Runs that differ only in these are the same experiment cell."""
    return tuple(declared("neutral"))


def algorithm_keys() -> tuple[str, ...]:
    """Runs that differ only in these computed the same maths another way: one cell in a report."""
    return tuple(declared("algorithm"))


def per_member_keys() -> tuple[str, ...]:
    """The keys in which the members of one stack may differ; they share every other."""
    return tuple(declared("per_member"))


def fork_keys() -> tuple[str, ...]:
    """The keys a fork may change."""
    return tuple(k for k, v in declared("forkable").items() if v is True)


def not_forked_because() -> dict[str, str]:
    """Key -> why a fork may not change it, for the keys that declare a reason of their own."""
    return {k: v for k, v in declared("forkable").items() if isinstance(v, str)}


def replicate_keys() -> tuple[str, ...]:
    """Runs that differ only in these are replicates of one setting (the seeds)."""
    return tuple(declared("replicate"))


def nearest_key(key: str) -> str | None:
    """The valid dotted key (or section) closest to `key`, for 'did you mean' hints:
    a known leaf in the wrong place first (`lr` -> `optim.lr`), then the closest
    spelling, then the leaf closest in spelling. None for a valid key or
    section: refused where it stands, it is no misspelling to correct."""
    keys = all_keys()
    sections = [name for name, hint in field_hints(Config).items() if dataclasses.is_dataclass(hint)]
    if key in keys or key in sections:
        return None
    leaf = key.rsplit(".", 1)[-1]
    leaves = {k.rsplit(".", 1)[-1]: k for k in keys}
    if leaf in leaves:
        return leaves[leaf]
    match = closest(key, keys + (sections if "." not in key else []))
    if match:
        return match[0]
    match = closest(leaf, leaves)
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
    bounds = [
        f"{op} {meta[k]}" for k, op in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")) if meta.get(k) is not None
    ]
    if bounds and hint in (int, float):
        text += " " + " and ".join(bounds)
    elif bounds:
        text += " (values " + " and ".join(bounds) + ")"
    return text + (", or null" if nullable else "")


def to_dict(config) -> dict:
    """Nested plain dict of a config (for YAML output and comparisons)."""
    return {f.name: to_plain_yaml(getattr(config, f.name)) for f in dataclasses.fields(config)}


def to_plain_yaml(value):
    """A field's value as plain YAML data."""
    if dataclasses.is_dataclass(value):
        return to_dict(value)
    return dict(value) if isinstance(value, FrozenMapping) else value


# Who decides whether a field is read: a field declared for one task (config_field's task=), one copy mode
# (mode=) or one score mode (score=) is read only when that setting has that value.
_DECIDERS = {"task": "task.name", "mode": "task.mode", "score": "model.score"}


def read_only_by() -> dict[str, list[tuple[str, str]]]:
    """Dotted key -> every (setting, the value it must have) for the field to be read, for every
    field read only sometimes (copy's shift: task.name copy and task.mode shift)."""
    return {key: list(conditions) for key, conditions in _read_only_by(TaskConfig, ModelConfig)}


@functools.lru_cache(maxsize=None)
def _read_only_by(task_cls, model_cls) -> tuple:
    """read_only_by's (key, conditions) pairs, read off these section classes once (every config loaded asks)."""
    found = ()
    for section, cls in (("task", task_cls), ("model", model_cls)):
        for f in dataclasses.fields(cls):
            conditions = tuple(
                (decider, f.metadata[meta]) for meta, decider in _DECIDERS.items() if f.metadata.get(meta)
            )
            if conditions:
                found += ((f"{section}.{f.name}", conditions),)
    return found


def first_unmet_condition(key: str, flat: dict) -> tuple[str, str] | None:
    """The first (setting, value) of read_only_by()[key] that the flattened config does not meet."""
    return next(((d, v) for d, v in read_only_by().get(key, []) if flat.get(d) != v), None)


def unread_keys(flat: dict) -> set[str]:
    """The keys of a flattened config (flatten_config) that nothing reads: the
    other task's fields, copy's shift outside mode shift, other score modes' fields,
    and fields under one of their unread_with settings (unread_because)."""
    return {key for key in read_only_by() if first_unmet_condition(key, flat)} | {
        key for key in unread_with_keys() if unread_because(key, flat)
    }


def unread_with_keys() -> dict[str, tuple]:
    """Dotted key -> its config_field(unread_with=...) settings, for every field that has some."""
    return dict(_unread_with_keys(TaskConfig, ModelConfig, OptimConfig))


@functools.lru_cache(maxsize=None)
def _unread_with_keys(task_cls, model_cls, optim_cls) -> tuple:
    return tuple(
        (f"{section}.{f.name}", f.metadata["unread_with"])
        for section, cls in (("task", task_cls), ("model", model_cls), ("optim", optim_cls))
        for f in dataclasses.fields(cls)
        if f.metadata.get("unread_with")
    )


def unread_because(key: str, flat: dict) -> dict | None:
    """The unread_with setting of `key` that a flattened config has (its mapping), or None."""
    for setting in unread_with_keys().get(key, ()):
        if all(flat.get(k) is not None if v == SET else flat.get(k) == v for k, v in setting.items()):
            return setting
    return None


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
            rows.append(
                (
                    prefix + f.name,
                    describe_accepted(hint, dict(f.metadata)),
                    yaml_line(to_plain_yaml(default)),
                    f.metadata["help"],
                )
            )

    walk(Config, "")
    return rows

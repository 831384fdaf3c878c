"""The run configuration: a typed, validated, immutable schema read from YAML.

    config = load_config("configs/default.yaml", ["optim.lr=0.05", "seed=1"])

Every field has a type, a default, a one-line description and (where it
matters) accepted values; `describe_schema()` lists them. Anything wrong in
a file or an override raises `ConfigError` with one line naming the source,
the field, the bad value and what is accepted.

Files and override values are read by attn.yamlio (safe, bounded, YAML 1.2
core numbers: `1e-3` is a float); values are then coerced by the field's
type (a float field also accepts the string '1e-3'). Each override is typed
and checked as it is applied; the checks across fields (task.n_pairs <=
task.n_keys, lr_mult names, memory) see the final config, so the order of
overrides does not matter.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import math
import os
import typing
from dataclasses import dataclass, field

from attn.layers import SCORE_SCALES
from attn.scores import SCORE_MODES
from attn.yamlio import ConfigError, cut, parse_yaml, read_yaml_file, show_value, yaml_line

MAX_NAME_CHARS = 200  # run and experiment names; NAME_MAX is 255 bytes and `-<n>` suffixes are added


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
    residual: bool = F(True, "add the head's output to its input before the readout")
    positional: str = F("learned", "position information added to X (none: X is its tokens' embeddings alone)",
                        choices=("learned", "sinusoidal", "none"))
    qk_gain: float = F(1.0, "init gain of W_q and W_k: q, k components have variance qk_gain^2", gt=0)
    v_gain: float = F(1.0, "init gain of W_v", gt=0)
    o_gain: float = F(1.0, "init gain of W_o", gt=0)
    readout_gain: float = F(1.0, "init gain of the readout W_out", gt=0)
    score: str = F("dot", "how scores are made (attn.scores): dot = s q.k; qk_norm, softcap, temperature, mup, "
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
    mechanism_step: typing.Optional[int] = F(10, "measure each query row's saturation and gradient (attn.mechanism) "
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


# ---------------------------------------------------------------------------
# Schema walking, coercion, validation.
# ---------------------------------------------------------------------------
def _sections(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


_HINTS: dict[type, dict] = {}


def _hints(cls) -> dict:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def all_keys(cls=None, prefix: str = "") -> list[str]:
    """Every dotted field name of the schema, e.g. 'optim.lr'."""
    cls = cls or Config
    keys = []
    for name, hint in _hints(cls).items():
        if dataclasses.is_dataclass(hint):
            keys += all_keys(hint, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


def _neutral_keys(cls=None, prefix: str = "") -> tuple[str, ...]:
    """The dotted names of the fields declared neutral (F(..., neutral=True))."""
    keys = ()
    for f in dataclasses.fields(cls or Config):
        hint = _hints(cls or Config)[f.name]
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
    sections = [name for name, hint in _hints(Config).items() if dataclasses.is_dataclass(hint)]
    match = difflib.get_close_matches(key, keys + (sections if "." not in key else []), n=1, cutoff=0.6)
    if match:
        return match[0]
    match = difflib.get_close_matches(leaf, list(leaves), n=1, cutoff=0.6)
    return leaves[match[0]] if match else None


def _describe_accepted(hint, meta) -> str:
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


def _fail(source: str, key: str, value, hint, meta) -> typing.NoReturn:
    raise ConfigError(f"{source}: {key}: got {show_value(value)}; expected {_describe_accepted(hint, meta)}")


def _in_range(x, meta) -> bool:
    return not (
        (meta.get("gt") is not None and not x > meta["gt"])
        or (meta.get("ge") is not None and not x >= meta["ge"])
        or (meta.get("lt") is not None and not x < meta["lt"])
        or (meta.get("le") is not None and not x <= meta["le"])
    )


def _as_float(value):
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            return float(value.strip())
    except (ValueError, OverflowError):  # not a number; an integer beyond any float
        return None
    return None


def _coerce_scalar(value, hint):
    """Return the value as `hint`, or None if it cannot be one."""
    if hint is bool:
        return value if isinstance(value, bool) else None
    if hint is str:
        return value if isinstance(value, str) else None
    number = _as_float(value)
    if number is None or not math.isfinite(number):
        return None
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        return int(number) if number.is_integer() else None
    return number


def coerce(value, hint, meta, key: str, source: str):
    """Coerce a raw YAML value to a field's type and check its range."""
    if typing.get_origin(hint) is typing.Union:
        if value is None:
            return None
        inner = next(a for a in typing.get_args(hint) if a is not type(None))
        return coerce(value, inner, {**meta, "_outer": hint}, key, source)
    outer = meta.get("_outer", hint)
    if typing.get_origin(hint) is dict:
        if not isinstance(value, dict):
            _fail(source, key, value, outer, meta)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ConfigError(f"{source}: {key}: got key {show_value(k)}; expected parameter names such as W_q")
            if v is None and ":" in k:  # `{W_q:0.1}` is YAML for {"W_q:0.1": null}
                name, _, number = k.partition(":")
                raise ConfigError(f"{source}: {key}: got {{{cut(k)}}}; YAML needs a space after the colon: "
                                  f"{{{cut(name)}: {cut(number)}}}")
            number = _coerce_scalar(v, float)
            if number is None or not _in_range(number, meta):
                _fail(source, f"{key}.{k}", v, float, meta)
            out[k] = number
        return FrozenMapping(out)
    coerced = _coerce_scalar(value, hint)
    if coerced is None or (meta.get("choices") and coerced not in meta["choices"]):
        _fail(source, key, value, outer, meta)
    if hint in (int, float) and not _in_range(coerced, meta):
        _fail(source, key, value, outer, meta)
    return coerced


def build(cls, data: dict, source: str, prefix: str = ""):
    """Build a schema dataclass from a nested dict, coercing and validating."""
    hints = _hints(cls)
    fields = _sections(cls)
    kwargs = {}
    for key, value in data.items():
        dotted = prefix + str(key)
        if key not in hints:
            suggestion = nearest_key(dotted)
            hint = f"; did you mean `{suggestion}`?" if suggestion else ""
            raise ConfigError(f"{source}: unknown key `{cut(dotted)}`{hint}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: {dotted}: got {show_value(value)}; expected a mapping of {dotted}.* fields")
            kwargs[key] = build(hint, value, source, dotted + ".")
        else:
            kwargs[key] = coerce(value, hint, dict(fields[key].metadata), dotted, source)
    return cls(**kwargs)


def to_dict(config) -> dict:
    """Nested plain dict of a config (for YAML output and comparisons)."""
    return {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


def _plain(value):
    """A field's value as plain YAML data."""
    if dataclasses.is_dataclass(value):
        return to_dict(value)
    return dict(value) if isinstance(value, FrozenMapping) else value


def flatten_config(data: dict, prefix: str = "") -> dict:
    """A nested config dict (to_dict) as dotted key -> value; optim.lr_mult's mapping is one value."""
    out = {}
    for k, v in data.items():
        if isinstance(v, dict) and k != "lr_mult":
            out.update(flatten_config(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def replace(config: Config, **dotted_values) -> Config:
    """A copy of `config` with dotted fields replaced (values validated)."""
    return with_values(config, dotted_values, "replace")


def with_values(config: Config, values: dict, source: str) -> Config:
    """A copy of `config` with dotted fields set to raw values, each coerced
    and checked as in a file, then validate()d. Costs the fields changed, not
    the whole schema: a sweep makes one config per grid point this way."""
    sections: dict[str, dict] = {}
    for key, value in values.items():
        section, _, leaf = str(key).rpartition(".")
        sections.setdefault(section, {})[leaf] = field_value(str(key), value, source)
    top = sections.pop("", {})
    top.update({section: dataclasses.replace(getattr(config, section), **fields) for section, fields in sections.items()})
    return validate(dataclasses.replace(config, **top), source)


def field_value(key: str, value, source: str):
    """A raw value (as YAML reads it) coerced and checked as the field `key`
    takes it in a file; ConfigError for a key that is no field."""
    section, _, leaf = key.rpartition(".")
    owner = _hints(Config).get(section) if section else Config
    if not dataclasses.is_dataclass(owner) or leaf not in _hints(owner) or dataclasses.is_dataclass(_hints(owner)[leaf]):
        suggestion = nearest_key(key)
        hint = f"; did you mean `{suggestion}`?" if suggestion else ""
        raise ConfigError(f"{source}: unknown key `{cut(key)}`{hint}")
    return coerce(value, _hints(owner)[leaf], dict(_sections(owner)[leaf].metadata), key, source)


def set_dotted(data: dict, key: str, value) -> None:
    """data['a']['b'] = value for key 'a.b', creating sections as needed."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, object]:
    """'optim.lr=0.05' -> ('optim.lr', 0.05). The value is read as YAML."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    source = f"override {show_value(text)}"
    if not sep or not key or any(not part.isidentifier() for part in key.split(".")):
        raise ConfigError(f"{source}: expected key=value with a dotted key, e.g. optim.lr=0.05")
    value = parse_yaml(raw, source) if raw.strip() else ""
    if dataclasses.is_dataclass(_hints(Config).get(key)):
        raise ConfigError(f"{source}: `{key}` is a section; override one field, e.g. {key}.<field>=value")
    if key not in all_keys():
        suggestion = nearest_key(key)
        hint = f"; did you mean `{suggestion}`?" if suggestion else ""
        raise ConfigError(f"{source}: unknown key `{cut(key)}`{hint}")
    return key, value


def load_config(path: str | os.PathLike | None, overrides: typing.Sequence[str] = ()) -> Config:
    """Read a YAML config (or the defaults if path is None) and apply overrides."""
    data = read_yaml_file(path) if path is not None else {}
    data.pop("provenance", None)  # a run's config.yaml is a valid config
    source = str(path) if path is not None else "defaults"
    config = build(Config, data, source)
    for text in overrides:
        key, value = parse_override(text)
        merged = to_dict(config)
        set_dotted(merged, key, value)
        config = build(Config, merged, f"override {show_value(text)}")
    # Cross-field checks see the final config: `task.n_keys=4 task.n_pairs=4` works in either order.
    return validate(config, f"{source} with overrides {cut(' '.join(overrides))}" if overrides else source)


# ---------------------------------------------------------------------------
# Cross-field checks: impossible tasks, unknown parameter names, memory.
# ---------------------------------------------------------------------------
def param_names(config: Config) -> list[str]:
    from attn.model import score_param_shapes

    fields = ["key", "value"] if config.task.name == "retrieval" else ["token"]
    names = [f"E_{f}" for f in fields]
    if config.model.positional == "learned":
        names.append("E_pos")
    m = config.model
    return names + ["W_q", "W_k", "W_v", "W_o", "W_out", "b_out",
                    *score_param_shapes(m.score, m.qk_norm_gain, m.d_k)]


def estimate_memory_bytes(config: Config) -> int:
    """A generous estimate of a run's peak memory from its sizes."""
    m, t = config.model, config.task
    D, dk = m.d_model, m.d_k
    dv = m.d_v or dk
    T = t.n_pairs + 1 if t.name == "retrieval" else t.length
    V = t.n_keys + t.n_values + 1 if t.name == "retrieval" else t.vocab_size
    C = t.n_values if t.name == "retrieval" else t.vocab_size
    n_params = (V + T) * D + 2 * D * dk + 2 * D * dv + D * C + C
    per_example = T * (6 * D + 4 * dk + 4 * dv + 4 * C) + 4 * T * T
    largest_batch = max(config.train.batch_size, t.eval_size)
    itemsize = 4 if config.dtype == "float32" else 8
    sampling = 16 * largest_batch * t.n_keys if t.name == "retrieval" else 0  # float64 draws + int64 argsort
    return itemsize * (5 * n_params + largest_batch * per_example) + sampling


def memory_limit_bytes() -> int:
    """Half of this machine's physical memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


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


def _check_everything_set_is_read(config: Config, source: str) -> None:
    """A field set away from its default that the config's task or score mode never reads is an error."""
    flat, defaults = flatten_config(to_dict(config)), flatten_config(to_dict(Config()))
    for key in sorted(unread_keys(flat)):
        if flat[key] != defaults[key]:
            decider, value = read_only_by()[key]
            raise ConfigError(f"{source}: {key}: got {show_value(flat[key])}; read only with {decider} {value}, and "
                              f"{decider} is {flat[decider]}: remove it, or set {decider}={value}")


def validate(config: Config, source: str) -> Config:
    """Checks that involve more than one field."""
    _check_everything_set_is_read(config, source)
    t = config.task
    if t.name == "retrieval" and t.n_pairs > t.n_keys:
        raise ConfigError(f"{source}: task.n_pairs: got {t.n_pairs}; expected at most task.n_keys "
                          f"({t.n_keys}), since keys are distinct within a sequence")
    if t.name == "copy" and t.mode == "shift" and t.shift % t.length == 0:
        raise ConfigError(f"{source}: task.shift: got {t.shift}; expected a shift that is not a "
                          f"multiple of task.length ({t.length}), else the copy is the identity")
    names = param_names(config)
    for key in config.optim.lr_mult:
        if key not in names:
            suggestion = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean `{suggestion[0]}`?" if suggestion else ""
            raise ConfigError(f"{source}: optim.lr_mult.{key}: not a parameter of this model "
                              f"(parameters: {', '.join(names)}){hint}")
    if config.name is not None:
        check_run_name(config.name, f"{source}: name")
    if not config.runs_dir.strip():
        raise ConfigError(f"{source}: runs_dir: got {show_value(config.runs_dir)}; expected a directory path")
    need, limit = estimate_memory_bytes(config), memory_limit_bytes()
    if need > limit:
        m = config.model
        raise ConfigError(
            f"{source}: sizes need about {_gib(need)} of memory (model.d_model={m.d_model:.12g}, model.d_k={m.d_k:.12g}, "
            f"train.batch_size={config.train.batch_size:.12g}, task.eval_size={t.eval_size:.12g}); "
            f"expected at most {_gib(limit)} (half this machine's memory)")
    return config


def check_run_name(name, what: str) -> str:
    """The one rule for run and experiment names (--name, --resume's directory,
    a config's `name`, an experiment's `name`, a cell's name): a string of at
    most MAX_NAME_CHARS printable characters (no newline or other control
    character) that is one plain path component: no '/', '\\', NUL, not
    '.', '..' or hidden (a leading '.')."""
    if (not isinstance(name, str) or not name or name.startswith(".") or "/" in name or "\\" in name
            or not name.isprintable() or len(name) > MAX_NAME_CHARS):
        raise ConfigError(f"{what}: got {show_value(name, MAX_NAME_CHARS + 8)}; expected a plain directory name: one path component "
                          f"of printable characters (no '/', '\\', leading '.', or '..'), at most {MAX_NAME_CHARS} characters")
    return name


def describe_schema() -> list[tuple[str, str, str, str]]:
    """(dotted key, accepted values, default, description) for every field."""
    rows = []

    def walk(cls, prefix):
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                walk(hint, prefix + f.name + ".")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            rows.append((prefix + f.name, _describe_accepted(hint, dict(f.metadata)), yaml_line(_plain(default)),
                         f.metadata["help"]))

    walk(Config, "")
    return rows

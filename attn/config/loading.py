"""The run configuration read from YAML: values coerced into the schema (attn.config.schema), checked, frozen.

    config = load_config("configs/default.yaml", ["optim.lr=0.05", "seed=1"])

Every field has a type, a default, a one-line description and (where it
matters) accepted values (attn.config.schema; its describe_schema lists them). Anything wrong in
a file or an override raises `ConfigError` with one line naming the source,
the field, the bad value and what is accepted.

Files and override values are read by attn.config.yamlio (safe, bounded, YAML 1.2
core numbers: `1e-3` is a float); values are then coerced by the field's
type (a float field also accepts the string '1e-3'). Each override is typed
and checked as it is applied; the checks across fields (task.n_pairs <=
task.n_keys, lr_mult names, memory) see the final config, so the order of
overrides does not matter.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing

from attn import optim
from attn.config.schema import (
    SET,
    Config,
    FrozenMapping,
    all_keys,
    describe_accepted,
    field_hints,
    first_unmet_condition,
    nearest_key,
    section_fields,
    to_dict,
    unread_because,
    unread_keys,
)
from attn.config.yamlio import ConfigError, closest, did_you_mean, parse_yaml, read_yaml_file, show_value, truncate
from attn.model import head, scores, widthfree
from attn.model.fast import ModelSpec
from attn.tasks import CopyTask, RetrievalTask

MAX_INTEGER = 2**53  # the largest integer field value: every integer up to it is exact as a float too
MAX_NAME_CHARS = 200  # run and experiment names; NAME_MAX is 255 bytes and `-<n>` suffixes are added


def integer_problem(value, ge: int | None = None) -> str | None:
    """The one integer rule, for every integer a user writes (config fields,
    an experiment's seeds and report lengths, --seeds): None if `value` is an
    integer (not a bool) of at most MAX_INTEGER in size (and >= `ge`), else
    what is accepted, for the error line."""
    accepted = "an integer" + (f" >= {ge}" if ge is not None else "") + f" of at most {MAX_INTEGER:,} (2^53)"
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_INTEGER:
        return accepted
    return accepted if ge is not None and value < ge else None


def _fail(source: str, key: str, value, hint, meta) -> typing.NoReturn:
    raise ConfigError(f"{source}: {key}: got {show_value(value)}; expected {describe_accepted(hint, meta)}")


def _in_range(x, meta) -> bool:
    return not (
        (meta.get("gt") is not None and not x > meta["gt"])
        or (meta.get("ge") is not None and not x >= meta["ge"])
        or (meta.get("lt") is not None and not x < meta["lt"])
        or (meta.get("le") is not None and not x <= meta["le"])
    )


def as_number(value) -> float | None:
    """A YAML value or command-line text as a float: a number, or text that writes one in ASCII; else None."""
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str) and value.isascii():  # float() would also read '١٢' or '１０' as a number
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
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value  # coerce applies the integer rule (integer_problem), however large
    number = as_number(value)
    if number is None or not math.isfinite(number):
        return None
    if hint is int:
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
                raise ConfigError(
                    f"{source}: {key}: got {{{truncate(k)}}}; YAML needs a space after the colon: "
                    f"{{{truncate(name)}: {truncate(number)}}}"
                )
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
    if hint is int and integer_problem(coerced):  # 1e308 is integer-valued, but no count, size or seed
        raise ConfigError(f"{source}: {key}: got {show_value(value)}; expected {integer_problem(coerced)}")
    return coerced


def build_section(cls, data: dict, source: str, prefix: str = ""):
    """Build a schema dataclass from a nested dict, coercing and validating."""
    hints = field_hints(cls)
    fields = section_fields(cls)
    kwargs = {}
    for key, value in data.items():
        dotted = prefix + str(key)
        if key not in hints:
            hint = did_you_mean(nearest_key(dotted))
            raise ConfigError(f"{source}: unknown key `{truncate(dotted)}`{hint}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{source}: {dotted}: got {show_value(value)}; expected a mapping of {dotted}.* fields"
                )
            kwargs[key] = build_section(hint, value, source, dotted + ".")
        else:
            kwargs[key] = coerce(value, hint, dict(fields[key].metadata), dotted, source)
    return cls(**kwargs)


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


def with_values(config: Config, values: dict, source: str, every_setting_read: bool = True) -> Config:
    """A copy of `config` with dotted fields set to raw values, each coerced
    and checked as in a file, then validate()d. Costs the fields changed, not
    the whole schema: a sweep makes one config per grid point this way."""
    sections: dict[str, dict] = {}
    for key, value in values.items():
        section, _, leaf = str(key).rpartition(".")
        sections.setdefault(section, {})[leaf] = field_value(str(key), value, source)
    top = sections.pop("", {})
    top.update(
        {section: dataclasses.replace(getattr(config, section), **fields) for section, fields in sections.items()}
    )
    return validate(dataclasses.replace(config, **top), source, every_setting_read)


def field_value(key: str, value, source: str):
    """A raw value (as YAML reads it) coerced and checked as the field `key`
    takes it in a file; ConfigError for a key that is no field."""
    section, _, leaf = key.rpartition(".")
    owner = field_hints(Config).get(section) if section else Config
    if (
        not dataclasses.is_dataclass(owner)
        or leaf not in field_hints(owner)
        or dataclasses.is_dataclass(field_hints(owner)[leaf])
    ):
        hint = did_you_mean(nearest_key(key))
        raise ConfigError(f"{source}: unknown key `{truncate(key)}`{hint}")
    return coerce(value, field_hints(owner)[leaf], dict(section_fields(owner)[leaf].metadata), key, source)


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
    if dataclasses.is_dataclass(field_hints(Config).get(key)):
        raise ConfigError(f"{source}: `{key}` is a section; override one field, e.g. {key}.<field>=value")
    if key not in all_keys():
        hint = did_you_mean(nearest_key(key))
        raise ConfigError(f"{source}: unknown key `{truncate(key)}`{hint}")
    return key, value


def load_config(
    path: str | os.PathLike | None, overrides: typing.Sequence[str] = (), *, every_setting_read: bool = True
) -> Config:
    """Read a YAML config (or the defaults if path is None) and apply overrides.
    every_setting_read=False: a setting its task, score mode or optimiser does not
    read is let through (a sweep's base, whose grid may choose the one that reads it)."""
    data = read_yaml_file(path) if path is not None else {}
    data.pop("provenance", None)  # a run's config.yaml is a valid config
    source = str(path) if path is not None else "defaults"
    return _with_overrides(build_section(Config, data, source), overrides, source, every_setting_read)


def _with_overrides(
    config: Config, overrides: typing.Sequence[str], source: str, every_setting_read: bool = True
) -> Config:
    """The config with each override applied in turn, then validate()d: a key given twice takes its last value
    (a script's common overrides, then the one it varies)."""
    for text in overrides:
        key, value = parse_override(text)
        merged = to_dict(config)
        set_dotted(merged, key, value)
        config = build_section(Config, merged, f"override {show_value(text)}")
    # Cross-field checks see the final config: `task.n_keys=4 task.n_pairs=4` works in either order.
    return validate(
        config, f"{source} with overrides {truncate(' '.join(overrides))}" if overrides else source, every_setting_read
    )


def config_from_mapping(data: dict, source: str) -> Config:
    """The Config of a run's config.yaml already read (its provenance left out),
    checked as load_config checks a file, except that a setting nothing read
    (an older attn let it be written) is put back to its default: the run is the
    same, and it reads as the config it is."""
    config = build_section(Config, {k: v for k, v in data.items() if k != "provenance"}, source)
    return validate(without_unread_settings(config, source), source)


def load_run_config(path: str | os.PathLike, overrides: typing.Sequence[str] = ()) -> Config:
    """A run's config.yaml read as config_from_mapping reads it, then the overrides, as load_config applies them."""
    return _with_overrides(config_from_mapping(read_yaml_file(path), str(path)), overrides, str(path))


def without_unread_settings(config: Config, source: str) -> Config:
    """The config with every setting its task, score mode or optimiser does not read at its default."""
    defaults, flat = flatten_config(to_dict(Config())), flatten_config(to_dict(config))
    unread = {key: defaults[key] for key in unread_keys(flat) if flat[key] != defaults[key]}
    return with_values(config, unread, source, every_setting_read=False) if unread else config


def build_task(config: Config) -> RetrievalTask | CopyTask:
    """The task the config names, with its sizes."""
    t = config.task
    if t.name == "retrieval":
        return RetrievalTask(t.n_keys, t.n_values, t.n_pairs)
    return CopyTask(t.vocab_size, t.length, t.mode, t.shift)


def value_width(config: Config) -> int:
    """d_v: model.d_v, or d_k where it is null (as runs made before d_v had a default recorded it)."""
    return config.model.d_k if config.model.d_v is None else config.model.d_v


def qk_gain(config: Config) -> float:
    """The init gain of W_q and W_k: model.qk_gain times d_k ** model.qk_gain_exponent."""
    m = config.model
    return m.qk_gain * m.d_k**m.qk_gain_exponent if m.qk_gain_exponent else m.qk_gain


def build_spec(config: Config, task) -> ModelSpec:
    """The model's shape and options: the config's model section on the task's fields, length and classes."""
    m = config.model
    return ModelSpec(
        width_free=runs_width_free(config, task),
        fields=task.fields,
        n_positions=task.seq_len,
        n_classes=task.n_classes,
        d_model=m.d_model,
        d_k=m.d_k,
        d_v=value_width(config),
        scale=m.scale,
        causal=m.causal,
        mask_self=m.mask_self,
        residual=m.residual,
        positional=m.positional,
        qk_gain=qk_gain(config),
        v_gain=m.v_gain,
        o_gain=m.o_gain,
        readout_gain=m.readout_gain,
        dtype=config.dtype,
        score=m.score,
        qk_norm=m.qk_norm,
        qk_norm_gain=m.qk_norm_gain,
        softcap=m.softcap,
        temperature_init=m.temperature_init,
        length_scale_init=m.length_scale_init,
        mup_zero_init_q=m.mup_zero_init_q,
    )


def width_free_allowed(config: Config) -> bool:
    """Whether the config's optimiser and score mode keep W_q, W_k (W_v, W_o)
    in the span of their initial rows (attn.model.widthfree), and model.width_free lets them be carried so."""
    return (
        config.model.width_free
        and config.optim.name in optim.SUBSPACE_OPTIMIZERS
        and widthfree.keeps_span(config.model.score, config.model.qk_norm, config.model.qk_norm_gain)
    )


def runs_width_free(config: Config, task) -> bool:
    """Whether the run carries its head width-free: allowed, and the cost rule
    (attn.model.head.choose_association, at the training batch) finds it cheaper."""
    if not width_free_allowed(config):
        return False
    m = config.model
    positions = 1 if task.name == "retrieval" else task.seq_len
    return (
        head.choose_association(
            config.train.batch_size,
            positions,
            task.seq_len,
            m.d_model,
            m.d_k,
            value_width(config),
            width_free=True,
            normed=m.score in scores.NORMED_MODES,
        )
        == "widthfree"
    )


def estimate_memory_bytes(config: Config) -> int:
    """A generous estimate of a run's peak memory from its sizes: the head's
    weights, activations and gradients at the widths it is carried at
    (2 d_model for a width-free circuit wider than that, whatever d_k)."""
    m, t, task = config.model, config.task, build_task(config)
    spec = build_spec(config, task)
    D, dk, dv = m.d_model, spec.k_width, spec.v_width
    T, V, C = task.seq_len, sum(vocab for _, vocab in task.fields), task.n_classes
    n_params = (V + T) * D + 2 * D * dk + 2 * D * dv + D * C + C
    per_example = T * (6 * D + 4 * dk + 4 * dv + 4 * C) + 4 * T * T
    largest_batch = max(config.train.batch_size, t.eval_size)
    itemsize = 4 if config.dtype == "float32" else 8
    sampling = 16 * largest_batch * t.n_keys if t.name == "retrieval" else 0  # float64 draws + int64 argsort
    drawn = 2 * D * m.d_k if spec.width_free and widthfree.sampled_directly(D, m.d_k) else 0  # B at init
    # weights, gradients, Adam's two moments and its update's two temporaries (attn.optim.Temporaries)
    return itemsize * (6 * n_params + largest_batch * per_example) + sampling + 3 * 8 * drawn  # B, its QR in float64


def memory_limit_bytes() -> int:
    """Half of this machine's physical memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


def _check_everything_set_is_read(config: Config, source: str) -> None:
    """A field set away from its default that the config's task, score mode or optimiser never reads is an error."""
    flat, defaults = flatten_config(to_dict(config)), flatten_config(to_dict(Config()))
    for key in sorted(unread_keys(flat)):
        if flat[key] != defaults[key]:
            setting = unread_because(key, flat)
            if setting is not None:
                where = " and ".join(f"{k} set" if v == SET else f"{k} {v}" for k, v in setting.items())
                fix = " or ".join(f"set {k}=null" if v == SET else f"another {k}" for k, v in setting.items())
                raise ConfigError(
                    f"{source}: {key}: got {show_value(flat[key])}; not read with {where}: remove it "
                    f"(its default is {show_value(defaults[key])}), or choose {fix}"
                )
            decider, value = first_unmet_condition(key, flat)
            raise ConfigError(
                f"{source}: {key}: got {show_value(flat[key])}; read only with {decider} {value}, and "
                f"{decider} is {flat[decider]}: remove it, or set {decider}={value}"
            )


def validate(config: Config, source: str, every_setting_read: bool = True) -> Config:
    """Checks that involve more than one field (every_setting_read: load_config)."""
    if every_setting_read:
        _check_everything_set_is_read(config, source)
    t = config.task
    if t.name == "retrieval" and t.n_pairs > t.n_keys:
        raise ConfigError(
            f"{source}: task.n_pairs: got {t.n_pairs}; expected at most task.n_keys "
            f"({t.n_keys}), since keys are distinct within a sequence"
        )
    if config.model.mask_self and config.model.causal:
        raise ConfigError(
            f"{source}: model.mask_self: got true with model.causal true; expected one of them: "
            "the first query would have no key left"
        )
    if t.name == "copy" and t.mode == "shift" and t.shift % t.length == 0:
        raise ConfigError(
            f"{source}: task.shift: got {t.shift}; expected a shift that is not a "
            f"multiple of task.length ({t.length}), else the copy is the identity"
        )
    names = list(build_spec(config, build_task(config)).param_names)
    for key in config.optim.lr_mult:
        if key not in names:
            hint = did_you_mean(*closest(key, names))
            raise ConfigError(
                f"{source}: optim.lr_mult.{key}: not a parameter of this model (parameters: {', '.join(names)}){hint}"
            )
    if config.name is not None:
        check_run_name(config.name, f"{source}: name")
    if not config.runs_dir.strip():
        raise ConfigError(f"{source}: runs_dir: got {show_value(config.runs_dir)}; expected a directory path")
    need, limit = estimate_memory_bytes(config), memory_limit_bytes()
    if need > limit:
        m = config.model
        raise ConfigError(
            f"{source}: sizes need about {_gib(need)} of memory (model.d_model={m.d_model:.12g}, "
            f"model.d_k={m.d_k:.12g}, "
            f"train.batch_size={config.train.batch_size:.12g}, task.eval_size={t.eval_size:.12g}); "
            f"expected at most {_gib(limit)} (half this machine's memory)"
        )
    return config


def check_run_name(name, what: str) -> str:
    """The one rule for run and experiment names (--name, --resume's directory,
    a config's `name`, an experiment's `name`, a cell's name): a string of at
    most MAX_NAME_CHARS printable characters (no newline or other control
    character) that is one plain path component: no '/', '\\', NUL, not
    '.', '..' or hidden (a leading '.')."""
    if (
        not isinstance(name, str)
        or not name
        or name.startswith(".")
        or "/" in name
        or "\\" in name
        or not name.isprintable()
        or len(name) > MAX_NAME_CHARS
    ):
        raise ConfigError(
            f"{what}: got {show_value(name, MAX_NAME_CHARS + 8)}; expected a plain directory name: one path component "
            f"of printable characters (no '/', '\\', leading '.', or '..'), at most {MAX_NAME_CHARS} characters"
        )
    return name

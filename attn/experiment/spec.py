"""An experiment file: a base config, a grid of overrides, seeds and how to report them.

    name: sqrt_dk                    # output folder: <runs_dir>/sqrt_dk/
    base: ../configs/default.yaml    # relative to the experiment file
    overrides: {train.steps: 600, model.positional: none, task.n_keys: 128}   # applied to every cell (not a grid key)
    grid:                            # a mapping: the cartesian product of its lists;
      model.d_k: [16, 64, 256]       # or a list of such mappings: the union of their products
      model.scale: [sqrt, none]
      optim.lr: [0.03, 0.1, 0.3]
    seeds: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    report:                          # how attn.report.experiment_report lays out and judges the results
      x: model.d_k                   # grid key(s) along the x axis
      arm: model.scale               # grid key(s) whose values are the compared arms
      best_of: optim.lr              # chosen per (x, arm) by `select`, a rule declared before the runs
      select: [max success_rate, min median_time, min final_loss]
      shared: 0.1                    # best_of also reported at this one value, the same for every arm
      expect:                        # claims, each judged confirmed / not confirmed / inconclusive
        - id: scaled-beats-unscaled
          claim: the scaled arm succeeds more often than the unscaled one at every d_k >= 64
          stat: success_rate
          arm: {model.scale: sqrt}
          better_than: {model.scale: none}
          where: {model.d_k: [64, 256]}
          at: best                   # best (each arm at its own best_of), shared, or every (a bound,
                                     # above/below, at each value of best_of)
          test: mcnemar              # paired exact test (mcnemar; sign for a time), fisher, or interval
      select_on: [0, 1, 2, 3]        # held out: best_of chosen on these seeds, verdicts judged on judge_on
      judge_on: [4, 5, 6, 7, 8, 9]   # (each claim must be able to fail on them: report_spec.cannot_fail)
      sensitivity: true              # each (x, arm)'s learning-rate sensitivity over best_of
      lengths: [8, 32, 128]          # retrieval: ask each judged model about longer contexts (attn.analysis.lengths)

The `report:` section is read and checked by attn.experiment.report_spec (check_report).

Every cell of every grid is validated before any run starts, each grid
point's config once (its seeds differ only in `seed`). The number of cells
(grid points x seeds) is computed from the grid's shape before anything is
expanded, and more than MAX_CELLS (`--max-cells` raises it) is refused.
Each (cell, seed) is one run directory named after its settings, e.g.
runs/sqrt_dk/d_k-64_scale-none_seed-3, or lr_mult-W_k0.1-W_q0.1_seed-0 for
a mapping (its items sorted by key); names hold only [A-Za-z0-9._=-].
A sweep (attn.experiment.sweep) draws no per-run figures unless asked (`plots`):
logging.plots of every cell is set from it, and so is logging.mechanism_trace
(the rows' medians over training that only a run's mechanism.png draws) unless
the base config, the file's overrides or the command's set it. A cell keeps only its last
checkpoint (logging.keep_checkpoints 1) unless the base config, the
overrides or the grid set logging.keep_checkpoints.

On the command line, `attn sweep CONFIG --grid model.d_k=16,64 --grid
model.scale=sqrt,none --seeds 0-4 [--name N] [key=value ...]` makes the
same thing from a run config (command_line_experiment) and writes its file
into the experiment's directory (<runs_dir>/<name>/experiment.yaml, base
the config's absolute path, the overrides and runs_dir in `overrides`), so
that file is what any later `attn sweep` or `attn report` of it reads.
`attn sweep FILE --only model.d_k=16,64` runs part of an experiment file:
only those cells are built, checked and run, and its report covers them
(`attn report FILE` afterwards covers every cell).
Which a YAML file is, a config or an experiment file, is told by its
content (is_experiment_file: an experiment file has `grid` or `seeds`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

from attn.config.loading import (
    build_section,
    check_run_name,
    integer_problem,
    load_config,
    parse_override,
    set_dotted,
    validate,
    with_values,
)
from attn.config.schema import Config, algorithm_keys, all_keys, nearest_key, neutral_keys
from attn.config.yamlio import (
    ConfigError,
    did_you_mean,
    dump_yaml,
    parse_yaml,
    read_yaml_file,
    show_value,
    truncate,
    yaml_line,
)
from attn.experiment.report_spec import ReportSpec, check_lengths, check_report
from attn.store import runs
from attn.train import lifecycle

EXPERIMENT_KEYS = ("name", "base", "overrides", "grid", "seeds", "report", "description")
NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]")
SWEEP_KEEP_CHECKPOINTS = 1  # a cell is resumed from its last checkpoint; more only if the experiment asks
MAX_CELLS = 10_000  # runs (grid points x seeds) one experiment may have unless --max-cells says more


@dataclass(frozen=True)
class Cell:
    """One run of an experiment: a validated config and where it goes."""

    name: str  # run directory name, e.g. d_k-64_scale-none_seed-3
    settings: tuple[tuple[str, object], ...]  # the grid values of this cell (dotted key, value)
    seed: int
    config: Config


@dataclass(frozen=True)
class Experiment:
    name: str
    path: Path
    cells: tuple[Cell, ...]
    grid_keys: tuple[str, ...]
    report: ReportSpec = field(default_factory=lambda: ReportSpec((), ()))
    description: str = ""

    @property
    def directory(self) -> Path:
        return Path(self.cells[0].config.runs_dir) / self.name


@functools.lru_cache(maxsize=16)
def _short_keys(keys: tuple[str, ...]) -> dict[str, str]:
    """Each key by its leaf where no other key shares it, else in full with '-' for '.'."""
    leaves = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: leaf if leaves.count(leaf) == 1 else key.replace(".", "-") for key, leaf in zip(keys, leaves)}


def _format_value(value) -> str:
    """A grid value as part of a run directory name: 0.001, sqrt, W_k0.1-W_q0.1
    for a mapping (sorted by key), a-b for a list; other characters than
    [A-Za-z0-9._=-] become `_`."""
    if isinstance(value, dict):
        text = "-".join(f"{k}{_format_value(v)}" for k, v in sorted(value.items(), key=lambda item: str(item[0])))
    elif isinstance(value, list):
        text = "-".join(_format_value(v) for v in value)
    else:
        text = f"{value:g}" if isinstance(value, float) else str(value)
    return NAME_UNSAFE.sub("_", text)


def cell_name(settings: tuple[tuple[str, object], ...], seed: int, grid_keys: list[str]) -> str:
    short = _short_keys(tuple(grid_keys))
    parts = [f"{short[k]}-{_format_value(v)}" for k, v in settings]
    return "_".join(parts + [f"seed-{seed}"])


def check_grid_key(key, where: str, seeds: str = "`seeds:`") -> None:
    """A key a grid may vary: a config field, but not seed (set by `seeds`), name or runs_dir."""
    if key not in all_keys() or key in ("seed", "name", "runs_dir"):
        hint = did_you_mean(nearest_key(str(key)) if key != "seed" else None)
        reason = f"set with {seeds}" if key == "seed" else "not a config field that a grid can vary"
        raise ConfigError(f"{where}: `{truncate(str(key))}`: {reason}{hint}")


def _expand_grid(grid, source: str, n_seeds: int, max_cells: int) -> list[dict]:
    """A mapping -> its cartesian product; a list of mappings -> the union of
    theirs. Refused before expanding when the points times n_seeds exceed max_cells."""
    blocks = grid if isinstance(grid, list) else [grid]
    if not blocks or any(not isinstance(b, dict) or not b for b in blocks):
        raise ConfigError(
            f"{source}: grid: expected a non-empty mapping of dotted key -> list of values (or a list of such mappings)"
        )
    for block in blocks:
        for key, values in block.items():
            check_grid_key(key, f"{source}: grid")
            if not isinstance(values, list) or not values:
                raise ConfigError(
                    f"{source}: grid: {key}: got {truncate(repr(values))}; expected a non-empty list of values"
                )
    n_cells = sum(math.prod(len(values) for values in block.values()) for block in blocks) * n_seeds
    if n_cells > max_cells:
        raise ConfigError(
            f"{source}: grid: {n_cells:,} cells (grid points x {n_seeds} seeds) is more than the "
            f"limit of {max_cells:,}; make the grid smaller, or raise the limit with --max-cells {n_cells}"
        )
    cells = []
    for block in blocks:
        keys = list(block)
        for combo in itertools.product(*(block[k] for k in keys)):
            cells.append(dict(zip(keys, combo)))
    return cells


def _overridden(overrides: dict, prefix: str = "") -> list[tuple[str, object]]:
    """The (dotted key, value) pairs a file's `overrides` set: a section given as a mapping
    (model: {d_k: 4}) by each of its fields, so that one a grid varies is seen."""
    pairs = []
    for key, value in overrides.items():
        key = f"{prefix}{key}"
        if isinstance(value, dict) and key not in all_keys():
            pairs += _overridden(value, f"{key}.")
        else:
            pairs.append((key, value))
    return pairs


def _hashable(value):
    """A grid value as the report compares it (a mapping or list as its name)."""
    return _format_value(value) if isinstance(value, (dict, list)) else value


def is_experiment_file(path: str | os.PathLike) -> bool:
    """Whether a YAML file is an experiment file, told by its content: a
    mapping with `grid` or `seeds` (no run config has either); False for a
    file that cannot be read as YAML."""
    try:
        data = read_yaml_file(path, "experiment file")
    except ConfigError:
        return False
    return bool({"grid", "seeds"} & set(data))


def load_experiment(
    path: str | os.PathLike,
    runs_dir: str | os.PathLike | None = None,
    max_cells: int = MAX_CELLS,
    plots: bool = False,
    overrides: typing.Sequence[str] = (),
    only: typing.Sequence[str] = (),
) -> Experiment:
    """Read and validate an experiment file: every cell's config is built and
    checked here, so a bad cell is reported before any run starts. `plots`:
    whether each run draws its figures (logging.plots of every cell);
    `overrides`: key=value texts applied to every cell after the file's own
    (e.g. dtype=float64), never to a key the grid varies; `only`: the
    --only restrictions (_only), so that only those cells are built and checked
    (an override need hold only for them) and the experiment is those cells,
    its claims still checked against the whole grid."""
    path = Path(path)
    return build_experiment(read_yaml_file(path, "experiment file"), path, runs_dir, max_cells, plots, overrides, only)


def build_experiment(
    data: dict,
    path: Path,
    runs_dir: str | os.PathLike | None = None,
    max_cells: int = MAX_CELLS,
    plots: bool = False,
    overrides: typing.Sequence[str] = (),
    only: typing.Sequence[str] = (),
) -> Experiment:
    """The experiment an experiment file's contents make (load_experiment),
    every cell checked; `path`: the file's, which a relative base is read from."""
    source = str(path)
    unknown = [k for k in data if k not in EXPERIMENT_KEYS]
    if unknown:
        raise ConfigError(
            f"{source}: unknown key `{truncate(str(unknown[0]))}`; expected one of {', '.join(EXPERIMENT_KEYS)}"
        )
    for key in ("name", "base", "grid", "seeds"):
        if key not in data:
            raise ConfigError(f"{source}: missing `{key}`")
    name = check_run_name(data["name"], f"{source}: name")
    seeds = data["seeds"]
    if not isinstance(seeds, list) or not seeds:
        raise ConfigError(
            f"{source}: seeds: got {truncate(repr(seeds))}; expected a non-empty list of distinct integers >= 0"
        )
    for seed in seeds:  # the integer rule of every config field (the seed is one), before anything runs
        if integer_problem(seed, ge=0):
            raise ConfigError(f"{source}: seeds: got {show_value(seed)}; expected {integer_problem(seed, ge=0)}")
    if len(set(seeds)) != len(seeds):
        twice = next(seed for seed in seeds if seeds.count(seed) > 1)
        raise ConfigError(f"{source}: seeds: got {twice} twice; expected a non-empty list of distinct integers >= 0")
    description = "" if data.get("description") is None else data["description"]
    if not isinstance(description, str):
        raise ConfigError(f"{source}: description: got {truncate(repr(description))}; expected text")
    file_overrides = {} if data.get("overrides") is None else data["overrides"]  # `overrides:` alone: none
    if not isinstance(file_overrides, dict):
        raise ConfigError(
            f"{source}: overrides: got {truncate(repr(file_overrides))}; expected a mapping of dotted key -> value"
        )
    if not isinstance(data["base"], str) or not data["base"]:
        raise ConfigError(f"{source}: base: got {truncate(repr(data['base']))}; expected the path of a config file")
    base_path = path.parent / data["base"]  # an absolute base stays as it is
    try:
        base = read_yaml_file(base_path)
    except ConfigError as err:
        raise ConfigError(f"{source}: base: {err}") from None
    base.pop("provenance", None)
    for key, value in _overridden(file_overrides):  # a section's mapping sets its fields, keeping the base's others
        set_dotted(base, str(key), value)
    for text in overrides:
        key, value = parse_override(text)
        set_dotted(base, key, value)
    if runs_dir is not None:
        base["runs_dir"] = os.fspath(runs_dir)
    set_dotted(base, "logging.plots", plots)
    if not isinstance(base.get("logging"), dict) or "mechanism_trace" not in base["logging"]:
        set_dotted(base, "logging.mechanism_trace", plots)  # the trace is drawn only in a run's own figures
    if not isinstance(base.get("logging"), dict) or "keep_checkpoints" not in base["logging"]:
        set_dotted(base, "logging.keep_checkpoints", SWEEP_KEEP_CHECKPOINTS)  # unless the file or an override asks
    base_config = validate(
        build_section(Config, base, f"{source}: base + overrides"),
        f"{source}: base + overrides",
        every_setting_read=False,
    )  # each cell is checked with its grid values

    grid_cells = _expand_grid(data["grid"], source, len(seeds), max_cells)
    grid_keys = list(dict.fromkeys(k for c in grid_cells for k in c))
    varied = [k for k in (parse_override(text)[0] for text in overrides) if k in grid_keys]
    if varied:
        raise ConfigError(f"override {varied[0]}: the grid of {source} varies it; set it in the experiment's grid")
    for key, value in _overridden(file_overrides):  # else the grid would win, the override silently dropped
        if key in grid_keys:
            raise ConfigError(
                f"{source}: overrides: {key}: got {show_value(value)}, but the grid varies it; "
                "expected a key the grid does not vary (set its values in the grid only)"
            )
    cells, names = [], set()
    for settings in _only(grid_cells, only, name) if only else grid_cells:
        shown = ", ".join(f"{k}: {truncate(str(v))}" for k, v in settings.items())
        where = f"{source}: grid cell {{{shown}}}"
        config = with_values(base_config, settings, where)  # once per point: the seeds change nothing else
        for seed in seeds:
            cname = check_run_name(cell_name(tuple(settings.items()), seed, grid_keys), f"{where}: its run name")
            if cname in names:
                raise ConfigError(f"{source}: grid: cell {{{shown}}} appears twice")
            names.add(cname)
            cells.append(Cell(cname, tuple(settings.items()), seed, dataclasses.replace(config, seed=seed)))
    grid_values = {k: list(dict.fromkeys(_hashable(c[k]) for c in grid_cells if k in c)) for k in grid_keys}
    partial = tuple(k for k in grid_keys if any(k not in c for c in grid_cells))  # keys some grid blocks do not set
    report = check_report(
        {} if data.get("report") is None else data["report"],
        grid_keys,
        grid_values,
        source,
        partial,
        n_seeds=len(seeds),
        budget=max(c.config.train.steps for c in cells),
        seeds=seeds,
        grid_cells=[{k: _hashable(v) for k, v in c.items()} for c in grid_cells],
    )
    if report.lengths:
        for config in {cell.config.model: cell.config for cell in cells}.values():
            check_lengths(config, list(report.lengths), source)
    return Experiment(name, path, tuple(cells), tuple(grid_keys), report, description)


# ---------------------------------------------------------------------------
# An experiment made on the command line: attn sweep CONFIG --grid KEY=V1,V2 --seeds 0-4
# ---------------------------------------------------------------------------
EXPERIMENT_FILE_NAME = "experiment.yaml"  # where a command-line experiment's file is written, in its directory


def parse_grid_argument(text: str) -> tuple[str, list]:
    """'model.d_k=16,64,256' -> ('model.d_k', [16, 64, 256]): the values are
    read as one YAML flow list, so each is typed as an override's value is
    (1e-3 a float, sqrt a string, {W_q: 0.1} a mapping), then by its field."""
    key, equals, raw = text.partition("=")
    where = f"--grid {show_value(text)}"
    if not equals or not key.strip() or not raw.strip():
        raise ConfigError(f"{where}: expected KEY=VALUE,VALUE,..., e.g. --grid model.d_k=16,64,256")
    check_grid_key(key.strip(), where, seeds="--seeds (e.g. --seeds 0-4)")
    values = parse_yaml(f"[{raw}]", where)
    if not values:
        raise ConfigError(f"{where}: expected at least one value, e.g. --grid model.d_k=16,64,256")
    return key.strip(), values


def _only(grid_cells: list[dict], texts: typing.Sequence[str], name: str) -> list[dict]:
    """The grid points whose value of each KEY is among its values, for
    `attn sweep FILE --only KEY=V1,V2,...` (run part of an experiment: the
    cheap cells first, or one d_k); the values are read as one YAML flow list,
    as --grid's are (null: the points of a grid block that does not set KEY).
    ConfigError for a key or value not in the grid, or no point left."""
    keys = list(dict.fromkeys(k for c in grid_cells for k in c))
    points = grid_cells
    for text in texts:
        key, equals, raw = text.partition("=")
        key = key.strip()
        if key not in keys:
            raise ConfigError(
                f"--only: got {show_value(text)}; expected KEY=VALUE,... with KEY a grid key of "
                f"{name} ({', '.join(keys)})"
            )
        values = parse_yaml(f"[{raw}]", f"--only {show_value(text)}") if equals and raw.strip() else []
        known = {_hashable(c.get(key)): c.get(key) for c in grid_cells}
        wanted = [_hashable(v) for v in values]
        if not values or any(v not in known for v in wanted):
            raise ConfigError(
                f"--only: {key}: got {show_value(raw)}; expected some of the grid's values "
                f"({only_argument(key, known.values()).partition('=')[2]})"
            )
        points = [c for c in points if _hashable(c.get(key)) in wanted]
    if not points:
        raise ConfigError(
            f"--only: {' '.join(map(show_value, texts))}: no cell of {name} has all of "
            "these values; expected values that some cell holds together"
        )
    return points


def only_argument(key: str, values) -> str:
    """'KEY=V1, V2': the --only argument load_experiment(only=) reads back as these values (YAML flow text:
    null for a block that does not set KEY, 'yes' quoted, {W_q: 0.1})."""
    return f"{key}={yaml_line(list(values))[1:-1]}"


def parse_seeds(text: str, max_cells: int = MAX_CELLS) -> list[int]:
    """'0-4' -> [0, 1, 2, 3, 4]; '0,2,5' and '0-2,7' likewise; distinct integers >= 0."""
    bad = (
        f"--seeds: got {show_value(text)}; expected integers >= 0 as a range or a list, e.g. 0-4 or 0,2,5 "
        "(or both: 0-2,7)"
    )
    ranges = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not (low.isascii() and low.isdigit()) or (dash and not (high.isascii() and high.isdigit())):
            raise ConfigError(bad)
        if len(low) > 20 or len(high) > 20 or any(integer_problem(int(n), ge=0) for n in (low, high) if n):
            raise ConfigError(
                f"--seeds: got {show_value(text)}; expected seeds that are each {integer_problem(-1, ge=0)}"
            )
        ranges.append((int(low), int(high) if dash else int(low)))
    if any(high < low for low, high in ranges):
        raise ConfigError(f"{bad}; a range goes from low to high")
    if sum(high - low + 1 for low, high in ranges) > max_cells:
        raise ConfigError(
            f"--seeds: got {show_value(text)}: more seeds than the limit of {max_cells:,} runs (--max-cells)"
        )
    seeds = [seed for low, high in ranges for seed in range(low, high + 1)]
    twice = next((seed for seed in seeds if seeds.count(seed) > 1), None)
    if twice is not None:
        raise ConfigError(f"--seeds: got {show_value(text)}: seed {twice} is given twice")
    return seeds


def command_line_experiment(
    config_path: str | os.PathLike,
    grid: typing.Sequence[str],
    seeds: str | None = None,
    name: str | None = None,
    overrides: typing.Sequence[str] = (),
    runs_dir: str | os.PathLike | None = None,
    max_cells: int = MAX_CELLS,
    plots: bool = False,
    command: str = "",
) -> tuple[Experiment, dict]:
    """The experiment `attn sweep CONFIG --grid ... [--seeds ...] [--name N]
    [key=value ...]` runs, checked as an experiment file is, and the contents
    of the file that says so (save_experiment_file writes it): base the
    config's absolute path; overrides the key=value texts and the absolute
    runs_dir; grid the product of the --grid values; seeds --seeds (default:
    the config's seed); name --name (default <config>-<grid keys>). Its path
    is <runs_dir>/<name>/experiment.yaml, so `attn sweep` of that file runs it again."""
    block = {}
    for text in grid:
        key, values = parse_grid_argument(text)
        if key in block:
            raise ConfigError(f"--grid {key}: given twice; give its values once, e.g. --grid {key}=1,2,3")
        block[key] = values
    base = load_config(
        config_path, overrides, every_setting_read=False
    )  # checked on their own first; each cell in full
    for text in overrides:  # said here in the command's terms, not of the experiment file made from it
        key = parse_override(text)[0]
        if key in block:
            raise ConfigError(
                f"override {show_value(text)}: --grid {key} varies it; expected a key no --grid "
                f"varies (give {key}'s values in --grid only)"
            )
    file_overrides = dict(parse_override(text) for text in overrides)
    file_overrides["runs_dir"] = os.path.abspath(runs_dir if runs_dir is not None else base.runs_dir)
    short = _short_keys(tuple(block))
    name = check_run_name(
        name if name is not None else "-".join([Path(config_path).stem, *short.values()]),
        "--name" if name is not None else "the experiment name made from the config and grid",
    )
    data = {
        "name": name,
        "description": f"Made on the command line: {command}".strip(),
        "base": os.path.abspath(config_path),
        "overrides": file_overrides,
        "grid": block,
        "seeds": parse_seeds(seeds, max_cells) if seeds is not None else [base.seed],
    }
    path = Path(file_overrides["runs_dir"]) / name / EXPERIMENT_FILE_NAME
    return build_experiment(data, path, max_cells=max_cells, plots=plots), data


def save_experiment_file(path: Path, data: dict) -> None:
    """Write a command-line experiment's file (command_line_experiment), or
    keep the one there if it is the same experiment; ConfigError if the file
    there is another experiment's (it differs in more than its description)."""
    path = Path(path)
    if path.exists():
        there = read_yaml_file(path, "experiment file")
        if {k: v for k, v in there.items() if k != "description"} != {
            k: v for k, v in data.items() if k != "description"
        }:
            changed = [k for k in EXPERIMENT_KEYS if there.get(k) != data.get(k) and k != "description"]
            raise ConfigError(
                f"{path}: holds another experiment of this name (its {', '.join(changed)} differ); "
                f"run that one with `attn sweep {path}`, or name this one with --name"
            )
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise runs.RunError(f"{path.parent}: cannot create the experiment directory: {err.strerror}") from None
    text = "# attn experiment made on the command line; `attn sweep` this file to run (or resume) it again.\n"
    runs.write_atomic(path, (text + dump_yaml(data, sort_keys=False)).encode())


def config_change(stored: Config, config: Config) -> list[str]:
    """How the config a run was made with differs from `config`
    ('key: stored -> wanted', lifecycle.config_difference), leaving out the
    neutral_keys(); [] when the run is the config's run."""
    return lifecycle.config_difference(stored, config, ignore=neutral_keys())


def result_change(stored: Config, config: Config) -> list[str]:
    """config_change without the algorithm_keys(): how a run differs from the
    cell in what it computes, so a report counts a run of the same maths done
    another way (attn verify's materialized re-run) as the cell's."""
    return lifecycle.config_difference(stored, config, ignore=neutral_keys() + algorithm_keys())

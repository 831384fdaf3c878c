"""The runs an export writes (`attn export --tensorboard`, `--mlflow`), each read once and named.

A run is named by its path below the PATH it was found under (a PATH that is a run: its own name), so
`attn export runs/` names runs/sqrt_dk/d_k-64_seed-3 `sqrt_dk/d_k-64_seed-3`; its experiment is that
name's parent (`sqrt_dk`), or, for a run directly under its PATH, the name of the directory holding it.
A run directory that cannot be read (a damaged config.yaml, metrics.jsonl or summary.json) is skipped
with the reason, and the others are exported.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attn.analysis import grouping
from attn.store import runs


class MissingLibrary(RuntimeError):
    """An optional package an export writes through is not installed; str() names it and how to install it."""


class DestinationError(RuntimeError):
    """Where an export writes cannot be opened or written (not a store, a store that fails); str() says why and
    what to do, in one line."""


def missing(package: str, extra: str) -> MissingLibrary:
    return MissingLibrary(f"needs the {package} package, not installed; install it with pip install 'attn[{extra}]'")


@dataclass(frozen=True)
class Found:
    run: grouping.Run
    name: Path  # its path below the PATH it was found under
    experiment: str  # the directory of runs it belongs to

    @property
    def finished(self) -> bool:
        return self.run.status in runs.FINISHED

    @property
    def started(self) -> float:
        """When the run started (seconds since the epoch): summary.json's `started_at`, else config.yaml's mtime."""
        started = self.run.summary.get("started_at")
        if runs.is_finite_number(started):
            return float(started)
        try:
            return (self.run.path / "config.yaml").stat().st_mtime
        except OSError:
            return 0.0

    def wall_time(self, record: dict) -> float:
        """A record's time since the epoch: the run's start plus its `wall_time` (seconds since the start)."""
        offset = record.get("wall_time")
        return self.started + (float(offset) if runs.is_finite_number(offset) else 0.0)

    @property
    def last_step(self) -> int:
        return self.run.records[-1]["step"] if self.run.records else 0

    @property
    def outcome(self) -> str | None:
        """Its outcome class (learned, stalled, ...) as `attn compare` and the board name it (grouping.Run.outcome:
        summary.json's); None while it has not ended."""
        return self.run.outcome

    @property
    def figures(self) -> list[Path]:
        """The run's figures (its *.png), by name."""
        return sorted(p for p in self.run.path.glob("*.png") if p.is_file() and not p.is_symlink())


@dataclass(frozen=True)
class Written:
    found: Found
    where: str  # the event file, or the MLflow run
    steps: int  # records exported
    new_steps: int | None = None  # of them, those an earlier export did not hold (None: every one rewritten)


@dataclass(frozen=True)
class Exported:
    written: list  # Written
    skipped: list  # grouping.Skipped


def unreadable(err: OSError | UnicodeDecodeError) -> str:
    """Why a run's file could not be read, in one line."""
    if isinstance(err, UnicodeDecodeError):
        return "a file of it is not UTF-8 text"
    where = Path(err.filename).name if err.filename else "a file of it"
    return f"{where}: cannot be read: {runs.describe_os_error(err)}"


def find_runs(paths) -> tuple[list[Found], list[grouping.Skipped]]:
    """Every run at or below the PATHs (as `attn compare` finds them), read; the PATHs holding no run and
    the runs that cannot be read, skipped with the reason. RunError when no run is found at all."""
    run_dirs, skipped = grouping.find_run_dirs(paths)
    wanted = {d.resolve() for d in run_dirs}
    found, seen, names = [], set(), {}
    for path in grouping.expand_paths(paths):
        for run_dir in grouping.walk_runs(path):
            real = run_dir.resolve()
            if real not in wanted or real in seen:
                continue
            seen.add(real)
            below = run_dir.relative_to(path)
            name = Path(real.name) if below == Path(".") else below
            if name in names:
                skipped.append(grouping.Skipped(run_dir, f"its name {name} is taken by {names[name]}"))
                continue
            try:
                run = grouping.load_run(run_dir)
            except runs.RunError as err:
                skipped.append(grouping.Skipped(run_dir, " ".join(str(err).removeprefix(f"{run_dir}/").split())))
                continue
            names[name] = run_dir
            experiment = name.parent.as_posix() if name.parent != Path(".") else real.parent.name
            found.append(Found(run, name, experiment))
    return found, skipped

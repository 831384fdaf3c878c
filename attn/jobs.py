"""One run from start to finish: its directory, training, figures.

Used by the CLI's `train` and by the sweep workers, so a run started either
way is the same run. A run that cannot start (a checkpoint that does not
fit) is refused before anything in its directory changes; failures inside
training are recorded in the run directory (status `failed`, the error in
summary.json, the traceback in error.txt) before they propagate.
"""

from __future__ import annotations

import contextlib
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from attn import allocator, runs, train
from attn.config import Config, ConfigError, check_run_name, flatten_config, load_config, to_dict
from attn.train import StopFlag


# Config fields that change no logged number (where the run lives, which files
# it draws): runs that differ only in these are the same experiment cell.
RESULT_NEUTRAL_KEYS = ("name", "runs_dir", "logging.plots", "logging.checkpoint_every", "logging.attention_examples")


def provenance(config_path: str | None, overrides) -> dict:
    return {
        "config_file": str(config_path) if config_path else None,
        "overrides": list(overrides),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "attn_commit": source_revision(),
        "command": " ".join(sys.argv),
    }


def source_revision() -> str | None:
    """`git describe --always --dirty` of the attn source tree, or None when it
    is not a git checkout (an installed copy) or git is missing."""
    try:
        result = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=Path(__file__).resolve().parent,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def create(config: Config, config_path: str | None = None, overrides=(), name: str | None = None) -> Path:
    """Make a fresh run directory for `config` and write its config.yaml
    (if that fails, the directory is removed again)."""
    name = check_run_name(name, "--name") if name else config.name or runs.default_run_name(config_path)
    run_dir = runs.create_run_dir(Path(config.runs_dir), name)
    try:
        runs.write_config(run_dir, to_dict(config), provenance(config_path, overrides))
    except runs.RunError:
        with contextlib.suppress(OSError):
            run_dir.rmdir()
        raise
    return run_dir


def config_of(run_dir: Path) -> Config:
    """The config a run was made with."""
    return load_config(Path(run_dir) / "config.yaml")


def config_difference(a: Config, b: Config, ignore=()) -> list[str]:
    """'key: a -> b' for every field that differs, except the keys in `ignore`."""
    flat_a, flat_b = flatten_config(to_dict(a)), flatten_config(to_dict(b))
    return [f"{k}: {flat_a.get(k)!r} -> {flat_b.get(k)!r}" for k in sorted(flat_a.keys() | flat_b.keys())
            if k not in ignore and flat_a.get(k) != flat_b.get(k)]


def check_resumable(run_dir: Path, requested: Config | None = None, overrides=()) -> train.RunState:
    """The state the run resumes from (its own config, its checkpoint loaded),
    after checking that the run can be resumed: it is a run directory, not
    finished, not running elsewhere, its checkpoint fits; and that a config the
    user also gave (`requested`, or `overrides` applied to the run's config) is
    the same as the run's."""
    run_dir = Path(run_dir)
    what = f"--resume {run_dir}"
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{what}: not a run directory (no config.yaml)")
    stored = config_of(run_dir)
    if overrides:
        requested = load_config(run_dir / "config.yaml", overrides)
    if requested is not None:
        diff = config_difference(stored, requested)
        if diff:
            raise ConfigError(f"{what}: the config differs from the run's ({'; '.join(diff)}); "
                              "a resumed run keeps its config: start a new run to change it")
    summary = runs.read_summary(run_dir) or {}
    status = runs.effective_status(summary)
    if status in ("completed", "diverged"):
        raise ConfigError(f"{what}: the run already {status} ({summary.get('reason') or 'nothing to resume'})")
    if status == "running":
        raise ConfigError(f"{what}: the run is still running (pid {summary.get('pid')} on {summary.get('host')})")
    if not (run_dir / "checkpoint.npz").exists():
        raise ConfigError(f"{what}: no checkpoint yet; start the run again instead")
    return train.prepare(stored, run_dir, resume=True)  # refuses a checkpoint that does not fit


def execute(config: Config, run_dir: Path, *, resume: bool = False, stop: StopFlag | None = None,
            progress=None, state: train.RunState | None = None) -> dict:
    """Train and draw the figures, from `state` when it is given (as
    check_resumable returns it), else from the config (and the checkpoint when
    resuming). A checkpoint that does not fit is refused (RunError) with the
    run left as it was; errors during training are recorded in the run
    directory, then re-raised."""
    run_dir = Path(run_dir)
    allocator.keep_freed_memory()  # a step's large temporaries are reused, not faulted in afresh
    if state is None:
        state = train.prepare(config, run_dir, resume=resume)
    try:
        summary = train.run(state, stop=stop, progress=progress)
    except Exception as err:
        record_failure(run_dir, err)
        raise
    if config.logging.plots:
        from attn import plots  # matplotlib takes ~1 s to import: only for runs that draw

        try:
            plots.plot_run(run_dir)
        except Exception as err:  # a figure must never cost the run
            summary["plot_error"] = f"{type(err).__name__}: {err}"
            runs.write_json(run_dir / "summary.json", summary)
    return summary


def record_failure(run_dir: Path, err: BaseException) -> None:
    """Mark the run failed, keeping the traceback beside it."""
    try:
        runs.write_atomic(run_dir / "error.txt", "".join(traceback.format_exception(err)).encode())
        summary = runs.read_summary(run_dir) or {}
        summary.update(status="failed", reason=f"{type(err).__name__}: {err}", **runs.heartbeat_fields())
        runs.write_json(run_dir / "summary.json", summary)
    except runs.RunError:
        pass  # the disk that failed the run may fail this too; the original error still propagates

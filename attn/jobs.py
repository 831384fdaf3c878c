"""One run from start to finish: its directory, training, figures.

Used by the CLI's `train` and by the sweep workers, so a run started either
way is the same run. Every write happens under the run directory's
locks.RunLock: execute takes it (re-entrantly, so a caller that took it to
check the run first keeps one unbroken hold). A run that cannot start (a
damaged file, a checkpoint that does not fit) is refused before anything in
its directory changes; failures inside training are recorded in the run
directory (status `failed`, the error in summary.json, the traceback in
error.txt) before they propagate.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

from attn import allocator, locks, runs, train
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
        **platform_facts(),
        "attn_commit": source_revision(),
        "command": " ".join(sys.argv),
    }


def platform_facts() -> dict:
    """The machine a run is made on, for reports to name: the CPU model, the
    BLAS numpy uses (library, version, kernel) and OPENBLAS_CORETYPE."""
    from threadpoolctl import threadpool_info

    blas = [f"{e.get('internal_api')} {e.get('version')} ({e.get('architecture')} kernel)"
            for e in threadpool_info() if e.get("user_api") == "blas"]
    return {"cpu": cpu_model(), "blas": ", ".join(blas) or "none found",
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE")}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_revision() -> str | None:
    """`git describe --always --dirty` of the attn source tree, or None when it
    is not a git checkout (an installed copy) or git is missing."""
    try:
        result = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=Path(__file__).resolve().parent,
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


@contextlib.contextmanager
def new_run(config: Config, config_path: str | None = None, overrides=(), name: str | None = None):
    """A fresh run directory for `config` with its config.yaml, its RunLock
    held from the moment it exists to the end of the block (if writing
    config.yaml fails, the directory is removed again)."""
    if name is not None:
        check_run_name(name, "--name")
    else:  # config.name is checked with the config; a default name is made from the config file's
        name = config.name or check_run_name(runs.default_run_name(config_path), "the run name made from the config file")
    run_dir = runs.create_run_dir(Path(config.runs_dir), name)
    with contextlib.ExitStack() as hold:
        try:
            hold.enter_context(locks.RunLock(run_dir, "train"))
            runs.write_config(run_dir, to_dict(config), provenance(config_path, overrides))
        except runs.RunError:
            with contextlib.suppress(OSError):
                (run_dir / locks.LOCK_NAME).unlink(missing_ok=True)
                run_dir.rmdir()
            raise
        yield run_dir


def create(config: Config, config_path: str | None = None, overrides=(), name: str | None = None) -> Path:
    """A fresh run directory with its config.yaml (new_run, its lock released at once)."""
    with new_run(config, config_path, overrides, name) as run_dir:
        return run_dir


def config_of(run_dir: Path) -> Config:
    """The config a run was made with; ConfigError (naming its config.yaml)
    if that no longer reads as a valid config."""
    try:
        return load_config(Path(run_dir) / "config.yaml")
    except ConfigError as err:
        raise ConfigError(f"{err}; move the run directory away") from None


def config_difference(a: Config, b: Config, ignore=()) -> list[str]:
    """'key: a -> b' for every field that differs, except the keys in `ignore`."""
    flat_a, flat_b = flatten_config(to_dict(a)), flatten_config(to_dict(b))
    return [f"{k}: {flat_a.get(k)!r} -> {flat_b.get(k)!r}" for k in sorted(flat_a.keys() | flat_b.keys())
            if k not in ignore and flat_a.get(k) != flat_b.get(k)]


def check_resumable(run_dir: Path, requested: Config | None = None, overrides=()) -> train.RunState:
    """The state the run resumes from (prepare_resume), after checking that
    the run can be resumed: it is a run directory, not finished, not running
    elsewhere, its files are sound and its checkpoint fits; and that a config
    the user also gave (`requested`, or `overrides` applied to the run's
    config) is the same as the run's. The caller holds the run's RunLock,
    taken before this check, so nothing can start the run in between."""
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
    status = locks.effective_status(summary)
    if status in ("completed", "diverged"):
        raise ConfigError(f"{what}: the run already {status} ({summary.get('reason') or 'nothing to resume'})")
    if status == "running":  # a writer on another host, whose lock this file system does not share
        raise ConfigError(f"{what}: the run is still running (pid {summary.get('pid')} on {summary.get('host')})")
    return prepare_resume(stored, run_dir)


def prepare_resume(config: Config, run_dir: Path) -> train.RunState:
    """The state a run resumes from, every file of the run read and checked
    before anything changes (so damage is refused, never recorded as a
    failure; a config.yaml must hold every field, so none silently takes its
    default): its last checkpoint, or before its first one step 0 (training
    is deterministic, so starting over in place is exact; either way
    train.run first drops the records the stopped writer logged from there on)."""
    run_dir = Path(run_dir)
    runs.read_run_config(run_dir, complete=True)
    logged = {record["step"] for record in runs.read_metrics(run_dir)}
    runs.read_summary(run_dir)
    if (run_dir / "attention.npz").exists():
        runs.load_arrays(run_dir / "attention.npz")
    state = train.prepare(config, run_dir, resume=(run_dir / "checkpoint.npz").exists())
    # Each record is fsynced before the next checkpoint: every step logged before it must be there.
    lost = sorted(set(range(0, state.step, config.logging.log_every)) - logged)
    if lost:
        more = f" and {len(lost) - 1} more" if len(lost) > 1 else ""
        raise runs.RunError(f"{run_dir / 'metrics.jsonl'}: no record of step {lost[0]}{more}, though the checkpoint "
                            f"is at step {state.step}; move the run directory away, or delete its checkpoint.npz "
                            "to train it again from step 0")
    state.resumed = True
    return state


def execute(config: Config, run_dir: Path, *, resume: bool = False, stop: StopFlag | None = None,
            progress=None, state: train.RunState | None = None) -> dict:
    """Train and draw the figures, holding the run's RunLock, from `state`
    when it is given (as check_resumable returns it), else from the config
    (and prepare_resume when resuming). A damaged file or a checkpoint that
    does not fit is refused (RunError) with the run left as it was; errors
    during training are recorded in the run directory, then re-raised."""
    run_dir = Path(run_dir)
    with locks.RunLock(run_dir, "train"):
        if state is None:
            state = prepare_resume(config, run_dir) if resume else train.prepare(config, run_dir)
        member_progress = None if progress is None else (lambda _member, step, record: progress(step, record))
        return execute_stack([state], stop=stop, progress=member_progress)[0]


def execute_stack(states: list[train.RunState], *, stop: StopFlag | None = None, progress=None) -> list[dict]:
    """Train runs of one shape as one stack (train.run_stack) and draw each
    run's figures if its config asks; the caller holds every run's RunLock.
    Errors during training are recorded in each run directory not yet
    finished, then re-raised."""
    with warnings.catch_warnings():
        # model.diagnostics takes the std of no scores when every score is non-finite; the record holds null there.
        warnings.filterwarnings("ignore", "Degrees of freedom <= 0 for slice", RuntimeWarning)
        allocator.keep_freed_memory()  # a step's large temporaries are reused, not faulted in afresh
        try:
            summaries = train.run_stack(states, stop=stop, progress=progress)
        except Exception as err:
            for state in states:
                if (runs.read_summary(state.run_dir) or {}).get("status") == "running":
                    record_failure(state.run_dir, err)
            raise
        for state, summary in zip(states, summaries):
            if state.config.logging.plots:
                draw_figures(state.run_dir, summary)
    return summaries


def draw_figures(run_dir: Path, summary: dict) -> None:
    """The run's figures (attn.plots); a failure is noted in its summary, never raised."""
    from attn import plots  # matplotlib takes ~1 s to import: only for runs that draw

    try:
        plots.plot_run(run_dir)
    except Exception as err:  # a figure must never cost the run
        summary["plot_error"] = f"{type(err).__name__}: {err}"
        runs.write_json(run_dir / "summary.json", summary)


def record_failure(run_dir: Path, err: BaseException) -> None:
    """Mark the run failed, keeping the traceback beside it."""
    try:
        runs.write_atomic(run_dir / "error.txt", "".join(traceback.format_exception(err)).encode())
        summary = runs.read_summary(run_dir) or {}
        summary.update(status="failed", reason=f"{type(err).__name__}: {err}", **runs.heartbeat_fields())
        runs.write_json(run_dir / "summary.json", summary)
    except runs.RunError:
        pass  # the disk that failed the run may fail this too; the original error still propagates

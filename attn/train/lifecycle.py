"""One run from start to finish: its directory, training, figures.

Used by the CLI's `train` and by the sweep workers, so a run started either
way is the same run. Every write happens under the run directory's
locks.RunLock: execute takes it (re-entrantly, so a caller that took it to
check the run first keeps one unbroken hold). A run that cannot start (a
damaged file, a checkpoint that does not fit) is refused before anything in
its directory changes; failures inside training are recorded in the run
directory (status `failed`, the error in summary.json, the traceback in
error.txt) before they propagate.

Extending: resuming with a larger train.steps (the only change a resume
accepts) continues a completed or stopped run from its last checkpoint as
if its budget had been the larger one from the start (attn.train.loop's resume
invariant); config.yaml takes the new budget and its provenance lists each
extension. A cosine schedule is a function of the budget, so it is refused.

Forking: a new run directory started from another run's checkpoint at
some step (the last, or one it kept: checkpoint-<step>.npz), with the
source's config changed only in the fields the schema declares forkable: values that leave the shapes,
the optimiser state, the data and the eval set as the checkpoint has them.
The fork starts as a copy of its source at that step: the checkpoint, the
records before it and the attention snapshot at step 0, so it then resumes
like any stopped run, and with no change it continues exactly as its source did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

import numpy as np

from attn import outcomes
from attn.config.loading import build_spec, build_task, check_run_name, flatten_config, load_run_config
from attn.config.schema import Config, fork_keys, neutral_keys, not_forked_because, to_dict
from attn.config.yamlio import ConfigError, show_value
from attn.model import fast
from attn.store import arrayfiles, locks, runs, runstate
from attn.train import allocator, denormals, loop
from attn.train.loop import StopFlag


def head_provenance(config: Config) -> dict[str, str]:
    """How the run's head carries W_q, W_k (materialized or width-free) and how it was initialised."""
    return fast.describe_carried_weights(build_spec(config, build_task(config)))


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
    BLAS numpy uses (library, version, kernel), OPENBLAS_CORETYPE, its threads and
    what training does with subnormal floats (attn.train.denormals)."""
    from threadpoolctl import threadpool_info

    libraries = [e for e in threadpool_info() if e.get("user_api") == "blas"]
    blas = [f"{e.get('internal_api')} {e.get('version')} ({e.get('architecture')} kernel)" for e in libraries]
    threads = max((e.get("num_threads") or 1 for e in libraries), default=1)
    return {
        "cpu": cpu_model(),
        "blas": ", ".join(blas) or "none found",
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
        "blas_threads": threads,  # a run's bits depend on them (attn.cli.common.training_threads)
        "denormals": denormals.training_mode(threads),
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_revision(source: Path = Path(__file__).resolve().parent) -> str | None:
    """`git describe --always --dirty --exclude='*'` of the attn source tree: its commit's hex object id
    (never a tag's name, so `attn verify --published` can take it as an id), '-dirty' for uncommitted
    code; None when it is not a git checkout (an installed copy) or git is missing."""
    try:
        result = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--exclude=*"],
            cwd=source,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def check_directory_path(path: str | os.PathLike, what: str) -> None:
    """ConfigError, before anything is created, when `path` or the nearest of
    its parents that exists is not a directory (runs_dir=README.md), or is
    empty (which would mean the current directory, unasked)."""
    example = f"{what} runs" if what.startswith("--") else f"{what}=runs"
    if not str(path).strip():
        raise ConfigError(f"{what} {show_value(str(path))}: an empty path; choose a directory, e.g. {example}")
    path = Path(path)
    for candidate in (path, *path.parents):
        try:
            os.stat(candidate)
        except (FileNotFoundError, NotADirectoryError):  # not there (yet): its parent is checked next
            continue
        except OSError as err:  # too long, no permission to look
            raise ConfigError(f"{what} {runs.describe_path_error(path, err)}") from None
        if not candidate.is_dir():
            where = "it" if candidate == path else str(candidate)
            problem = "is a file, not a directory" if candidate.is_file() else "is not a directory"
            raise ConfigError(f"{what} {show_value(str(path))}: {where} {problem}; choose a directory, e.g. {example}")
        return


@contextlib.contextmanager
def new_run(
    config: Config,
    config_path: str | None = None,
    overrides=(),
    name: str | None = None,
    *,
    origin: dict | None = None,
    fill=None,
):
    """A fresh run directory for `config` with its config.yaml, its RunLock
    held from the moment it exists to the end of the block. `fill(run_dir)`
    writes the run's first files before config.yaml (a fork's checkpoint and
    records: until config.yaml is written the directory is no run); `origin`
    is added to its provenance. If any of it fails, the directory is removed again."""
    if name is not None:
        check_run_name(name, "--name")
    else:  # config.name is checked with the config; a default name is made from the config file's
        name = config.name or check_run_name(
            runs.default_run_name(config_path), "the run name made from the config file"
        )
    check_directory_path(config.runs_dir, "runs_dir")
    run_dir = runs.create_run_dir(Path(config.runs_dir), name)
    with contextlib.ExitStack() as hold:
        try:
            hold.enter_context(locks.RunLock(run_dir, "train"))
            if fill is not None:
                fill(run_dir)
            runs.write_config(
                run_dir,
                to_dict(config),
                {**provenance(config_path, overrides), "head": head_provenance(config), **(origin or {})},
            )
        except BaseException:  # a full disk, a damaged source file, Ctrl-C: no half-made run is left
            shutil.rmtree(run_dir, ignore_errors=True)  # made by this call a moment ago: nothing else is in it
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
        return load_run_config(Path(run_dir) / "config.yaml")
    except ConfigError as err:
        raise ConfigError(f"{err}; move the run directory away") from None


def finished_run(config: Config, runs_dir: Path, name: str) -> Path | None:
    """The newest run in runs_dir named `name` or `name-N` that ended (completed
    or diverged: attn.outcomes.ENDED) with this config, neutral keys aside, and
    holds every snapshot the config asks for: a run `attn demo` reuses rather
    than trains again. None if there is none; a damaged run is passed over."""
    found = []
    for candidate in Path(runs_dir).glob(f"{glob.escape(name)}*"):
        if candidate.name != name and not re.fullmatch(re.escape(name) + r"-\d+", candidate.name):
            continue
        try:
            if (runs.read_summary(candidate) or {}).get("status") not in outcomes.ENDED:
                continue
            if config_difference(config_of(candidate), config, ignore=neutral_keys()):
                continue
        except (runs.RunError, ConfigError):
            continue
        if config.logging.mechanism_trace and not (candidate / loop.MECHANISM_TRACE).exists():
            continue  # made before runs traced their rows: its mechanism figure would lack them
        found.append(candidate)
    return max(found, key=lambda run: (run / "summary.json").stat().st_mtime) if found else None


def config_difference(a: Config, b: Config, ignore=()) -> list[str]:
    """'key: a -> b' for every field that differs, except the keys in `ignore`."""
    flat_a, flat_b = flatten_config(to_dict(a)), flatten_config(to_dict(b))
    return [
        f"{k}: {flat_a.get(k)!r} -> {flat_b.get(k)!r}"
        for k in sorted(flat_a.keys() | flat_b.keys())
        if k not in ignore and flat_a.get(k) != flat_b.get(k)
    ]


@dataclasses.dataclass(frozen=True)
class Resumption:
    """What `--resume` continues: the state from the last checkpoint and, when
    it extends the run, the budget it had (the state's config has the new one)."""

    state: runstate.RunState
    extended_from: int | None = None


def check_resumable(run_dir: Path, requested: Config | None = None, overrides=()) -> Resumption:
    """The state the run resumes from (prepare_resume), after checking that
    the run can be resumed: it is a run directory, not finished (a completed
    run is when it is extended), not running elsewhere, its files are sound
    and its checkpoint fits; and that a config the user also gave
    (`requested`, or `overrides` applied to the run's config) is the run's,
    or the run's with a larger train.steps: an extension (module docstring),
    recorded by record_extension. Writes nothing. The caller holds the run's
    RunLock, taken before this check, so nothing can start the run in between."""
    run_dir = Path(run_dir)
    what = f"--resume {run_dir}"
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{what}: {runs.not_a_run(run_dir)}")
    stored = config_of(run_dir)
    if overrides:
        requested = load_run_config(run_dir / "config.yaml", overrides)
    extended_from = None
    if requested is not None:
        diff = config_difference(stored, requested)
        if diff and config_difference(stored, requested, ignore=("train.steps",)) == []:
            extended_from = _check_extension(what, stored, requested)
        elif diff:
            raise ConfigError(
                f"{what}: the config differs from the run's ({'; '.join(diff)}); a resumed run keeps "
                "its config (only a larger train.steps extends it): start a new run to change it, or "
                f"fork it: attn train --fork {run_dir} key=value"
            )
    summary = runs.read_summary(run_dir) or {}
    status = locks.effective_status(summary)
    unfinished_extension = status == "completed" and summary.get("steps", stored.train.steps) < stored.train.steps
    if status == "diverged" or (status == "completed" and extended_from is None and not unfinished_extension):
        hint = (
            (
                f"; to train it further, extend it: attn train --resume {run_dir} train.steps=N with N > "
                f"{stored.train.steps}"
            )
            if status == "completed"
            else ""
        )
        raise ConfigError(f"{what}: the run already {status} ({summary.get('reason') or 'nothing to resume'}){hint}")
    if status == "running":  # a writer on another host, whose lock this file system does not share
        raise ConfigError(f"{what}: the run is still running (pid {summary.get('pid')} on {summary.get('host')})")
    return Resumption(prepare_resume(requested if extended_from is not None else stored, run_dir), extended_from)


def _check_extension(what: str, stored: Config, requested: Config) -> int:
    """The old budget of an extension from stored.train.steps to requested's; ConfigError if it cannot be one."""
    old, new = stored.train.steps, requested.train.steps
    if new < old:
        raise ConfigError(
            f"{what}: train.steps: {old} -> {new}: a resume can only extend a run; to stop it "
            f"earlier, fork it: attn train --fork {what.removeprefix('--resume ')}@STEP train.steps={new}"
        )
    if stored.optim.schedule == "cosine":
        raise ConfigError(
            f"{what}: train.steps: {old} -> {new} with optim.schedule cosine: the rate at every step "
            f"depends on train.steps, so the extended run would not be the run a budget of {new} "
            f"makes (its rate would jump back up at step {old}); train a new run with train.steps={new}"
        )
    return old


def record_extension(run_dir: Path, resumption: Resumption) -> None:
    """config.yaml with the extended budget, its provenance listing each
    extension (old and new train.steps, when, the command); under the run's RunLock."""
    data = runs.read_run_config(run_dir, complete=True)
    history = data["provenance"].get("extensions") or []
    entry = {
        "from_steps": resumption.extended_from,
        "to_steps": resumption.state.config.train.steps,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(sys.argv),
    }
    runs.write_config(
        run_dir, to_dict(resumption.state.config), {**data["provenance"], "extensions": [*history, entry]}
    )


def prepare_resume(config: Config, run_dir: Path) -> runstate.RunState:
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
    for snapshot in ("attention.npz", "mechanism.npz", loop.MECHANISM_TRACE):  # each added to as the run goes on
        if (run_dir / snapshot).exists():
            arrayfiles.load_arrays(run_dir / snapshot)
    last = runstate.checkpoint_file(run_dir)
    try:
        state = runstate.prepare(config, run_dir, resume=last.exists())
    except runs.RunError as err:
        kept = (
            [
                step
                for step in runstate.kept_checkpoint_steps(run_dir)  # not the damaged file under its other name
                if not runstate.checkpoint_file(run_dir, step).samefile(last)
            ]
            if str(err).startswith(str(last))
            else []
        )
        if not kept:
            raise
        raise runs.RunError(
            f"{err}; the run keeps checkpoints at steps {', '.join(map(str, kept))} to fork from, "
            "or delete its checkpoint.npz to train it again from step 0"
        ) from None
    # Each record is fsynced before the next checkpoint: every step logged before it must be there.
    lost = sorted(set(range(0, state.step, config.logging.log_every)) - logged)
    if lost:
        more = f" and {len(lost) - 1} more" if len(lost) > 1 else ""
        raise runs.RunError(
            f"{run_dir / 'metrics.jsonl'}: no record of step {lost[0]}{more}, though the checkpoint "
            f"is at step {state.step}; move the run directory away, or delete its checkpoint.npz "
            "to train it again from step 0"
        )
    state.resumed = True
    return state


@dataclasses.dataclass(frozen=True)
class ForkPlan:
    """A fork, checked and not yet made: the source, the step and checkpoint
    it starts from, the fork's config, and its state at that step."""

    source: Path
    step: int
    checkpoint: Path
    config: Config
    changes: list  # 'key: source -> fork' for every key the fork changes
    state: runstate.RunState


def plan_fork(source: Path, step: int | None, overrides=()) -> ForkPlan:
    """Check a fork of `source` at `step` (None: its last checkpoint) with
    `overrides` applied to its config, reading its checkpoint; writes nothing.
    ConfigError for a key a fork may not change (schema.fork_keys), a step without a
    checkpoint (naming those there are) or a budget that ends before it."""
    source = Path(source)
    what = f"--fork {source}" + ("" if step is None else f"@{step}")
    runs.read_run_config(source, complete=True)
    stored = config_of(source)
    requested = load_run_config(source / "config.yaml", overrides)
    if requested.name == stored.name:
        requested = dataclasses.replace(requested, name=None)  # the fork is named for itself, not its source
    changes = config_difference(stored, requested, ignore=("name",))
    forkable, reasons = fork_keys(), not_forked_because()
    for change in changes:
        key = change.split(":", 1)[0]
        if key not in forkable:
            allowed = ", ".join(forkable)
            why = reasons.get(
                key, "it changes the shapes, the optimiser state, the task or the data the checkpoint was made with"
            )
            raise ConfigError(f"{what}: {change}: a fork cannot change it ({why}); a fork may change {allowed}")
    checkpoint, step = _fork_checkpoint(source, step, what)
    if requested.train.steps < step:
        raise ConfigError(
            f"{what}: train.steps: got {requested.train.steps}; a fork from step {step} needs train.steps >= {step}"
        )
    state = runstate.prepare(requested, source, checkpoint=checkpoint)
    if state.step != step:
        raise runs.RunError(f"{checkpoint}: refused: it holds step {state.step}, not {step}")
    return ForkPlan(source, step, checkpoint, requested, changes, state)


def _fork_checkpoint(source: Path, step: int | None, what: str) -> tuple[Path, int]:
    """(the checkpoint a fork starts from, its step): the run's last, or the one kept at `step`."""
    kept = runstate.kept_checkpoint_steps(source)
    if step is not None and step in kept:
        return runstate.checkpoint_file(source, step), step
    last = runstate.checkpoint_file(source)
    last_step, unreadable = None, None
    if last.exists():
        try:
            last_step = _checkpoint_step(last)
        except runs.RunError as err:
            unreadable = str(err)
    if last_step is not None and step in (None, last_step):
        return last, last_step
    if unreadable and step is None:
        raise ConfigError(
            f"{what}: its last checkpoint cannot be read: {unreadable}"
            + (f"; its checkpoints are at steps {', '.join(map(str, kept))}" if kept else "")
        )
    there = sorted(set(kept) | ({last_step} - {None}))
    retention = ""
    if there and step is not None and step < there[-1]:
        logging = config_of(source).logging
        retention = (
            f" (logging.keep_checkpoints {show_value(logging.keep_checkpoints)}, logging.keep_every "
            f"{show_value(logging.keep_every)}: older checkpoints are removed as new ones are written; "
            "to fork from more steps, train with a larger logging.keep_checkpoints or a logging.keep_every)"
        )
    raise ConfigError(
        f"{what}: no checkpoint"
        + (f" at step {step}" if step is not None else "")
        + "; "
        + (
            f"its checkpoints are at steps {', '.join(map(str, there))}{retention}"
            if there
            else "the run has written none yet (one every logging.checkpoint_every steps)"
        )
    )


def _checkpoint_step(path: Path) -> int | None:
    """The step a checkpoint file holds (its metadata), None if its metadata has
    none; runs.RunError if the file is not a complete .npz."""
    arrays = arrayfiles.load_arrays(path, arrayfiles.MAX_ARRAYS_BYTES, "checkpoint")
    try:
        return int(json.loads(str(arrays["meta"]))["step"])
    except (KeyError, TypeError, ValueError):
        return None


@contextlib.contextmanager
def new_fork(plan: ForkPlan, overrides=(), name: str | None = None):
    """The fork's run directory (new_run; default name <source>-fork-<step>),
    made a copy of its source at the fork's step before its config.yaml is
    written: the checkpoint (as the fork's own), the records before that step,
    the attention snapshot at step 0 and the mechanism measurements (and their trace) before it."""

    def fill(run_dir: Path) -> None:
        runstate.save_checkpoint(dataclasses.replace(plan.state, run_dir=run_dir))
        runs.truncate_metrics(run_dir, plan.step, source=plan.source)  # a damaged line: the source's
        for snapshot, kept in (
            ("attention.npz", lambda key: key != "attn_final"),
            *(
                (name, lambda key: key.split("/")[0].isdigit() and int(key.split("/")[0]) < plan.step)
                for name in ("mechanism.npz", loop.MECHANISM_TRACE)
            ),
        ):
            if (plan.source / snapshot).exists():
                arrays = arrayfiles.load_arrays(plan.source / snapshot)
                arrayfiles.save_arrays(run_dir / snapshot, {k: v for k, v in arrays.items() if kept(k)})

    origin = {
        "forked_from": {
            "run": str(plan.source.absolute()),
            "step": plan.step,
            "checkpoint": str(plan.checkpoint.absolute()),
            "changes": plan.changes,
        }
    }
    name = name or plan.config.name or f"{plan.source.absolute().name}-fork-{plan.step}"
    with new_run(plan.config, None, overrides, name, origin=origin, fill=fill) as run_dir:
        yield run_dir


def execute(
    config: Config,
    run_dir: Path,
    *,
    resume: bool = False,
    stop: StopFlag | None = None,
    progress=None,
    state: runstate.RunState | None = None,
) -> dict:
    """Train and draw the figures, holding the run's RunLock, from `state`
    when it is given (as check_resumable returns it), else from the config
    (and prepare_resume when resuming). A damaged file or a checkpoint that
    does not fit is refused (RunError) with the run left as it was; errors
    during training are recorded in the run directory, then re-raised."""
    run_dir = Path(run_dir)
    with locks.RunLock(run_dir, "train"):
        if state is None:
            state = prepare_resume(config, run_dir) if resume else runstate.prepare(config, run_dir)
        member_progress = None if progress is None else (lambda _member, step, record: progress(step, record))
        return execute_stack([state], stop=stop, progress=member_progress)[0]


def execute_stack(
    states: list[runstate.RunState],
    *,
    stop: StopFlag | None = None,
    progress=None,
    write_log: loop.WriteLog | None = None,
) -> list[dict]:
    """Train runs of one shape as one stack (train.run_stack; `write_log` a
    loop.WriteLog of its durable writes) and draw each run's figures if its
    config asks; the caller holds every run's RunLock. Errors during training
    are recorded in each run directory not yet finished, then re-raised."""
    with warnings.catch_warnings():
        # model.diagnostics takes the std of no scores when every score is non-finite; the record holds null there.
        warnings.filterwarnings("ignore", "Degrees of freedom <= 0 for slice", RuntimeWarning)
        allocator.keep_freed_memory()  # a step's large temporaries are reused, not faulted in afresh
        try:
            with denormals.flushing():  # a saturated head's gradients are not computed in microcode
                summaries = loop.run_stack(states, stop=stop, progress=progress, write_log=write_log)
        except Exception as err:
            for state in states:  # the loop marked those it stopped failed, where the disk let it
                if (runs.read_summary(state.run_dir) or {}).get("status") in ("running", "failed"):
                    record_failure(state.run_dir, err)
            raise
        for state, summary in zip(states, summaries):
            if state.config.logging.plots:
                draw_figures(state.run_dir, summary)
    return summaries


def draw_figures(run_dir: Path, summary: dict) -> None:
    """The run's figures (attn.train.figures); a failure is noted in its summary, never raised."""
    from attn.train import figures  # matplotlib is imported only by runs that draw

    try:
        figures.plot_run(run_dir)
    except Exception as err:  # a figure must never cost the run
        summary["plot_error"] = f"{type(err).__name__}: {err}"
        runs.write_json(run_dir / "summary.json", summary)


def record_failure(run_dir: Path, err: BaseException) -> None:
    """Keep the traceback beside the run, and mark it failed if its summary still says running (the loop
    marks the runs it stopped, at the step each last logged; it may not have reached the disk)."""
    try:
        runs.write_atomic(run_dir / "error.txt", "".join(traceback.format_exception(err)).encode())
        summary = runs.read_summary(run_dir) or {}
        if summary.get("status") == "failed":
            return
        summary.update(status="failed", reason=f"{type(err).__name__}: {err}", **runs.heartbeat_fields())
        runs.write_json(run_dir / "summary.json", summary)
    except runs.RunError:
        pass  # the disk that failed the run may fail this too; the original error still propagates

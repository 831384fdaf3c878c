"""One run from start to finish: its directory, training, figures.

Used by the CLI's `train` and by the sweep workers, so a run started either
way is the same run. Failures inside training are recorded in the run
directory (status `failed`, the error in summary.json, the traceback in
error.txt) before they propagate.
"""

from __future__ import annotations

import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from attn import plots, runs
from attn.config import Config, ConfigError, check_run_name, load_config, to_dict
from attn.train import StopFlag, train


def provenance(config_path: str | None, overrides) -> dict:
    return {
        "config_file": str(config_path) if config_path else None,
        "overrides": list(overrides),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "command": " ".join(sys.argv),
    }


def create(config: Config, config_path: str | None = None, overrides=(), name: str | None = None) -> Path:
    """Make a fresh run directory for `config` and write its config.yaml."""
    name = check_run_name(name, "--name") if name else config.name or runs.default_run_name(config_path)
    run_dir = runs.create_run_dir(Path(config.runs_dir), name)
    runs.write_config(run_dir, to_dict(config), provenance(config_path, overrides))
    return run_dir


def config_of(run_dir: Path) -> Config:
    """The config a run was made with."""
    return load_config(Path(run_dir) / "config.yaml")


def config_difference(a: Config, b: Config) -> list[str]:
    """'key: a -> b' for every field that differs."""
    flat_a, flat_b = _flatten(to_dict(a)), _flatten(to_dict(b))
    return [f"{k}: {flat_a.get(k)!r} -> {flat_b.get(k)!r}" for k in sorted(flat_a.keys() | flat_b.keys())
            if flat_a.get(k) != flat_b.get(k)]


def _flatten(data: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        if isinstance(v, dict) and k != "lr_mult":
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def check_resumable(run_dir: Path, requested: Config | None) -> Config:
    """The run's own config, after checking it can be resumed (and that a
    config the user also gave is the same)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"--resume {run_dir}: not a run directory (no config.yaml)")
    stored = config_of(run_dir)
    if requested is not None:
        diff = config_difference(stored, requested)
        if diff:
            raise ConfigError(f"--resume {run_dir}: the config differs from the run's: {'; '.join(diff)}")
    summary = runs.read_summary(run_dir) or {}
    if summary.get("status") == "completed":
        raise ConfigError(f"--resume {run_dir}: the run already completed")
    if not (run_dir / "checkpoint.npz").exists():
        raise ConfigError(f"--resume {run_dir}: no checkpoint yet; start the run again instead")
    return stored


def execute(config: Config, run_dir: Path, *, resume: bool = False, stop: StopFlag | None = None,
            progress=None) -> dict:
    """Train and draw the figures. Errors are recorded in the run directory, then re-raised."""
    run_dir = Path(run_dir)
    try:
        summary = train(config, run_dir, resume=resume, stop=stop, progress=progress)
    except Exception as err:
        record_failure(run_dir, err)
        raise
    if config.logging.plots:
        try:
            plots.plot_run(run_dir)
        except Exception as err:  # a figure must never cost the run
            summary["plot_error"] = f"{type(err).__name__}: {err}"
            runs.write_json(run_dir / "summary.json", summary)
    return summary


def record_failure(run_dir: Path, err: BaseException) -> None:
    """Mark the run failed, keeping the traceback beside it."""
    try:
        (run_dir / "error.txt").write_text("".join(traceback.format_exception(err)))
        summary = runs.read_summary(run_dir) or {}
        summary.update(status="failed", reason=f"{type(err).__name__}: {err}", **runs.heartbeat_fields())
        runs.write_json(run_dir / "summary.json", summary)
    except (OSError, runs.RunError):
        pass  # the disk that failed the run may fail this too; the original error still propagates

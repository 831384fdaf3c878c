"""Checkpoint retention: the last logging.keep_checkpoints kept (plus every
logging.keep_every-th), older ones removed only after the new one is in
place; a sweep cell keeps one; a fork at a removed step lists those kept; a
run that ran out of disk resumes once space is freed."""

import builtins
import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import TINY, without_timing

from attn import cli
from attn.analysis import listing
from attn.cli import common
from attn.config.loading import load_config
from attn.config.yamlio import ConfigError
from attn.experiment.spec import build_experiment
from attn.store import runs, runstate
from attn.train import lifecycle

REPO = Path(__file__).resolve().parents[1]


def trained(runs_dir: Path, name: str, *overrides) -> Path:
    config = load_config(
        None,
        [
            *TINY,
            f"runs_dir={runs_dir}",
            "train.steps=60",
            "logging.log_every=10",
            "logging.checkpoint_every=10",
            *overrides,
        ],
    )
    run_dir = lifecycle.create(config, name=name)
    lifecycle.execute(config, run_dir)
    return run_dir


def test_retained_steps_keep_the_last_the_multiples_and_always_the_newest():
    assert runstate.retained_steps([10, 20, 30, 40], 40, 2, None) == [30, 40]
    assert runstate.retained_steps([10, 20, 30, 40], 40, 1, 20) == [20, 40]
    assert runstate.retained_steps([10, 20, 30, 40], 40, None, None) == [10, 20, 30, 40]
    assert runstate.retained_steps([], 0, 1, None) == [0]
    # a resume replaying from 20 rewrites 30 and 40: the stopped run's later ones are not kept over the new
    assert runstate.retained_steps([10, 20, 30, 40], 20, 2, None) == [10, 20]
    assert runstate.retained_steps([10, 20, 30, 40], 20, None, None) == [10, 20], "keeping every one, too"


@pytest.mark.parametrize(
    "overrides,kept",
    [
        ((), [50, 60]),  # the default: the last two
        (("logging.keep_checkpoints=1",), [60]),
        (("logging.keep_checkpoints=1", "logging.keep_every=20"), [20, 40, 60]),
        (("logging.keep_checkpoints=null",), [10, 20, 30, 40, 50, 60]),  # every one (the first is at step 10)
    ],
)
def test_a_run_keeps_only_the_checkpoints_asked_for(tmp_path, overrides, kept):
    run_dir = trained(tmp_path, "run", *overrides)
    assert runstate.kept_checkpoint_steps(run_dir) == kept
    assert os.path.samefile(run_dir / "checkpoint.npz", runstate.checkpoint_file(run_dir, 60))


def test_a_fork_at_a_removed_step_lists_the_kept_ones(tmp_path):
    source = trained(tmp_path, "source")
    with pytest.raises(ConfigError) as refused:
        lifecycle.plan_fork(source, 20)
    assert "at step 20" in str(refused.value) and "steps 50, 60" in str(refused.value)
    assert "logging.keep_checkpoints 2" in str(refused.value)
    assert lifecycle.plan_fork(source, 50).step == 50
    kept_every = trained(tmp_path, "every", "logging.keep_every=20")
    assert lifecycle.plan_fork(kept_every, 20, ["optim.lr=0.1"]).step == 20


def test_a_sweep_cell_keeps_one_checkpoint_unless_its_experiment_asks(tmp_path):
    data = {"name": "e", "base": str(REPO / "configs" / "default.yaml"), "grid": {"optim.lr": [0.1]}, "seeds": [0]}
    cells = build_experiment(data, tmp_path / "e.yaml").cells
    assert cells[0].config.logging.keep_checkpoints == 1
    asked = build_experiment({**data, "overrides": {"logging.keep_checkpoints": 3}}, tmp_path / "e.yaml").cells
    assert asked[0].config.logging.keep_checkpoints == 3
    on_command_line = build_experiment(data, tmp_path / "e.yaml", overrides=["logging.keep_checkpoints=null"]).cells
    assert on_command_line[0].config.logging.keep_checkpoints is None


def test_attn_runs_shows_each_runs_disk_use(tmp_path, capsys):
    run_dir = trained(tmp_path, "run")
    row = listing.list_runs(tmp_path).rows[0]
    assert row.disk == runs.disk_use(run_dir) > 0
    # checkpoint.npz and the checkpoint-60.npz it names are one file on disk: counted once
    size = runstate.checkpoint_file(run_dir).stat().st_blocks * 512
    assert runs.disk_use(run_dir) < sum(p.stat().st_blocks * 512 for p in run_dir.iterdir())
    assert sum(p.stat().st_blocks * 512 for p in run_dir.iterdir()) - runs.disk_use(run_dir) == size
    assert cli.main(["runs", str(tmp_path)]) == common.EXIT_OK
    header = capsys.readouterr().out.splitlines()[0].split()
    assert header[-1] == "disk"


def test_a_run_out_of_disk_resumes_once_space_is_freed(tmp_path, monkeypatch, capsys):
    """ENOSPC injected into the write of the checkpoint at step 30: the run fails with one line, every file it
    has stays sound, and once the disk has room again it resumes and ends as the run that never stopped."""
    real_open = builtins.open
    full = {"on": True}

    class Full:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def __getattr__(self, name):
            return getattr(self.fh, name)

    def filling_open(path, mode="r", *args, **kwargs):
        fh = real_open(path, mode, *args, **kwargs)
        return Full(fh) if full["on"] and "checkpoint-30.npz" in str(path) and "w" in mode else fh

    monkeypatch.setattr(runs, "open", filling_open, raising=False)
    args = [
        "train",
        "--name",
        "full",
        *TINY,
        f"runs_dir={tmp_path}",
        "train.steps=60",
        "logging.log_every=10",
        "logging.checkpoint_every=10",
    ]
    assert cli.main(args) == common.EXIT_FAILED
    err = capsys.readouterr().err
    assert "checkpoint-30.npz: cannot write: no space left on device" in err and "Traceback" not in err
    run_dir = tmp_path / "full"
    assert runs.read_summary(run_dir)["status"] == "failed"
    assert runstate.kept_checkpoint_steps(run_dir) == [10, 20]  # nothing removed before a new one is in place
    assert not [p for p in run_dir.iterdir() if runs.TEMPORARY_NAME.match(p.name)]

    full["on"] = False  # space freed
    assert cli.main(["train", "--resume", str(run_dir)]) == common.EXIT_OK
    assert runs.read_summary(run_dir)["status"] == "completed"
    assert runstate.kept_checkpoint_steps(run_dir) == [50, 60]
    alone = trained(tmp_path, "alone")
    assert without_timing(runs.read_metrics(run_dir)) == without_timing(runs.read_metrics(alone))


@pytest.mark.faults
def test_a_run_that_filled_a_small_disk_resumes_after_the_filler_goes(tmp_path):
    """A real 2 MB tmpfs: a filler leaves the run too little room; it fails with one line; the filler deleted,
    the resumed run completes, its checkpoints bounded (without retention they filled the disk again)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        filler = disk / "filler"
        free = shutil.disk_usage(disk).free
        filler.write_bytes(b"\0" * (free - 200 * 1024))
        command = [
            sys.executable,
            "-m",
            "attn",
            "train",
            "--name",
            "run",
            *TINY,
            f"runs_dir={disk}",
            "train.steps=1500",
            "logging.log_every=1",
            "logging.checkpoint_every=25",
        ]
        failed = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=300)
        assert failed.returncode == common.EXIT_FAILED, failed.stderr
        assert "no space left on device" in failed.stderr and "Traceback" not in failed.stderr
        filler.unlink()
        resumed = subprocess.run(
            [sys.executable, "-m", "attn", "train", "--resume", str(disk / "run")],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=300,
        )
        assert resumed.returncode == common.EXIT_OK, resumed.stderr
        assert runs.read_summary(disk / "run")["status"] == "completed"
        assert runstate.kept_checkpoint_steps(disk / "run") == [1475, 1500]
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)

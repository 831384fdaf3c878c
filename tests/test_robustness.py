"""Runs survive bad input, NaNs, crashes and Ctrl-C, and resume exactly (issue 6).

Signals, exit codes and tracebacks are tested on the real CLI in
subprocesses (`python -m attn`, CI=true); the rest goes through `cli.main`
in-process: the same code without the ~1 s start-up of a process.
"""

import errno
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from helpers import PNG_SIGNATURE, SIZES, TINY, billion_laughs, without_timing

from attn import cli
from attn.cli import common
from attn.config.loading import build_spec, build_task, load_config
from attn.model import fast
from attn.store import arrayfiles, locks, runs, runstate
from attn.train import lifecycle, loop

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "CI": "true", "PYTHONPATH": str(REPO)}


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str


def start_cli(*args, cwd) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "attn", *map(str, args)],
        cwd=cwd,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen) -> Outcome:
    stdout, stderr = process.communicate(timeout=120)
    return Outcome(process.returncode, stdout, stderr)


def main_in_process(capsys, *args) -> Outcome:
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)


def assert_one_line_error(outcome: Outcome, *fragments: str) -> str:
    """Exit 2, a single `error: ...` line holding every fragment, no traceback."""
    assert outcome.code == common.EXIT_BAD_INPUT, outcome.stderr
    assert "Traceback" not in outcome.stderr
    lines = outcome.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), outcome.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def leftover_temporaries(run_dir: Path) -> list[str]:
    return [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def snapshot(run_dir: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())}


def tiny_config(runs_dir: Path, *overrides):
    return load_config(None, [*TINY, f"runs_dir={runs_dir}", *overrides])


def train_in_process(config, name: str, stop_at: int | None = None) -> Path:
    """A run through jobs (as the CLI does); `stop_at`: request a stop at that step."""
    run_dir = lifecycle.create(config, name=name)
    stop = loop.StopFlag()

    def progress(step, _record):
        if step == stop_at:
            stop.request("test")

    lifecycle.execute(config, run_dir, stop=stop, progress=progress)
    return run_dir


# ---------------------------------------------------------------------------
# Bad input: one line, exit 2, no traceback, nothing created in runs/
# ---------------------------------------------------------------------------
BAD_CONFIG_FILES = {  # name: (file contents; None = no file, "DIR" = a directory), fragments of the error
    "missing": (None, ["no such config file"]),
    "unreadable": ("DIR", ["is a directory"]),
    "binary": (b"\xff\xfe\x00", ["not UTF-8"]),
    "empty": ("", ["empty"]),
    "not_yaml": ("optim: {lr: 0.1\n", ["not valid YAML", "line 2"]),
    "not_a_mapping": ("- 1\n- 2\n", ["mapping", "list"]),
    "duplicate_key": ("optim:\n  lr: 0.1\n  lr: 0.2\n", ["duplicate key 'lr'"]),
    "unknown_key": ("optim:\n  lrr: 0.1\n", ["optim.lrr", "did you mean `optim.lr`"]),
    "wrong_type": ("model:\n  d_k: wide\n", ["model.d_k", "'wide'", "integer"]),
    "out_of_range": ("optim:\n  lr: -1\n", ["optim.lr", "-1", "> 0"]),
    "impossible": ("task:\n  n_keys: 4\n  n_pairs: 8\n", ["task.n_pairs", "8", "task.n_keys"]),
    "object_tag": ("optim: !!python/object/apply:os.system ['touch pwned']\n", ["python/object", "not allowed"]),
    "alias_bomb": (billion_laughs(), ["alias"]),
    "absurd_sizes": (
        "model:\n  d_model: 100000\n  d_k: 100000\ntrain:\n  batch_size: 100000\n",
        ["model.d_model=100000", "GiB"],
    ),
}


@pytest.mark.parametrize("case", BAD_CONFIG_FILES)
def test_a_bad_config_file_is_one_line_naming_file_and_field(case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    contents, fragments = BAD_CONFIG_FILES[case]
    path = tmp_path / "experiment.yaml"
    if contents == "DIR":
        path.mkdir()
    elif isinstance(contents, bytes):
        path.write_bytes(contents)
    elif contents is not None:
        path.write_text(contents)
    assert_one_line_error(main_in_process(capsys, "train", path), str(path), *fragments)
    assert not (tmp_path / "runs").exists()
    assert not (tmp_path / "pwned").exists()


BAD_ARGUMENTS = {  # name: (train arguments after the config file, fragments of the error)
    "override_without_value": (["optim.lr"], ["'optim.lr'", "key=value"]),
    "override_without_key": (["=0.1"], ["'=0.1'", "key=value"]),
    "override_bad_value": (["optim.lr=fast"], ["optim.lr", "'fast'", "float"]),
    "override_unknown_key": (["optim.lrr=0.1"], ["optim.lrr", "did you mean `optim.lr`"]),
    "override_not_yaml": (["optim.lr=[1"], ["optim.lr", "not valid YAML"]),
    "name_climbs_out": (["--name", "../escaped"], ["--name", "'../escaped'", "plain directory name"]),
    "name_has_separator": (["--name", "a/b"], ["--name", "'a/b'"]),
    "name_is_absolute": (["name=/tmp/abs"], ["name", "'/tmp/abs'"]),
    "resume_with_name": (["--resume", "runs/x", "--name", "y"], ["--name", "--resume"]),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_a_bad_override_or_run_name_is_refused_before_anything_is_created(case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "tiny.yaml"
    config.write_text("train:\n  steps: 2\n")
    args, fragments = BAD_ARGUMENTS[case]
    assert_one_line_error(main_in_process(capsys, "train", config, *args), *fragments)
    assert not (tmp_path / "runs").exists()
    assert not (tmp_path.parent / "escaped").exists() and not Path("/tmp/abs").exists()


PATH_CASES = {  # how the path goes wrong -> (the path below tmp_path, what the line says)
    "too_long": ("a" * 5000, "the path is too long"),
    "whole_path_too_long": ("/".join(["abc"] * 1200), "the path is too long"),
    "through_a_file": ("afile/runs", "is a file, not a directory"),
}


@pytest.mark.parametrize("case", PATH_CASES)
@pytest.mark.parametrize("command", ["train", "sweep"])
def test_a_path_the_os_refuses_is_one_line_naming_it(case, command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("a file\n")
    rest, says = PATH_CASES[case]
    where = str(tmp_path / rest)
    grid = ["--grid", "optim.lr=0.1"] if command == "sweep" else []
    line = assert_one_line_error(
        main_in_process(capsys, command, REPO / "configs" / "default.yaml", *grid, f"runs_dir={where}"),
        "runs_dir",
        where[:60],
        says,
    )
    assert len(line) < 400  # the path is shown cut, not all 5000 characters
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_directory_the_os_forbids_is_one_line_with_the_fix(tmp_path, monkeypatch, capsys):
    """Root may write anywhere, so the refusal is injected where the run directory is made."""

    def forbidden(self, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.chdir(tmp_path)  # a short path, shown whole
    monkeypatch.setattr(Path, "mkdir", forbidden)
    line = assert_one_line_error(
        main_in_process(capsys, "train", REPO / "configs" / "default.yaml", "runs_dir=locked"),
        "'locked'",
        "permission denied",
    )
    assert "change its permissions" in line


# ---------------------------------------------------------------------------
# Checkpoints that do not fit are refused on resume, the run left as it was
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """A tiny run stopped (and checkpointed) mid-way."""
    config = tiny_config(tmp_path_factory.mktemp("runs"), "train.steps=30", "logging.log_every=5")
    return train_in_process(config, "stopped", stop_at=12)


def rewrite_checkpoint(path: Path, change) -> None:
    arrays = arrayfiles.load_arrays(path)
    change(arrays)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_a_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def without_data_rng(arrays):
    meta = json.loads(str(arrays["meta"]))
    del meta["data_rng"]
    arrays["meta"] = np.array(json.dumps(meta))


BAD_CHECKPOINTS = {  # name: (how to spoil checkpoint.npz, fragments of the error)
    "truncated": (truncate, ["not a complete .npz checkpoint"]),
    "not_npz": (lambda p: p.write_bytes(np.random.default_rng(0).bytes(4096)), ["not an .npz checkpoint"]),
    "damaged": (flip_a_middle_byte, ["is damaged"]),
    "missing_array": (lambda p: rewrite_checkpoint(p, lambda a: a.pop("param/W_q")), ["missing array 'param/W_q'"]),
    "wrong_shape": (
        lambda p: rewrite_checkpoint(p, lambda a: a.update({"param/W_q": a["param/W_q"][:-1]})),
        ["'param/W_q'", "expected float32"],
    ),
    "wrong_dtype": (
        lambda p: rewrite_checkpoint(p, lambda a: a.update({"param/W_k": a["param/W_k"].astype(np.float64)})),
        ["'param/W_k' is float64", "expected float32"],
    ),
    "needs_pickle": (
        lambda p: rewrite_checkpoint(p, lambda a: a.update({"param/W_v": np.array([{"x": 1}])})),
        ["array 'param/W_v'", "pickle"],
    ),
    "malformed_meta": (lambda p: rewrite_checkpoint(p, without_data_rng), ["malformed metadata", "data_rng"]),
}


@pytest.mark.parametrize("case", BAD_CHECKPOINTS)
def test_a_checkpoint_that_does_not_fit_is_refused_with_the_reason(case, stopped_run, tmp_path, capsys):
    run_dir = shutil.copytree(stopped_run, tmp_path / "copy")
    spoil, fragments = BAD_CHECKPOINTS[case]
    spoil(run_dir / "checkpoint.npz")
    before = snapshot(run_dir)
    assert_one_line_error(
        main_in_process(capsys, "train", "--resume", run_dir), str(run_dir / "checkpoint.npz"), "refused", *fragments
    )
    assert snapshot(run_dir) == before


def test_the_real_cli_refuses_a_truncated_checkpoint_without_traceback(stopped_run, tmp_path):
    run_dir = shutil.copytree(stopped_run, tmp_path / "copy")
    truncate(run_dir / "checkpoint.npz")
    before = snapshot(run_dir)
    outcome = finish(start_cli("train", "--resume", run_dir, cwd=tmp_path))
    assert_one_line_error(outcome, "checkpoint.npz: refused: not a complete .npz checkpoint")
    assert snapshot(run_dir) == before


def test_resume_refuses_a_changed_config_showing_the_difference(stopped_run, tmp_path, capsys):
    run_dir = shutil.copytree(stopped_run, tmp_path / "copy")
    before = snapshot(run_dir)
    stored_lr = lifecycle.config_of(run_dir).optim.lr
    line = assert_one_line_error(
        main_in_process(capsys, "train", "--resume", run_dir, "optim.lr=0.3", "seed=0"),
        f"optim.lr: {stored_lr!r} -> 0.3",
    )
    assert "seed" not in line  # only what differs
    other = REPO / "configs/copy.yaml"
    assert_one_line_error(
        main_in_process(capsys, "train", "--resume", run_dir, other), "task.name: 'retrieval' -> 'copy'"
    )
    assert snapshot(run_dir) == before


def test_resume_refuses_a_completed_run_and_a_directory_that_is_not_a_run(tmp_path, capsys):
    run_dir = train_in_process(tiny_config(tmp_path, "train.steps=3"), "done")
    assert_one_line_error(main_in_process(capsys, "train", "--resume", run_dir), "already completed")
    assert_one_line_error(main_in_process(capsys, "train", "--resume", tmp_path), "not a run directory")


def test_resume_refuses_a_run_whose_process_is_still_alive(stopped_run, tmp_path, capsys):
    run_dir = shutil.copytree(stopped_run, tmp_path / "copy")
    summary = {**runs.read_summary(run_dir), "status": "running", **runs.heartbeat_fields()}  # this process
    runs.write_json(run_dir / "summary.json", summary)
    assert_one_line_error(main_in_process(capsys, "train", "--resume", run_dir), "still running", f"pid {os.getpid()}")


# ---------------------------------------------------------------------------
# Divergence
# ---------------------------------------------------------------------------
DIVERGING_CONFIG, DIVERGING_OVERRIDES = REPO / "configs/default.yaml", [*SIZES, "model.scale=none", "optim.lr=20"]


def test_a_diverging_run_stops_at_the_step_naming_it_and_the_parameter(tmp_path, capsys):
    outcome = finish(
        start_cli(
            "train", DIVERGING_CONFIG, *DIVERGING_OVERRIDES, "logging.log_every=1", "--name", "blowup", cwd=tmp_path
        )
    )
    run_dir = tmp_path / "runs" / "blowup"
    assert outcome.code == common.EXIT_DIVERGED, outcome.stderr
    assert "Traceback" not in outcome.stderr and "Warning" not in outcome.stderr
    assert outcome.stdout.splitlines()[-1] == str(Path("runs") / "blowup")
    summary = runs.read_summary(run_dir)
    records = runs.read_metrics(run_dir)
    step = summary["step"]
    assert summary["status"] == "diverged" and locks.effective_status(summary) == "diverged"
    assert [r["step"] for r in records] == list(range(step + 1))  # kept up to that step
    assert all(np.isfinite(r["train_loss"]) for r in records[:-1]) and "nonfinite" in records[-1]
    config = lifecycle.config_of(run_dir)
    names = fast.param_shapes(build_spec(config, build_task(config)))
    assert f"at step {step}" in summary["reason"] and any(name in summary["reason"] for name in names)
    assert f"diverged: step {step}/" in outcome.stderr and summary["reason"] in outcome.stderr
    assert summary["outcome"] == "diverged" and "outcome diverged" in outcome.stderr
    assert f"a lower optim.lr (this run's: {config.optim.lr:g})" in outcome.stderr
    for figure in ("loss.png", "diagnostics.png", "attention.png"):
        assert (run_dir / figure).read_bytes().startswith(PNG_SIGNATURE)
    assert_one_line_error(main_in_process(capsys, "train", "--resume", run_dir), "already diverged")


def test_on_nonfinite_continue_skips_and_records_the_bad_updates(tmp_path):
    config = load_config(
        DIVERGING_CONFIG,
        [
            *DIVERGING_OVERRIDES,
            f"runs_dir={tmp_path}",
            "train.steps=12",
            "logging.log_every=4",
            "train.on_nonfinite=continue",
            "logging.plots=false",
        ],
    )
    run_dir = train_in_process(config, "carry-on")
    summary = runs.read_summary(run_dir)
    bad = [r for r in runs.read_metrics(run_dir) if "nonfinite" in r]
    assert summary["status"] == "completed" and summary["step"] == config.train.steps
    assert summary["nonfinite_steps"] == len(bad) > 0
    params = {k: v for k, v in arrayfiles.load_arrays(run_dir / "checkpoint.npz").items() if k.startswith("param/")}
    assert all(np.isfinite(p).all() for p in params.values())  # no non-finite update was applied


# ---------------------------------------------------------------------------
# SIGINT, SIGTERM, SIGKILL on the real CLI; then resume, bit for bit
# ---------------------------------------------------------------------------
# ~0.7 CPU-s of steps left after the signal lands (~1.2 ms a step): on a loaded machine, more than that of wall
# time; the test sends the signal within one 5 ms poll of seeing the 4th line. Each case is run, resumed and run
# again uninterrupted as the reference: every step here is paid three times.
SIGNAL_STEPS, LOG_EVERY = 600, 10
SIGNAL_RUN = [*TINY, f"train.steps={SIGNAL_STEPS}", f"logging.log_every={LOG_EVERY}", "logging.checkpoint_every=20"]
SIGNAL_CASES = {  # signal name: overrides (an optimiser state and schedule worth restoring)
    "SIGINT": [
        "optim.momentum=0.9",
        "optim.nesterov=true",
        "optim.lr=0.05",
        "optim.schedule=cosine",
        "optim.warmup_steps=20",
    ],
    "SIGTERM": ["optim.name=adam", "optim.lr=0.01", "optim.clip_norm=1.0"],
    "SIGKILL": ["optim.momentum=0.5", "optim.lr=0.1"],
}
LINES_BEFORE_SIGNAL = 4  # steps 0..30: past the checkpoint at step 20


def logged_lines(run_dir: Path) -> int:
    try:
        return (run_dir / "metrics.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


@pytest.fixture(scope="module")
def signalled(tmp_path_factory):
    """Each case's run started through the CLI, sent its signal once metrics
    are flowing, then resumed through the CLI; plus an uninterrupted reference."""
    root = tmp_path_factory.mktemp("signals")
    cases = {
        name: dict(overrides=[*SIGNAL_RUN, *extra], run_dir=root / "runs" / name)
        for name, extra in SIGNAL_CASES.items()
    }
    processes = {name: start_cli("train", *case["overrides"], "--name", name, cwd=root) for name, case in cases.items()}
    waiting = dict(processes)
    while waiting:
        for name, process in list(waiting.items()):
            assert process.poll() is None, f"{name} ended before its signal: {finish(process)}"
            if logged_lines(cases[name]["run_dir"]) >= LINES_BEFORE_SIGNAL:
                process.send_signal(getattr(signal, name))
                del waiting[name]
        time.sleep(0.005)
    for name, case in cases.items():
        case["stopped"] = finish(processes[name])
        case["summary_after_stop"] = runs.read_summary(case["run_dir"])
        case["metrics_lines_after_stop"] = (case["run_dir"] / "metrics.jsonl").read_text().splitlines()
        case["files_after_stop"] = sorted(p.name for p in case["run_dir"].iterdir())
        case["checkpoint_step"] = json.loads(str(arrayfiles.load_arrays(case["run_dir"] / "checkpoint.npz")["meta"]))[
            "step"
        ]
    with open(cases["SIGKILL"]["run_dir"] / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 999, "train_lo')  # and power failed mid-append
    resumes = {name: start_cli("train", "--resume", case["run_dir"], cwd=root) for name, case in cases.items()}
    for name, case in cases.items():
        config = load_config(None, [*case["overrides"], f"runs_dir={root / 'reference'}"])
        case["reference"] = train_in_process(config, name)
    for name, case in cases.items():
        case["resumed"] = finish(resumes[name])
    return cases


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_sigint_and_sigterm_checkpoint_and_exit_with_the_signal_code(signalled, name):
    case = signalled[name]
    stopped, summary = case["stopped"], case["summary_after_stop"]
    assert stopped.code == common.EXIT_SIGNAL[name], stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert summary["status"] == "interrupted" and name in summary["reason"]
    assert summary["step"] == case["checkpoint_step"] < SIGNAL_STEPS
    last_lines = stopped.stderr.strip().splitlines()[-2:]  # the progress output ends cleanly with these
    assert last_lines[0].startswith(f"interrupted: step {summary['step']}/{SIGNAL_STEPS}")
    assert last_lines[1] == f"resume with: attn train --resume {Path('runs') / name}"  # attn train was run
    assert stopped.stdout.splitlines()[-1] == str(Path("runs") / name)
    assert not [n for n in case["files_after_stop"] if n.endswith(".tmp")]


def test_sigkill_keeps_every_logged_line_and_the_run_shows_stale(signalled):
    case = signalled["SIGKILL"]
    assert case["stopped"].code == -signal.SIGKILL
    lines = case["metrics_lines_after_stop"]
    assert len(lines) >= LINES_BEFORE_SIGNAL
    assert [json.loads(line)["step"] for line in lines] == list(range(0, LOG_EVERY * len(lines), LOG_EVERY))
    summary = case["summary_after_stop"]
    assert summary["status"] == "running"
    assert locks.effective_status(summary) == "stale"  # same host, its pid is dead


@pytest.mark.parametrize("name", SIGNAL_CASES)
def test_a_resumed_run_equals_an_uninterrupted_one_bit_for_bit(signalled, name):
    case = signalled[name]
    assert case["resumed"].code == common.EXIT_OK, case["resumed"].stderr
    assert case["resumed"].stdout.splitlines()[-1] == str(case["run_dir"])
    resumed, reference = case["run_dir"], case["reference"]
    assert without_timing(runs.read_metrics(resumed)) == without_timing(runs.read_metrics(reference))
    summary, expected = runs.read_summary(resumed), runs.read_summary(reference)
    assert summary["resumed_from"] == case["checkpoint_step"]
    assert (summary["status"], summary["best"], summary["final"]) == ("completed", expected["best"], expected["final"])
    ours = arrayfiles.load_arrays(resumed / "checkpoint.npz")
    theirs = arrayfiles.load_arrays(reference / "checkpoint.npz")
    assert ours.keys() == theirs.keys()
    for key in ours:
        if key != "meta":
            np.testing.assert_array_equal(ours[key], theirs[key], err_msg=key)
    assert not leftover_temporaries(resumed)


def test_a_second_sigint_stops_at_once_and_the_run_still_resumes_exactly(tmp_path, monkeypatch, capsys):
    overrides = ["train.steps=60", "logging.log_every=5", "logging.checkpoint_every=10"]
    reference = train_in_process(tiny_config(tmp_path, *overrides), "reference")
    signalled_step = 25  # loss_and_grads runs once an iteration
    last_checkpoint = signalled_step // 10 * 10
    real_loss_and_grads, calls = fast.loss_and_grads, itertools.count()

    def interrupted_twice(*args):
        if next(calls) != signalled_step:
            return real_loss_and_grads(*args)
        os.kill(os.getpid(), signal.SIGINT)  # first: stop after this step
        result = real_loss_and_grads(*args)
        os.kill(os.getpid(), signal.SIGINT)  # second: stop now
        return result

    pytest_handler = signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(fast, "loss_and_grads", interrupted_twice)
    outcome = main_in_process(capsys, "train", *TINY, f"runs_dir={tmp_path}", *overrides, "--name", "twice")
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGINT) is pytest_handler
    run_dir = tmp_path / "twice"
    summary = runs.read_summary(run_dir)
    assert outcome.code == common.EXIT_SIGNAL["SIGINT"] and "Traceback" not in outcome.stderr
    assert summary["status"] == "interrupted"
    assert summary["reason"] == (
        f"stopped immediately during step {signalled_step}; resume continues from step {last_checkpoint}"
    )
    checkpoint_meta = json.loads(str(arrayfiles.load_arrays(run_dir / "checkpoint.npz")["meta"]))
    assert checkpoint_meta["step"] == last_checkpoint  # none written for the half-done step
    assert main_in_process(capsys, "train", "--resume", run_dir).code == common.EXIT_OK
    assert without_timing(runs.read_metrics(run_dir)) == without_timing(runs.read_metrics(reference))


def summary_writes_cut_once(monkeypatch, status: str, cut) -> list[str]:
    """runs.write_json, but the first write of a summary with `status` calls cut() first (a signal arriving
    then); the statuses of the summaries written, in order."""
    written, write_json = [], runs.write_json

    def cut_once(path, data):
        if Path(path).name == "summary.json" and data.get("status") == status and f"cut {status}" not in written:
            written.append(f"cut {status}")
            cut()
        write_json(path, data)
        if Path(path).name == "summary.json":
            written.append(data["status"])

    monkeypatch.setattr(runs, "write_json", cut_once)
    return written


def test_a_second_sigint_as_the_interrupted_summary_is_written_still_leaves_it_saying_so(tmp_path, monkeypatch, capsys):
    overrides = ["train.steps=60", "logging.log_every=5", "logging.checkpoint_every=10"]
    reference = train_in_process(tiny_config(tmp_path, *overrides), "reference")
    signalled_step = 25
    real_loss_and_grads, calls = fast.loss_and_grads, itertools.count()

    def interrupted_once(*args):
        if next(calls) == signalled_step:
            os.kill(os.getpid(), signal.SIGINT)  # first: stop after this step, with a checkpoint
        return real_loss_and_grads(*args)

    monkeypatch.setattr(fast, "loss_and_grads", interrupted_once)
    written = summary_writes_cut_once(monkeypatch, "interrupted", lambda: os.kill(os.getpid(), signal.SIGINT))
    outcome = main_in_process(capsys, "train", *TINY, f"runs_dir={tmp_path}", *overrides, "--name", "twice")
    monkeypatch.undo()
    summary = runs.read_summary(tmp_path / "twice")
    assert written == ["running", "cut interrupted", "interrupted"]  # the write the signal cut, made again
    assert outcome.code == common.EXIT_SIGNAL["SIGINT"] and "Traceback" not in outcome.stderr
    assert (summary["status"], summary["step"]) == ("interrupted", signalled_step + 1)
    assert summary["reason"] == f"stopped by SIGINT at step {signalled_step + 1}; checkpoint saved"
    assert f"resume with: attn train --resume {tmp_path / 'twice'}" in outcome.stderr
    assert main_in_process(capsys, "train", "--resume", tmp_path / "twice").code == common.EXIT_OK
    assert without_timing(runs.read_metrics(tmp_path / "twice")) == without_timing(runs.read_metrics(reference))


def test_a_completed_summary_cut_short_by_a_signal_is_written_whole(tmp_path, monkeypatch):
    config = tiny_config(tmp_path, "train.steps=30", "logging.log_every=5")
    reference = runs.read_summary(train_in_process(config, "reference"))
    run_dir = lifecycle.create(config, name="cut")

    def second_signal():
        raise KeyboardInterrupt  # as attn's handler raises it on a second signal

    written = summary_writes_cut_once(monkeypatch, "completed", second_signal)
    with pytest.raises(KeyboardInterrupt):
        lifecycle.execute(config, run_dir, stop=loop.StopFlag())
    summary = runs.read_summary(run_dir)
    assert written == ["running", "cut completed", "completed"]
    kept = ("status", "step", "best", "final", "outcome", "outcome_detail")
    assert {k: summary[k] for k in kept} == {k: reference[k] for k in kept}


def test_a_run_that_fails_mid_run_says_the_step_it_last_logged_and_keeps_its_traceback(tmp_path, monkeypatch):
    config = tiny_config(tmp_path, "train.steps=60", "logging.log_every=5", "logging.checkpoint_every=10")
    run_dir = lifecycle.create(config, name="fails")
    real_loss_and_grads, calls = fast.loss_and_grads, itertools.count()

    def fails_at_iteration_23(*args):
        if next(calls) == 23:
            raise MemoryError("the step's temporaries")
        return real_loss_and_grads(*args)

    monkeypatch.setattr(fast, "loss_and_grads", fails_at_iteration_23)
    with pytest.raises(MemoryError):
        lifecycle.execute(config, run_dir, stop=loop.StopFlag())
    summary = runs.read_summary(run_dir)
    assert (summary["status"], summary["step"]) == ("failed", 20)  # not the step of its last heartbeat
    assert summary["reason"] == "MemoryError: the step's temporaries"
    assert "MemoryError" in (run_dir / "error.txt").read_text()


def test_a_torn_last_metrics_line_is_ignored_and_a_torn_middle_line_refused(tmp_path):
    records = [{"step": 0, "train_loss": 1.5}, {"step": 5, "train_loss": 1.25}]
    text = "".join(json.dumps(r) + "\n" for r in records)
    (tmp_path / "metrics.jsonl").write_text(text + '{"step": 10, "tra')
    assert runs.read_metrics(tmp_path) == records
    (tmp_path / "metrics.jsonl").write_text('{"step": 10, "tra\n' + text)
    with pytest.raises(runs.RunError, match="line 1 is not JSON"):
        runs.read_metrics(tmp_path)


def test_effective_status_uses_the_pid_here_and_the_heartbeat_elsewhere():
    here = {"status": "running", "host": socket.gethostname(), "pid": os.getpid(), "updated_at": 0.0}
    assert locks.effective_status(here) == "running"
    elsewhere = {**here, "host": "another-host", "updated_at": time.time()}
    assert locks.effective_status(elsewhere) == "running"
    assert locks.effective_status(elsewhere, now=elsewhere["updated_at"] + locks.STALE_AFTER_SECONDS + 1) == "stale"


# ---------------------------------------------------------------------------
# Atomic writes, a full disk, an unwritable runs/
# ---------------------------------------------------------------------------
class FullDisk:
    """An `open` for attn.store.runs: `allowed` writes go through, each later write
    puts half its bytes on disk and fails with ENOSPC, as a full disk does."""

    def __init__(self, allowed: int):
        self.allowed = allowed

    def __call__(self, path, mode="r", *args, **kwargs):
        return _FillingFile(open(path, mode, *args, **kwargs), self)


class _FillingFile:
    def __init__(self, handle, disk: FullDisk):
        self.handle, self.disk = handle, disk

    def write(self, data):
        self.disk.allowed -= 1
        if self.disk.allowed < 0:
            self.handle.write(data[: len(data) // 2])
            self.handle.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.handle.write(data)

    def __getattr__(self, name):
        return getattr(self.handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()


def test_write_atomic_keeps_the_old_file_when_writing_or_renaming_fails(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text("old")
    monkeypatch.setattr(runs, "open", FullDisk(allowed=0), raising=False)
    with pytest.raises(runs.RunError, match="no space left on device"):
        runs.write_atomic(path, b"new and longer")
    monkeypatch.undo()

    def rename_fails(src, dst):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(runs.os, "replace", rename_fails)
    with pytest.raises(runs.RunError, match="cannot write"):
        runs.write_atomic(path, b"new and longer")
    monkeypatch.undo()
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_full_disk_mid_run_fails_in_one_line_and_corrupts_nothing(tmp_path, monkeypatch, capsys):
    config = tiny_config(tmp_path, "train.steps=60", "logging.log_every=1", "logging.checkpoint_every=5")
    monkeypatch.setattr(runs, "open", FullDisk(allowed=16), raising=False)
    outcome = main_in_process(
        capsys,
        "train",
        *TINY,
        f"runs_dir={tmp_path}",
        "train.steps=60",
        "logging.log_every=1",
        "logging.checkpoint_every=5",
        "--name",
        "full",
    )
    monkeypatch.undo()
    run_dir = tmp_path / "full"
    assert outcome.code == common.EXIT_FAILED and "Traceback" not in outcome.stderr
    errors = [line for line in outcome.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no space left on device" in errors[0] and str(run_dir) in errors[0]
    assert outcome.stdout.splitlines()[-1] == str(run_dir)
    assert lifecycle.config_of(run_dir) == config
    assert runs.read_summary(run_dir)["status"] == "running"  # no room to record the failure either
    steps = [r["step"] for r in runs.read_metrics(run_dir)]
    assert steps == list(range(len(steps))) and len(steps) > 0
    state = runstate.prepare(config, run_dir, resume=True)  # the checkpoint before the failure still loads
    assert 0 < state.step <= len(steps)
    assert not leftover_temporaries(run_dir)


def test_an_unwritable_runs_dir_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("not a directory")
    assert_one_line_error(
        main_in_process(capsys, "train", *TINY, "runs_dir=a_file/runs"),
        "runs_dir 'a_file/runs': a_file is a file, not a directory; choose a directory",
    )
    monkeypatch.setattr(runs, "open", FullDisk(allowed=0), raising=False)  # no room for config.yaml
    assert_one_line_error(
        main_in_process(capsys, "train", *TINY, "runs_dir=runs", "--name", "x"),
        "config.yaml",
        "no space left on device",
    )
    assert list((tmp_path / "runs").iterdir()) == []


# ---------------------------------------------------------------------------
# Concurrency
# ---------------------------------------------------------------------------
def test_runs_started_at_the_same_moment_never_share_a_directory(tmp_path):
    config = tiny_config(tmp_path)
    n = 8
    barrier, made = threading.Barrier(n), []

    def start():
        barrier.wait()
        made.append(lifecycle.create(config, name="same"))

    threads = [threading.Thread(target=start) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(made)) == n
    assert all(lifecycle.config_of(run_dir) == config for run_dir in made)


def test_resuming_removes_temporaries_a_killed_writer_left(tmp_path):
    """SIGKILL mid-write leaves `.checkpoint.npz.<pid>.tmp`; the next owner of
    the run directory removes it, but never a live writer's."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".checkpoint.npz.{dead.pid}.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / f".summary.json.{os.getpid()}.tmp").write_bytes(b"being written")
    (tmp_path / "checkpoint.npz").write_bytes(b"intact")
    assert runs.remove_dead_temporaries(tmp_path) == [f".checkpoint.npz.{dead.pid}.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["checkpoint.npz", f".summary.json.{os.getpid()}.tmp"])


def test_a_stop_during_a_checkpoint_write_names_the_checkpoint_it_left(tmp_path, monkeypatch, capsys):
    """A second signal lands after checkpoint-30 is written and linked but before the write returns (pruning the
    older ones): the summary names step 30, where --resume continues, not the checkpoint before it."""
    overrides = ["train.steps=60", "logging.log_every=5", "logging.checkpoint_every=10"]
    real_remove, calls = runstate.remove_checkpoints, itertools.count()

    def interrupted_while_pruning(run_dir, keep):
        if next(calls) == 2:  # the checkpoints at steps 10, 20, then 30
            raise KeyboardInterrupt
        return real_remove(run_dir, keep)

    monkeypatch.setattr(runstate, "remove_checkpoints", interrupted_while_pruning)
    outcome = main_in_process(capsys, "train", *TINY, f"runs_dir={tmp_path}", *overrides, "--name", "mid")
    monkeypatch.undo()
    summary = runs.read_summary(tmp_path / "mid")
    assert outcome.code == common.EXIT_SIGNAL["SIGINT"] and summary["status"] == "interrupted"
    assert summary["reason"].endswith("resume continues from step 30")
    assert json.loads(str(arrayfiles.load_arrays(tmp_path / "mid" / "checkpoint.npz")["meta"]))["step"] == 30

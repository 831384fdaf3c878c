"""The store's contract (attn.store.runs and its callers): one writer per run
directory (RunLock), every read bounded and checked, one rule for names, no
writing through symbolic links, quiet and short failures. Each class of the
issue has its cases here; everything runs in-process except the lock holders
(a process that holds a lock, then dies)."""

import json
import os
import socket
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest
import yaml
from helpers import SIZES, TINY, facts_in

from attn import cli
from attn.cli import common
from attn.config import yamlio
from attn.config.loading import load_config
from attn.config.yamlio import ConfigError, parse_yaml
from attn.experiment import spec as experiments
from attn.experiment import sweep
from attn.store import arrayfiles, locks, runs
from attn.train import figures, lifecycle

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "CI": "true", "PYTHONPATH": str(REPO)}


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------
def main(capsys, *args) -> tuple[int, str]:
    code = cli.main([str(a) for a in args])
    return code, capsys.readouterr().err


def one_line_error(capsys, *args) -> str:
    """Run the CLI in-process; it must fail with exit 2 and a single `error:` line."""
    code, err = main(capsys, *args)
    assert code == common.EXIT_BAD_INPUT, err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


def snapshot(directory: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


class Holder:
    """Another process holding a directory's RunLock until it is killed."""

    def __init__(self, directory: Path, purpose: str = "sweep"):
        code = (
            "import sys, time; from attn.store import locks; locks.RunLock(sys.argv[1], sys.argv[2]).__enter__(); "
            "print('held', flush=True); time.sleep(120)"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", code, str(directory), purpose], env=ENV, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout.readline() == "held\n"

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A run stopped with a checkpoint at step 8, resumable; DAMAGE's line numbers follow from its records."""
    root = tmp_path_factory.mktemp("store")
    config = load_config(
        None, [*TINY, f"runs_dir={root}", "train.steps=12", "logging.log_every=2", "logging.checkpoint_every=4"]
    )
    run_dir = lifecycle.create(config, name="stopped")
    stop = lifecycle.StopFlag()
    lifecycle.execute(config, run_dir, stop=stop, progress=lambda step, _: stop.request("test") if step == 7 else None)
    assert runs.read_summary(run_dir)["status"] == "interrupted"
    assert [r["step"] for r in runs.read_metrics(run_dir)] == [0, 2, 4, 6]
    return run_dir


@pytest.fixture
def run_copy(stopped, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(stopped, tmp_path / "runs" / "copy"))


# ---------------------------------------------------------------------------
# 1. One writer per run directory
# ---------------------------------------------------------------------------
def test_a_second_writer_is_refused_in_one_line_naming_the_holder(run_copy, capsys):
    holder = Holder(run_copy, "sweep")
    try:
        before = snapshot(run_copy)
        expected = f"error: {run_copy}: in use by attn sweep (pid {holder.process.pid} on {socket.gethostname()} since "
        assert one_line_error(capsys, "train", "--resume", run_copy).startswith(expected)
        assert one_line_error(capsys, "plot", run_copy).startswith(expected)
        assert snapshot(run_copy) == before
        assert locks.effective_status(runs.read_summary(run_copy), run_dir=run_copy) == "interrupted"
    finally:
        holder.kill()
    code, err = main(capsys, "train", "--resume", run_copy)  # the holder is gone: the run is free again
    assert code == common.EXIT_OK, err


def test_a_sweep_skips_a_cell_that_a_cli_resume_holds(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "exp",
                "base": str(REPO / "configs/default.yaml"),
                "overrides": {"train.steps": 4, "logging.plots": False},
                "grid": {"model.d_k": [4]},
                "seeds": [0],
            }
        )
    )
    experiment = experiments.load_experiment(path, str(tmp_path / "runs"))
    cell = experiment.cells[0]
    (experiment.directory / cell.name).mkdir(parents=True)
    holder = Holder(experiment.directory / cell.name, "train --resume")
    try:
        outcome = sweep.run_cells([cell], str(experiment.directory), str(path))[0]
    finally:
        holder.kill()
    assert (outcome.action, outcome.status) == ("skipped-locked", "running")
    assert outcome.detail.startswith(f"attn train --resume (pid {holder.process.pid} on {socket.gethostname()}")
    assert sweep.run_cells([cell], str(experiment.directory), str(path))[0].action == "ran"


def test_the_lock_is_reentrant_in_its_thread_and_exclusive_across_threads(tmp_path):
    refused = []

    def other_thread():
        try:
            with locks.RunLock(tmp_path, "plot"):
                pass
        except locks.RunLocked as err:
            refused.append(err.holder)

    with locks.RunLock(tmp_path, "train"):
        with locks.RunLock(tmp_path, "plot"):  # a run's figures inside its training
            thread = threading.Thread(target=other_thread)
            thread.start()
            thread.join()
        assert json.loads((tmp_path / locks.LOCK_NAME).read_text())["purpose"] == "train"
    assert [h["pid"] for h in refused] == [os.getpid()]
    assert (tmp_path / locks.LOCK_NAME).read_bytes() == b""  # released: no holder recorded
    other_thread()
    assert len(refused) == 1


def test_a_writer_killed_holding_the_lock_frees_it_and_its_run_reads_stale(tmp_path):
    run_dir = tmp_path / "killed"
    run_dir.mkdir()
    runs.write_config(run_dir, {"seed": 0}, {})  # killed before its first summary.json
    holder = Holder(run_dir, "train")
    assert locks.effective_status(None, run_dir=run_dir) == "running"
    holder.kill()
    assert locks.effective_status(None, run_dir=run_dir) == "stale"
    assert locks.effective_status(None, run_dir=tmp_path) == "unknown"  # not a run directory
    with locks.RunLock(run_dir, "train"):
        pass


def test_runs_lists_a_run_killed_before_its_first_summary_as_stale(tmp_path, capsys):
    run_dir = lifecycle.create(load_config(None, [*TINY, f"runs_dir={tmp_path}"]), name="early")
    code, out = cli.main(["runs", str(tmp_path), "--status", "stale"]), capsys.readouterr().out
    assert code == common.EXIT_OK and out.splitlines()[1].split()[:2] == [run_dir.name, "stale"]


# ---------------------------------------------------------------------------
# 3. Every read bounded
# ---------------------------------------------------------------------------
def test_devices_fifos_and_directories_are_refused_before_a_byte_is_read(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "fifo.yaml")  # opening it for reading would block without O_NONBLOCK
    assert facts_in(one_line_error(capsys, "train", "/dev/zero"), "/dev/zero:", "character device")
    assert "fifo.yaml: is a FIFO, not a config file" in one_line_error(capsys, "config", tmp_path / "fifo.yaml")
    experiment = tmp_path / "exp.yaml"
    experiment.write_text("name: e\nbase: /dev/zero\ngrid: {model.d_k: [4]}\nseeds: [0]\n")
    assert "base: /dev/zero: is a character device" in one_line_error(capsys, "sweep", experiment)
    assert "is a FIFO, not an experiment file" in one_line_error(capsys, "sweep", tmp_path / "fifo.yaml")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "name, spoil, fragment",
    [
        ("metrics.jsonl", lambda p: (p.unlink(), os.mkfifo(p)), "metrics.jsonl: is a FIFO, not a metrics file"),
        ("summary.json", lambda p: (p.unlink(), p.mkdir()), "summary.json: is a directory, not a run summary"),
        ("metrics.jsonl", lambda p: p.write_bytes(b'{"step": 0}\n' + b" " * 2048 + b"\n"), "bytes is too large"),
        ("checkpoint.npz", lambda p: p.write_bytes(p.read_bytes() + b"\0" * (2 << 20)), "bytes is too large"),
        ("config.yaml", lambda p: p.write_bytes(p.read_bytes() + b"#" * (1 << 20)), "bytes is too large"),
    ],
)
def test_run_files_that_are_not_regular_or_over_their_cap_are_refused(
    run_copy, monkeypatch, capsys, name, spoil, fragment
):
    monkeypatch.setattr(runs, "MAX_METRICS_BYTES", 2048)
    spoil(run_copy / name)
    before = snapshot(run_copy)
    assert fragment in one_line_error(capsys, "train", "--resume", run_copy)
    assert snapshot(run_copy) == before


def write_grid(tmp_path, grid, seeds=(0,), **extra) -> Path:
    path = tmp_path / "grid.yaml"
    path.write_text(
        yaml.safe_dump(
            {"name": "grid", "base": str(REPO / "configs/default.yaml"), "grid": grid, "seeds": list(seeds), **extra}
        )
    )
    return path


def test_the_cell_cap_is_computed_from_the_grid_shape_before_anything_is_expanded(tmp_path, monkeypatch, capsys):
    grid = {f"model.{k}": [1.0 + i for i in range(10)] for k in ("qk_gain", "v_gain", "o_gain", "readout_gain")}
    grid.update({"optim.lr": [0.1 * (i + 1) for i in range(10)], "optim.momentum": [0.05 * i for i in range(10)]})
    path = write_grid(tmp_path, grid, seeds=(0, 1))
    monkeypatch.setattr(experiments.itertools, "product", lambda *a: pytest.fail("the grid was expanded"))
    message = one_line_error(capsys, "sweep", path, "--runs-dir", tmp_path / "runs")
    assert facts_in(message, "2,000,000 cells", "2 seeds", "10,000")
    assert "--max-cells 2000000" in message
    monkeypatch.undo()
    small = write_grid(tmp_path, {"model.d_k": [4, 8]}, seeds=(0, 1))
    assert facts_in(
        one_line_error(capsys, "report", small, "--max-cells", "3", "--runs-dir", tmp_path / "runs"),
        "4 cells",
        "limit of 3",
    )
    assert len(experiments.load_experiment(small, max_cells=4).cells) == 4
    assert not (tmp_path / "runs").exists()


def test_each_grid_point_is_validated_once_and_gives_the_config_a_file_would(tmp_path, monkeypatch):
    points = []
    with_values = experiments.with_values
    monkeypatch.setattr(experiments, "with_values", lambda *args: points.append(args[1]) or with_values(*args))
    grid = {"model.d_k": [4, 8, 16], "optim.lr_mult": [{"W_q": 0.5}, {}], "optim.lr": ["1e-2"]}
    experiment = experiments.load_experiment(write_grid(tmp_path, grid, seeds=(0, 1, 2)))
    assert len(points) == 3 * 2 and len(experiment.cells) == 3 * 2 * 3
    for cell in experiment.cells:
        overrides = [f"{k}={json.dumps(v)}" for k, v in cell.settings] + [
            f"seed={cell.seed}",
            "logging.plots=false",
            "logging.mechanism_trace=false",
            "logging.keep_checkpoints=1",
        ]
        assert cell.config == load_config(REPO / "configs/default.yaml", overrides)


# ---------------------------------------------------------------------------
# 4 and 7. Damaged run files: one line naming the file and what to do; nothing changed, never `failed`
# ---------------------------------------------------------------------------
def add_metrics_line(line: bytes, at: int | None = None):
    def spoil(run_dir: Path):
        lines = (run_dir / "metrics.jsonl").read_bytes().splitlines(keepends=True)
        lines.insert(len(lines) if at is None else at, line + b"\n")
        (run_dir / "metrics.jsonl").write_bytes(b"".join(lines))

    return spoil


def edit_summary(**fields):
    def spoil(run_dir: Path):
        runs.write_json(run_dir / "summary.json", {**json.loads((run_dir / "summary.json").read_text()), **fields})

    return spoil


def rewrite(name: str, data: bytes):
    return lambda run_dir: (run_dir / name).write_bytes(data)


METRICS_REPAIR = "; delete that line (or move the run directory away) and try again"
SUMMARY_REPAIR = "; delete it (a resumed run writes it again) or move the run directory away"
DAMAGE = {  # case: (how the run is damaged, the file named, what the error says is wrong, what it says to do)
    "a_list_line": (
        add_metrics_line(b"[1, 2]"),
        "metrics.jsonl",
        "line 5 is not a JSON object (got a list)",
        METRICS_REPAIR,
    ),
    "bytes_0xff": (
        add_metrics_line(b'\xff\xfe{"step": 7}', at=1),
        "metrics.jsonl",
        "line 2 is not UTF-8 text",
        METRICS_REPAIR,
    ),
    "garbage_mid_file": (add_metrics_line(b"garbage", at=2), "metrics.jsonl", "line 3 is not JSON", METRICS_REPAIR),
    "no_step": (
        add_metrics_line(b'{"train_loss": 1.0}', at=2),
        "metrics.jsonl",
        "line 3 has no integer `step`",
        METRICS_REPAIR,
    ),
    "two_writers": (
        add_metrics_line(b'{"step": 2}'),
        "metrics.jsonl",
        "line 5 has step 2 after step 6",
        METRICS_REPAIR,
    ),
    "nested_value": (
        add_metrics_line(b'{"step": 9, "eval_loss": [1]}'),
        "metrics.jsonl",
        "line 5 holds a list in `eval_loss`",
        METRICS_REPAIR,
    ),
    "summary_list": (
        rewrite("summary.json", b"[1, 2, 3]\n"),
        "summary.json",
        "unreadable: not a JSON object (got a list)",
        SUMMARY_REPAIR,
    ),
    "summary_status": (
        edit_summary(status=5),
        "summary.json",
        "unreadable: `status` is a number, expected one of",
        SUMMARY_REPAIR,
    ),
    "summary_heartbeat": (
        edit_summary(updated_at="soon"),
        "summary.json",
        "unreadable: `updated_at` is a string",
        SUMMARY_REPAIR,
    ),
    "summary_figures": (
        edit_summary(best=[1]),
        "summary.json",
        "unreadable: `best` is a list, expected a mapping",
        SUMMARY_REPAIR,
    ),
    "config_list": (
        rewrite("config.yaml", b"- 1\n"),
        "config.yaml",
        "config file must be a YAML mapping",
        "; move the run directory away",
    ),
    "attention_damaged": (
        rewrite("attention.npz", b"PK\x03\x04 half a zip"),
        "attention.npz",
        "refused: not a complete .npz array file",
        ")",
    ),
}
LISTING_READS = ("metrics.jsonl", "summary.json", "config.yaml")


@pytest.mark.parametrize("case", DAMAGE)
def test_a_damaged_run_file_is_one_line_that_says_what_to_do_and_changes_nothing(case, run_copy, capsys):
    spoil, name, problem, repair = DAMAGE[case]
    spoil(run_copy)
    before = snapshot(run_copy)
    message = one_line_error(capsys, "train", "--resume", run_copy)
    assert message.startswith(f"error: {run_copy / name}: ") and problem in message and message.endswith(repair)
    if name != "config.yaml":  # plot needs a run directory: one with a readable config.yaml
        assert one_line_error(capsys, "plot", run_copy) == message
    assert snapshot(run_copy) == before, "refused before anything changed: not marked failed, no figure drawn"
    code = cli.main(["runs", str(run_copy.parent)])
    err = capsys.readouterr().err
    assert code == common.EXIT_OK and "Traceback" not in err
    skipped = err.startswith(f"skipped {run_copy}: {name}: ") and problem in err.splitlines()[0]
    assert skipped == (name in LISTING_READS), err


def test_a_damaged_attention_snapshot_is_named_with_what_is_wrong(run_copy):
    arrays = arrayfiles.load_arrays(run_copy / "attention.npz")
    arrayfiles.save_arrays(run_copy / "attention.npz", {**arrays, "attn_init": arrays["attn_init"][:, :, :-1]})
    with pytest.raises(runs.RunError, match=r"attention.npz: attn_init has shape \[\d+, \d+, \d+\], expected"):
        figures.read_attention(run_copy / "attention.npz")


# ---------------------------------------------------------------------------
# 5. One rule for names
# ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--resume", ""], "--resume '': the run directory's name: got ''"),
        (["--name", ""], "--name: got ''"),
        (["--name", "a\nb"], r"--name: got 'a\nb'"),
        (["--name", "tab\there"], r"--name: got 'tab\there'"),
        (["--name", "n" * 201], "at most 200 characters"),
        (["--resume", "runs/a\nb"], r"the run directory's name: got 'a\nb'"),
        (['name="a\\x1bb"'], r"name: got 'a\x1bb'"),  # YAML's escape: the control character itself is not YAML
    ],
)
def test_bad_run_names_are_refused_before_anything_is_created(tmp_path, monkeypatch, capsys, args, fragment):
    monkeypatch.chdir(tmp_path)
    message = one_line_error(capsys, "train", *SIZES, *args)
    assert fragment in message and "expected a plain directory name" in message
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name, shown", [("null", "null"), ("[a, b]", "[a, b]"), ("''", "''"), ("a/b", "'a/b'")])
def test_an_experiment_name_follows_the_same_rule(tmp_path, capsys, name, shown):
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: {name}\nbase: {REPO / 'configs/default.yaml'}\ngrid: {{model.d_k: [4]}}\nseeds: [0]\n")
    assert facts_in(
        one_line_error(capsys, "sweep", path, "--runs-dir", tmp_path / "runs"),
        f"{path}: name: got {shown}",
        "directory name",
    )
    assert not (tmp_path / "runs").exists()


def test_a_cell_whose_run_name_would_be_too_long_is_refused_before_any_run(tmp_path):
    keys = [
        "model.qk_gain",
        "model.v_gain",
        "model.o_gain",
        "model.readout_gain",
        "optim.momentum",
        "optim.lr",
        "optim.weight_decay",
        "optim.min_lr_ratio",
        "optim.clip_norm",
    ]  # each read by SGD, cosine
    path = write_grid(
        tmp_path,
        {
            **{key: [0.1234567] for key in keys},
            "optim.schedule": ["cosine"],
            "optim.warmup_steps": [1234567],
            "train.steps": [1234567],
        },
    )
    with pytest.raises(ConfigError) as info:
        experiments.load_experiment(path)
    assert facts_in(str(info.value), "run name: got 'o_gain-0.123457_qk_gain", "directory name")


# ---------------------------------------------------------------------------
# 6. Symbolic links: never written through
# ---------------------------------------------------------------------------
def test_a_symlinked_run_directory_is_refused_and_its_target_left_alone(run_copy, tmp_path, capsys):
    target = run_copy.rename(tmp_path / "outside")
    link = tmp_path / "runs" / "link"
    link.symlink_to(target)
    before = snapshot(target)
    for command in ("train --resume", "plot"):
        message = one_line_error(capsys, *command.split(), link)
        assert facts_in(message, f"{link}:", "symbolic link", "real directory")
    assert snapshot(target) == before


def test_a_sweep_cell_that_is_a_symlink_fails_without_writing_through(tmp_path):
    path = write_grid(tmp_path, {"model.d_k": [4]}, overrides={"train.steps": 2, "logging.plots": False})
    experiment = experiments.load_experiment(path, str(tmp_path / "runs"))
    (tmp_path / "elsewhere").mkdir()
    experiment.directory.mkdir(parents=True)
    (experiment.directory / experiment.cells[0].name).symlink_to(tmp_path / "elsewhere")
    outcome = sweep.run_cells([experiment.cells[0]], str(experiment.directory), str(path))[0]
    assert (outcome.action, outcome.status) == ("failed", "failed") and "is a symbolic link" in outcome.detail
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_metrics_are_never_appended_through_a_symbolic_link(tmp_path):
    (tmp_path / "victim").write_text("keep me\n")
    (tmp_path / "metrics.jsonl").symlink_to(tmp_path / "victim")
    with pytest.raises(runs.RunError, match="metrics.jsonl: cannot append"):
        runs.append_metrics(tmp_path, {"step": 0})
    with pytest.raises(runs.RunError, match="metrics.jsonl: is a symbolic link"):
        runs.read_metrics(tmp_path)
    assert (tmp_path / "victim").read_text() == "keep me\n"


# ---------------------------------------------------------------------------
# 8. Noise
# ---------------------------------------------------------------------------
def test_a_run_whose_scores_are_all_nan_warns_nothing(tmp_path, capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, err = main(capsys, "train", *TINY, "optim.lr=1e30", "train.steps=3", f"runs_dir={tmp_path}")
    assert code == common.EXIT_DIVERGED, err
    assert [str(w.message) for w in caught] == [] and "Warning" not in err


def test_long_values_are_cut_and_big_numbers_shown_short(capsys):
    message = one_line_error(capsys, "train", "optim.lr=" + "x" * 10_000)
    assert len(message) < 300 and "x" * 76 + "..." in message
    message = one_line_error(capsys, "train", "model.d_k=1.0e+15", "model.width_free=false")  # width-free: no GiB
    assert len(message) < 300 and "model.d_k=1e+15" in message and "GiB" in message
    assert facts_in(
        one_line_error(capsys, "train", "model.d_k=1.0e+308"),
        "model.d_k: got 1.0e+308",
        "an integer",
        "9,007,199,254,740,992",
    )
    assert "seed: got 'y" in one_line_error(capsys, "train", "seed=" + "y" * 5000)
    assert "an integer of 5000 digits" in one_line_error(capsys, "train", "seed=" + "9" * 5000)
    assert "optim.lr: got '1" in one_line_error(capsys, "train", "optim.lr=1" + "0" * 400 + ".0")
    assert "is not a number" in one_line_error(capsys, "train", "optim.lr=!!float abc")


@pytest.mark.parametrize(
    "text, value",
    [
        ("12:30:00", "12:30:00"),
        ("1:30", "1:30"),
        ("010", 10),
        ("0o17", 15),
        ("0x1F", 31),
        ("1_000", "1_000"),
        ("1e-3", 0.001),
        ("-2.5E+2", -250.0),
        (".inf", float("inf")),
        ("+12", 12),
        ("yes", True),
        ("~", None),
    ],
)
def test_yaml_numbers_follow_the_1_2_core_schema(text, value):
    assert parse_yaml(text, "test") == value


@pytest.mark.parametrize("text", ["1234e56", "0e12345", "1e5", "012", "0o17", "abc1234", "1.5", "yes", "", "null"])
def test_a_string_written_by_attn_reads_back_as_the_same_string(tmp_path, text):
    """PyYAML writes by YAML 1.1, where `1234e56` needs no quotes; the loader reads by 1.2, where it is a
    number: a commit id of that shape would come back from config.yaml as a float."""
    assert parse_yaml(yamlio.dump_yaml({"v": text}), "test") == {"v": text}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runs.write_config(run_dir, {}, {"attn_commit": text})
    assert runs.read_run_config(run_dir)["provenance"]["attn_commit"] == text


def test_a_sexagesimal_looking_value_is_refused_as_text(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  steps: 12:30:00\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert facts_in(str(info.value), "train.steps: got '12:30:00'", "an integer > 0")
    assert yamlio.MAX_INT_DIGITS < 4300  # Python's own cap on str(int) would otherwise raise first


def test_a_config_yaml_cut_short_is_refused_on_resume_not_filled_with_defaults(run_copy, capsys):
    """Half a config.yaml is still YAML, and its missing fields would take their defaults."""
    path = run_copy / "config.yaml"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[: next(i for i, line in enumerate(lines) if line.startswith("optim:"))]))
    before = snapshot(run_copy)
    message = one_line_error(capsys, "train", "--resume", run_copy)
    assert message.startswith(f"error: {path}: lacks `") and message.endswith("; move the run directory away")
    assert snapshot(run_copy) == before


def test_a_newline_in_a_path_or_argument_still_makes_one_line(tmp_path, capsys):
    assert (
        one_line_error(capsys, "train", tmp_path / "a\nb.yaml") == f"error: {tmp_path}/a\\nb.yaml: no such config file"
    )
    assert facts_in(one_line_error(capsys, "train", "-\n="), "attn train", "-\\n=")


def test_a_report_keeps_its_per_seed_records_apart_and_joins_them_back(tmp_path):
    report = {
        "experiment": "e",
        "cells": [{"n": 2, "seeds": [{"seed": 0, "final_loss": 0.5}, {"seed": 1}]}, {"n": 0, "seeds": []}],
        "selection": [{"x": [16], "seeds": [{"seed": 0}]}],
        "expectations": [{"id": "a"}],
    }
    runs.write_report_json(tmp_path, report)
    slim = json.loads((tmp_path / runs.REPORT_FILE).read_text())
    assert all("seeds" not in entry for key in runs.SEEDED_LISTS for entry in slim[key])
    assert slim["expectations"] == [{"id": "a"}]
    assert runs.read_report_json(tmp_path) == report
    first = (tmp_path / runs.SEEDS_FILE).read_bytes()
    runs.write_report_json(tmp_path, report)
    assert (tmp_path / runs.SEEDS_FILE).read_bytes() == first, "no timestamp: the same report, the same bytes"


def test_a_report_refuses_per_seed_records_of_another_report(tmp_path):
    runs.write_report_json(tmp_path, {"cells": [{"seeds": [{"seed": 0}]}]})
    other = tmp_path / "other"
    other.mkdir()
    runs.write_report_json(other, {"cells": [{"seeds": [{"seed": 1}]}]})
    (other / runs.SEEDS_FILE).replace(tmp_path / runs.SEEDS_FILE)
    with pytest.raises(runs.RunError, match="digest differs"):
        runs.read_report_json(tmp_path)
    (tmp_path / runs.SEEDS_FILE).unlink()
    with pytest.raises(runs.RunError, match="missing"):
        runs.read_report_json(tmp_path)


def test_a_report_written_with_its_records_inline_reads_as_it_is(tmp_path):
    report = {"cells": [{"seeds": [{"seed": 3}]}]}
    runs.write_json(tmp_path / runs.REPORT_FILE, report, indent=None)
    assert runs.read_report_json(tmp_path) == report


def test_metrics_reach_the_disk_before_each_checkpoint_and_the_final_summary_not_per_record(tmp_path, monkeypatch):
    """One fsync of metrics.jsonl per checkpoint and one at the end (12 steps, a record every 2, a
    checkpoint every 4: 3 checkpoints at steps 4, 8, 12), each before the checkpoint's own file."""
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    config = load_config(
        None, [*TINY, f"runs_dir={tmp_path}", "train.steps=12", "logging.log_every=2", "logging.checkpoint_every=4"]
    )
    run_dir = lifecycle.create(config, name="synced")
    synced.clear()
    lifecycle.execute(config, run_dir)
    assert synced.count("metrics.jsonl") == 4, synced
    for step in (4, 8, 12):
        checkpoint = next(
            i
            for i, name in enumerate(synced)
            if name.startswith(f".checkpoint-{step}.npz") or name.startswith(f"checkpoint-{step}.npz")
        )
        assert synced[checkpoint - 1] == "metrics.jsonl", synced
    assert len(runs.read_metrics(run_dir)) == 7

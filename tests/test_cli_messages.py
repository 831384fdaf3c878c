"""The command line's own messages (issue 14, items 7-9): one line each, with
the fix in it; options and overrides in any order; one set of defaults."""

import os
from pathlib import Path

import pytest
import yaml
from helpers import TINY, facts_in

from attn import cli
from attn.cli import common
from attn.config.loading import load_config
from attn.config.schema import to_dict
from attn.store import runs
from attn.train import lifecycle

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = REPO / "experiments" / "sqrt_dk.yaml"
CONFIG = REPO / "configs" / "default.yaml"


def call(capsys, *args) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(capsys, *args) -> str:
    code, out, err = call(capsys, *args)
    assert code == common.EXIT_BAD_INPUT and out == "" and err.count("\n") == 1 and err.startswith("error: "), err
    assert "Traceback" not in err
    return err.strip()


def test_the_schema_defaults_are_configs_default_yaml():
    assert load_config(None) == load_config(CONFIG)


def test_a_runs_closing_line_gives_the_tasks_reference_losses_and_when_it_first_reached_99():
    from attn.text import summary_figures

    learned = {
        "outcome_said": "learned",
        "final": {"eval_loss": 0.0012, "eval_accuracy": 1.0},
        "best": {"steps_to_99": 50},
        "references": {"chance": 2.7726, "no_retrieval": 1.7984},
    }
    assert facts_in(summary_figures(learned), "learned", "0.0012", "chance 2.77", "no retrieval 1.8", "at step 50")
    stalled = {**learned, "outcome_said": "stalled (loss at chance)", "best": {}}
    assert facts_in(summary_figures(stalled), "loss at chance", "never 99%")
    assert "chance" not in summary_figures({**learned, "references": None})  # a run without references
    odd = {**learned, "references": {"chance": float("nan"), "no_retrieval": 1.8}, "best": {"steps_to_99": "x"}}
    assert "nan" not in summary_figures(odd) and "never 99%" in summary_figures(odd)  # a damaged summary
    assert "chance" not in summary_figures({**learned, "references": [2.77]})


def test_an_experiment_file_given_to_train_says_to_sweep_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert facts_in(
        one_error_line(capsys, "train", EXPERIMENT), f"{EXPERIMENT}:", "experiment file", f"attn sweep {EXPERIMENT}"
    )
    assert not (tmp_path / "runs").exists()


def test_a_config_given_to_sweep_shows_the_grid_form(tmp_path, capsys):
    assert facts_in(
        one_error_line(capsys, "sweep", CONFIG),
        f"{CONFIG}:",
        "run config",
        f"attn sweep {CONFIG} --grid model.d_k=16,64,256 --seeds 0-4",
    )
    assert "did you mean --seeds 0-4?" in one_error_line(capsys, "sweep", CONFIG, "seeds=0-4")
    assert "did you mean --grid model.d_k=16,64?" in one_error_line(capsys, "sweep", CONFIG, "grid=model.d_k=16,64")
    assert "did you mean --seeds 3?" in one_error_line(capsys, "sweep", EXPERIMENT, "seed=3")
    assert facts_in(
        one_error_line(capsys, "sweep", EXPERIMENT, "--grid", "model.d_k=16", "--seeds", "0-1"),
        str(EXPERIMENT),
        "experiment file",
        "drop --grid, --seeds",
    )
    broken = tmp_path / "broken.yaml"
    broken.write_text("optim: {lrr: 0.1}\n")
    assert facts_in(one_error_line(capsys, "sweep", broken), "unknown key", "`optim.lrr`", "`optim.lr`")


def test_an_unknown_option_suggests_the_config_field(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert facts_in(one_error_line(capsys, "train", "--steps", "100"), "attn train", "--steps", "train.steps=100")
    assert facts_in(one_error_line(capsys, "train", "--lr=0.3"), "--lr", "optim.lr=0.3")
    assert facts_in(one_error_line(capsys, "compare", "runs", "--bogus"), "attn compare", "--bogus")
    assert facts_in(one_error_line(capsys, "sweep"), "attn sweep", "required", "FILE")
    assert not (tmp_path / "runs").exists()


def test_options_and_overrides_mix_in_any_order(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(to_dict(load_config(None, [*TINY, "train.steps=2", "logging.log_every=1"]))))
    code, out, err = call(capsys, "train", config, "--name", "x", "optim.lr=0.1", "seed=3")
    assert code == common.EXIT_OK, err
    assert out.splitlines()[-1] == str(Path("runs") / "x")
    stored = lifecycle.config_of(tmp_path / "runs" / "x")
    assert (stored.optim.lr, stored.seed) == (0.1, 3)


def test_a_runs_dir_that_is_a_file_is_named_as_one(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text("a file")
    assert facts_in(
        one_error_line(capsys, "train", *TINY, "runs_dir=README.md"), "runs_dir 'README.md'", "not a directory"
    )
    assert facts_in(
        one_error_line(capsys, "sweep", CONFIG, "--grid", "model.d_k=8", "--runs-dir", "README.md"),
        "--runs-dir 'README.md'",
        "not a directory",
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md"]


def test_an_empty_directory_is_named_once(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert facts_in(one_error_line(capsys, "compare", empty), f"{empty}:", "no run directories", "config.yaml")
    code, out, err = call(capsys, "runs", empty)
    assert (code, out, err) == (common.EXIT_OK, "", f"no runs in {empty}\n")


def test_a_mistyped_metric_is_answered_with_the_nearest_not_every_one(tmp_path, capsys):
    run = load_config(None, [*TINY, f"runs_dir={tmp_path}", "train.steps=2", "logging.log_every=1"])
    run_dir = lifecycle.create(run, name="run")
    lifecycle.execute(run, run_dir)
    line = one_error_line(capsys, "compare", run_dir, "--metric", "eval_los", "--out", tmp_path / "out")
    logged = len({k for record in runs.read_metrics(run_dir) for k in record} - {"step"})
    assert line.startswith("error: --metric: got 'eval_los'") and "`eval_loss`" in line
    assert f"({logged} are logged" in line
    named = line.split("e.g. ", 1)[1].split(" (", 1)[0].split(", ")
    assert 0 < len(named) <= 6 < logged


def test_resume_says_where_it_resumes_from(tmp_path, capsys):
    config = load_config(
        None, [*TINY, f"runs_dir={tmp_path}", "train.steps=8", "logging.log_every=2", "logging.checkpoint_every=2"]
    )
    run_dir = lifecycle.create(config, name="stopped")
    stop = lifecycle.StopFlag()
    lifecycle.execute(
        config, run_dir, stop=stop, progress=lambda step, _: stop.request("SIGINT") if step == 2 else None
    )
    code, _, err = call(capsys, "train", "--resume", run_dir)
    assert code == common.EXIT_OK, err
    assert err.splitlines()[0] == f"resuming {run_dir} from step 3/8"


@pytest.mark.parametrize("argv", [["train", "-h"], ["sweep", "-h"], ["compare", "-h"]])
def test_help_names_the_new_options(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    expected = {
        "train": ["--fork RUN_DIR[@STEP]", "train.steps=N larger than its budget"],
        "sweep": ["--grid KEY=V1,V2,...", "--seeds SEEDS", "--name NAME"],
        "compare": [
            "--where KEY=VALUE",
            "--group-by KEY",
            "--facet KEY",
            "--xlim LOW,HIGH",
            "runs of very different lengths on one x axis",
            "--include-unfinished",
        ],
    }[argv[0]]
    for fragment in expected:
        assert fragment in text, fragment


@pytest.mark.parametrize(
    "args, field",
    [
        (["sweep", CONFIG, "--grid", "model.d_k=8", "--runs-dir", ""], "--runs-dir ''"),
        (["sweep", EXPERIMENT, "--runs-dir", "{tmp}/file"], "--runs-dir '{tmp}/file'"),
        (["compare", "{tmp}", "--out", ""], "--out ''"),
        (["export", "{tmp}", "--tensorboard", ""], "--tensorboard ''"),
        (["compare", "{tmp}", "--threshold", "2"], "--threshold: got 2.0"),
        (["compare", "{tmp}", "--threshold", "٠.٥"], "attn compare: argument --threshold: got '٠.٥'"),
        (["compare", "{tmp}", "--xlim", "٠,٥"], "attn compare: argument --xlim: got '٠,٥'"),
        (["bench", "--threads", "²"], "attn bench: argument --threads: got '²'"),
        (
            ["verify", EXPERIMENT, "--variants", "float64,float64"],
            "attn verify: argument --variants: got 'float64,float64' (float64 twice)",
        ),
        (
            ["sweep", CONFIG, "--grid", "model.d_k=8", "--executor", "dask://host:99999", "--runs-dir", "{tmp}/runs"],
            "--executor: got 'dask://host:99999'",
        ),
    ],
)
def test_a_path_or_option_that_cannot_be_meant_is_refused_before_anything_is_written(
    tmp_path, monkeypatch, capsys, args, field
):
    """An empty path is not the current directory; a file is no --runs-dir; a threshold is an accuracy;
    a Dask port is a port, checked before the sweep writes its experiment file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("not a directory\n")
    message = one_error_line(capsys, *[str(a).format(tmp=tmp_path) for a in args])
    assert message.startswith(f"error: {field.format(tmp=tmp_path)}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_an_export_that_wrote_no_run_fails_naming_why(tmp_path, capsys):
    run_dir = tmp_path / "broken"
    run_dir.mkdir()
    runs.write_config(run_dir, to_dict(load_config(CONFIG)), {})
    (run_dir / "metrics.jsonl").write_text('{"step": 0}\nnot json\n{"step": 1}\n')  # a torn last line would be dropped
    message = one_error_line(capsys, "export", run_dir, "--tensorboard", tmp_path / "tb")
    assert "no run exported" in message and "metrics.jsonl" in message


@pytest.mark.parametrize(
    "override, accepted",
    [
        ("optim.qk_lr_exponent=1e308", ">= -2 and <= 2"),
        ("model.qk_gain=1e200", "<= 1000.0"),
        ("model.readout_gain=1e40", "<= 1000.0"),
    ],
)
def test_a_value_that_would_overflow_the_first_step_is_bad_input_not_a_failed_run(tmp_path, capsys, override, accepted):
    """d_k ** 1e308 overflowed building the optimiser (a traceback, a run directory left stale); a gain of 1e200
    overflowed float32 at init (numpy's warnings, then 'diverged at step 0')."""
    message = one_error_line(capsys, "train", "train.steps=5", f"runs_dir={tmp_path}", override)
    assert override.split("=")[0] in message and accepted in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args, says",
    [
        (["config", EXPERIMENT], "is an experiment file"),
        (["report", CONFIG], "is a run config, not an experiment file"),
        (["verify", CONFIG], "is a run config, not an experiment file"),
        (["sweep", CONFIG, "--grid", "runs_dir=a"], "not a config field that a grid can vary"),
    ],
)
def test_a_file_or_key_of_the_wrong_kind_is_named_as_such(capsys, args, says):
    message = one_error_line(capsys, *args)
    assert says in message and "did you mean `runs_dir`" not in message  # no hint that repeats the key


def test_a_fork_step_that_is_no_step_is_named_as_the_step(tmp_path, capsys):
    assert call(capsys, "train", *TINY, "train.steps=2", f"runs_dir={tmp_path}", "name=source")[0] == 0
    for step in ("-1", "abc"):
        message = one_error_line(capsys, "train", "--fork", f"{tmp_path / 'source'}@{step}")
        assert f"STEP: got '{step}'" in message


def test_plot_checks_every_run_before_drawing_any(tmp_path, capsys):
    assert call(capsys, "train", *TINY, "train.steps=2", f"runs_dir={tmp_path}", "name=good")[0] == 0
    good = tmp_path / "good"
    before = {p.name: p.stat().st_mtime_ns for p in good.glob("*.png")}
    assert "not a run directory" in one_error_line(capsys, "plot", good, tmp_path / "missing")
    assert {p.name: p.stat().st_mtime_ns for p in good.glob("*.png")} == before, "the good run's figures not redrawn"


@pytest.mark.parametrize("address", ["dask://host:²", "dask://host:８７８６", "dask://::1:8786", "dask://host:0"])
def test_a_dask_address_that_is_no_host_and_port_is_refused_before_anything_is_written(tmp_path, capsys, address):
    message = one_error_line(
        capsys, "sweep", CONFIG, "--grid", "model.d_k=8", "--executor", address, "--runs-dir", tmp_path / "runs"
    )
    assert f"--executor: got {address!r}" in message and not (tmp_path / "runs").exists()


def test_the_well_formed_dask_addresses_pass_the_form_check():
    from attn.experiment.sweep import check_address

    for address in ("dask://host:8786", "dask://10.0.0.1:8786", "dask://[::1]:8786"):
        check_address(address)


@pytest.mark.parametrize("args", [["sweep", CONFIG, "--grid", "logging=1"], ["sweep", CONFIG, "--grid", "model=1"]])
def test_a_section_where_a_key_is_wanted_gets_no_unrelated_hint(capsys, args):
    assert "did you mean" not in one_error_line(capsys, *args)


@pytest.mark.parametrize(
    "args, flag",
    [
        (["compare", "{tmp}", "--smooth", "abc"], "--smooth: got 'abc'"),
        (["compare", "{tmp}", "--threshold", "nan"], "--threshold: got nan"),
        (["bench", "--board-megabytes", "inf"], "--board-megabytes: got 'inf'"),
    ],
)
def test_a_number_flag_that_reads_as_no_accepted_number_says_what_is_accepted(tmp_path, capsys, args, flag):
    message = one_error_line(capsys, *[a.format(tmp=tmp_path) for a in args])
    assert flag in message and "expected" in message  # the range: compare.check_options, once a number


@pytest.mark.parametrize(
    "args, facts",
    [
        (["--out", "{file}"], ["--out", "{file}", "expected a directory"]),
        (["--out", "{file}/bench"], ["--out", "{file}/bench", "expected a directory"]),
        (["--board", "--devices"], ["--board", "--devices", "expected one of them"]),
        (["--board-code", "{tmp}"], ["--board-code", "expected it with --board"]),
        (["--board", "--board-code", "{tmp}/nowhere"], ["--board-code", "{tmp}/nowhere", "a checkout of attn"]),
        (["--only", "foo=1"], ["--only", "foo=1"]),  # the one line, with no notice of missing rivals before it
    ],
)
def test_bench_refuses_its_arguments_before_it_measures_anything(tmp_path, capsys, monkeypatch, args, facts):
    from attn.bench import suite
    from attn.board import bench as board_bench

    def measured(*_args, **_kwargs):
        raise AssertionError("measured before its arguments were checked")

    monkeypatch.setattr(suite, "run_suite", measured)
    monkeypatch.setattr(board_bench, "measure_board", measured)
    (tmp_path / "file").write_text("")
    names = {"tmp": tmp_path, "file": tmp_path / "file"}
    message = one_error_line(capsys, "bench", "--out", tmp_path / "out", *[a.format(**names) for a in args])
    assert facts_in(message, *(fact.format(**names) for fact in facts))


@pytest.mark.parametrize("override", ["name=x", "runs_dir=elsewhere", "model.scale=none"])
def test_the_demo_refuses_an_override_of_what_it_sets_itself_before_anything_is_written(
    tmp_path, capsys, monkeypatch, override
):
    monkeypatch.chdir(REPO)  # the demo reads its configs from the repository root
    message = one_error_line(capsys, "demo", override, "--runs-dir", tmp_path / "demo")
    assert facts_in(message, "demo", repr(override), "expected") and not (tmp_path / "demo").exists()


def test_a_second_stop_while_figures_are_drawn_says_they_were_not_and_exits_as_stopped(tmp_path, capsys, monkeypatch):
    """The run completed; the second Ctrl-C came while its figures were drawn: not exit 0 with no figures."""

    def interrupted(run_dir, summary):
        raise KeyboardInterrupt

    monkeypatch.setattr(lifecycle, "draw_figures", interrupted)
    code, out, err = call(
        capsys,
        "train",
        *[o for o in TINY if o != "logging.plots=false"],
        "train.steps=2",
        f"runs_dir={tmp_path}",
        "name=r",
    )
    assert code == 130 and "\ncompleted: step 2/2" in err and f"attn plot {tmp_path / 'r'} draws them" in err
    assert out.strip() == str(tmp_path / "r")


def test_a_ctrl_c_while_the_command_line_loads_stops_it_by_the_signal_without_a_traceback(tmp_path):
    """KeyboardInterrupt raised where attn.cli's imports reach numpy (as a Ctrl-C
    while it loads would), through the console script's entry point."""
    import signal
    import subprocess
    import sys

    interrupt_mid_import = (
        "import builtins, sys\n"
        "load = builtins.__import__\n"
        "def interrupted(name, *args, **kwargs):\n"
        "    if name == 'numpy':\n"
        "        raise KeyboardInterrupt\n"
        "    return load(name, *args, **kwargs)\n"
        "builtins.__import__ = interrupted\n"
        "from attn.__main__ import entry\n"
        "sys.exit(entry())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", interrupt_mid_import, "runs"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.returncode == -signal.SIGINT  # a shell shows 128 + 2 = 130, as for a Ctrl-C during a command
    assert done.stderr == ""

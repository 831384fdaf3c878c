"""attn compare's choices (issue 14): unfinished runs drawn but left out of the
statistics, duplicate seeds warned about, --where, --group-by, --facet,
--xlim, the legend's n and its place below the panels.

The run directories here are written by hand (config.yaml, metrics.jsonl,
summary.json through attn.store.runs), with made-up curves: no training.
"""

import csv
import math
from pathlib import Path

import numpy as np
import pytest
from helpers import facts_in
from matplotlib.backends.backend_agg import FigureCanvasAgg

from attn import cli
from attn.analysis import curves, grouping
from attn.cli import common
from attn.config.loading import load_config
from attn.config.schema import to_dict
from attn.config.yamlio import ArgumentError
from attn.report import compare, compare_figure
from attn.store import runs


def make_run(
    directory: Path, *overrides: str, steps: int = 20, status: str = "completed", level: float = 1.0, loss=None
) -> Path:
    """A run directory whose eval loss is loss(step), by default falling from
    `level`, logged every 5 steps up to `steps`."""
    config = load_config(None, ["logging.plots=false", *overrides])
    directory.mkdir(parents=True)
    runs.write_config(directory, to_dict(config), {})
    for step in range(0, steps + 1, 5):
        runs.append_metrics(
            directory,
            {
                "step": step,
                "eval_loss": (loss or (lambda s: level / (1 + s)))(step),
                "eval_accuracy": step / 100,
                "wall_time": step / 10,
            },
        )
    runs.write_json(directory / "summary.json", {"status": status, "step": steps})
    return directory


def call(capsys, *args) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def loaded(path: Path) -> list[grouping.Run]:
    return grouping.load_runs(grouping.find_run_dirs([path])[0])[0]


def rows_by_group(out_dir: Path) -> dict[str, dict]:
    return {row["group"]: row for row in csv.DictReader((out_dir / "table.csv").open())}


def test_unfinished_runs_are_drawn_but_left_out_of_the_statistics_unless_asked(tmp_path, capsys):
    for seed, level in ((0, 1.0), (1, 3.0)):
        make_run(tmp_path / "exp" / f"done-{seed}", f"seed={seed}", level=level)
    make_run(tmp_path / "exp" / "stopped", "seed=2", steps=10, status="interrupted", level=100.0)
    code, out, _ = call(capsys, "compare", tmp_path / "exp", "--out", tmp_path / "a")
    assert code == 0
    row = rows_by_group(tmp_path / "a")["task.name=retrieval, scale=sqrt, d_k=32"]
    finished = [1.0 / 21, 3.0 / 21]  # the two finished runs' final eval losses
    assert (row["n_runs"], row["n_left_out"], row["final_eval_loss_n"]) == ("3", "1", "2")
    assert float(row["final_eval_loss_mean"]) == pytest.approx(np.mean(finished))
    assert "| 3 (1 left out) | completed 2, interrupted 1 |" in out
    assert "Left out of the statistics: 1 run that did not finish" in out
    code, out, _ = call(capsys, "compare", tmp_path / "exp", "--out", tmp_path / "b", "--include-unfinished")
    row = rows_by_group(tmp_path / "b")["task.name=retrieval, scale=sqrt, d_k=32"]
    assert (row["n_left_out"], row["final_eval_loss_n"]) == ("0", "3")
    assert float(row["final_eval_loss_mean"]) == pytest.approx(np.mean([*finished, 100.0 / 11]))
    assert "Runs that did not finish are counted (--include-unfinished)" in out


def test_a_seed_made_twice_in_a_group_is_named_in_one_warning_line(tmp_path, capsys):
    twice = [make_run(tmp_path / "exp" / name, "seed=0") for name in ("a", "a-2")]
    make_run(tmp_path / "exp" / "b", "seed=1")
    make_run(tmp_path / "exp" / "other-lr", "seed=0", "optim.lr=0.1")  # seed 0 again, but another setting
    code, _, err = call(capsys, "compare", tmp_path / "exp", "--out", tmp_path / "out")
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert code == 0 and len(warnings) == 1
    assert facts_in(warnings[0], "group lr=0.5", "seed 0", "2 times", str(twice[0]), str(twice[1]))
    pooled = grouping.group_runs(loaded(tmp_path / "exp"), by=["task.name"])
    assert ["warning: " + line for line in grouping.duplicate_seeds(pooled)] == [  # pooled: only the true twins
        warnings[0].replace("group lr=0.5", "group task.name=retrieval")
    ]


def test_where_keeps_the_runs_with_that_value_typed_as_an_override(tmp_path, capsys):
    for lr in (0.1, 0.3):
        for seed in (0, 1):
            make_run(tmp_path / "exp" / f"lr{lr}-s{seed}", f"optim.lr={lr}", f"seed={seed}")
    make_run(tmp_path / "exp" / "copy", "task.name=copy", "optim.lr=0.1")
    code, _, _ = call(
        capsys,
        "compare",
        tmp_path / "exp",
        "--where",
        "optim.lr=1e-1",
        "--where",
        "task.name=retrieval",
        "--out",
        tmp_path / "out",
    )
    assert code == 0
    (row,) = rows_by_group(tmp_path / "out").values()
    assert (row["n_runs"], row["seeds"]) == ("2", "0 1")
    only_copy_reads_it = grouping.parse_where(["task.length=8"])
    assert [run.path.name for run in loaded(tmp_path / "exp") if grouping.matches(run, only_copy_reads_it)] == ["copy"]
    for where, facts in (
        ("optim.lr=0.2", ["--where optim.lr=0.2:", "no run matches", "optim.lr is 0.1, 0.3"]),
        ("optim.lrr=0.1", ["--where", "optim.lrr=0.1", "`optim.lrr`", "`optim.lr`"]),
        ("model.d_k=wide", ["--where", "model.d_k=wide", "model.d_k: got 'wide'", "an integer"]),
    ):
        code, _, err = call(capsys, "compare", tmp_path / "exp", "--where", where)
        assert code == common.EXIT_BAD_INPUT and err.count("\n") == 1, err
        assert all(fact in err for fact in facts), err


def test_group_by_pools_every_other_setting_and_the_title_says_so(tmp_path, capsys):
    for scale in ("sqrt", "none"):
        for lr in (0.1, 0.3):
            make_run(tmp_path / "exp" / f"{scale}-{lr}", f"model.scale={scale}", f"optim.lr={lr}")
    made = loaded(tmp_path / "exp")
    groups = grouping.group_runs(made, by=["model.scale"])
    assert [(g.label, sorted(r.path.name for r in g.runs)) for g in groups] == [
        ("scale=none", ["none-0.1", "none-0.3"]),
        ("scale=sqrt", ["sqrt-0.1", "sqrt-0.3"]),
    ]
    title = compare.comparison_title([r.path for r in made], made, groups, [], ["model.scale"], None)
    assert title.startswith("exp: ") and facts_in(title, "4 runs in 2 groups", "grouped by scale only", "pooled")
    assert facts_in(title, "mean", "std")
    with pytest.raises(ArgumentError) as info:  # named by compare's argument; the CLI names it by its flag
        compare.compare([tmp_path / "exp"], group_by=["model.scal"])
    assert info.value.argument == "group_by" and "'model.scal'" in info.value.problem
    assert "`model.scale`" in info.value.problem
    code, _, err = call(capsys, "compare", tmp_path / "exp", "--group-by", "model.scal")
    assert code == common.EXIT_BAD_INPUT and err.startswith("error: --group-by: got 'model.scal'"), err


def test_facet_draws_a_row_of_panels_per_value_and_keeps_its_key_out_of_the_labels(tmp_path):
    for d_k in (16, 64):
        for scale in ("sqrt", "none"):
            make_run(tmp_path / "exp" / f"{d_k}-{scale}", f"model.d_k={d_k}", f"model.scale={scale}")
    groups = grouping.group_runs(loaded(tmp_path / "exp"), facet="model.d_k")
    assert [(g.label, g.facet) for g in groups] == [
        ("scale=none", "d_k=16"),
        ("scale=sqrt", "d_k=16"),
        ("scale=none", "d_k=64"),
        ("scale=sqrt", "d_k=64"),
    ]
    fig = compare_figure.draw_comparison(groups, ["eval_loss", "eval_accuracy"], facet="model.d_k")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == [f"{metric}  —  d_k={d_k}" for d_k in (16, 64) for metric in ("eval_loss", "eval_accuracy")]
    colours = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            colours.setdefault(line.get_label(), set()).add(line.get_color())
    assert all(len(c) == 1 for text, c in colours.items() if text.startswith("scale="))  # one colour per label
    rows = compare.group_rows(groups, 0.99)
    assert [row.label for row in rows] == [
        "scale=none, d_k=16",
        "scale=sqrt, d_k=16",
        "scale=none, d_k=64",
        "scale=sqrt, d_k=64",
    ]  # the table tells the facets apart


def test_xlim_fixes_every_panel_and_the_legend_counts_the_runs_at_its_last_step(tmp_path):
    make_run(tmp_path / "exp" / "short", "seed=0", steps=10)
    make_run(tmp_path / "exp" / "long", "seed=1", steps=100, loss=lambda s: 1 / (1 + s) if s <= 10 else 1e6)
    groups = grouping.group_runs(loaded(tmp_path / "exp"))
    whole = compare_figure.draw_comparison(groups, ["eval_loss"])
    assert any("(n=1 of 2 at the last step)" in text.get_text() for text in whole.legends[0].get_texts())
    cut = compare_figure.draw_comparison(groups, ["eval_loss"], xlim=(0, 10))
    (ax,) = cut.axes
    assert ax.get_xlim() == (0, 10)
    assert any("(n=2)" in text.get_text() for text in cut.legends[0].get_texts())  # both runs reach step 10
    _, band = curves.group_curve(groups[0], "eval_loss")
    assert ax.get_ylim()[1] < 10 * band.high[band.steps <= 10].max() < band.high.max()  # the y range follows the cut


def test_a_long_legend_stays_on_the_figure_below_the_panels(tmp_path):
    groups = [
        grouping.Group(
            f"lr_mult={{W_q: {w}, W_k: {w}, W_v: {w}, W_o: {w}}}, qk_lr_exponent=-0.5, scale=none",
            {"optim.lr": w},
            [
                grouping.Run(
                    Path(f"r{w}"),
                    {"seed": 0},
                    [{"step": s, "eval_loss": w / (1 + s), "eval_accuracy": 0.5} for s in range(5)],
                    {},
                    "completed",
                )
            ],
        )
        for w in np.linspace(0.1, 2.4, 24)
    ]
    for metrics in (["eval_loss"], ["eval_loss", "eval_accuracy"]):
        fig = compare_figure.draw_comparison(groups, metrics)
        FigureCanvasAgg(fig).draw()
        renderer = fig.canvas.get_renderer()
        (legend,) = fig.legends
        box, page = legend.get_window_extent(renderer), fig.bbox
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1
        assert all(box.y1 <= ax.get_tightbbox(renderer).y0 for ax in fig.axes)  # below the panels
        assert len(legend.get_texts()) == len(groups)


def test_the_legend_wraps_a_label_longer_than_the_figure():
    texts, columns, lines = compare_figure.legend_layout(["x" * 400, "short"], width=5.6)
    assert columns == 1 and all(
        max(map(len, t.split("\n"))) * compare_figure.CHAR_INCHES + compare_figure.HANDLE_INCHES <= 5.6 for t in texts
    )
    assert lines == math.ceil(400 / max(map(len, texts[0].split("\n")))) + 1


def test_all_y_makes_compare_png_hold_every_finite_value(tmp_path, capsys, monkeypatch):
    exploding = {0: 3.0, 5: 40.0, 10: 7e5, 15: 4e20, 20: math.nan}  # an unscaled run that diverged
    make_run(tmp_path / "exp" / "steady", "model.scale=sqrt")
    make_run(tmp_path / "exp" / "exploded", "model.scale=none", status="diverged", loss=exploding.get)
    drawn = []
    original = compare.draw_comparison

    def keep(*args, **kwargs):
        fig = original(*args, **kwargs)
        drawn.append(fig.axes[0].get_ylim())  # the eval_loss panel's y range
        return fig

    monkeypatch.setattr(compare, "draw_comparison", keep)
    assert call(capsys, "compare", tmp_path / "exp", "--metric", "eval_loss", "--out", tmp_path / "bulk")[0] == 0
    assert (
        call(capsys, "compare", tmp_path / "exp", "--metric", "eval_loss", "--all-y", "--out", tmp_path / "all")[0] == 0
    )
    (bulk_low, bulk_high), (all_low, all_high) = drawn
    assert bulk_high < 4e20 <= all_high  # by default the diverged tail is off the axis; with --all-y it is on it
    assert all_low <= 1.0 / 21  # the steady run's smallest loss still shown
    assert (tmp_path / "all" / "compare.png").is_file()

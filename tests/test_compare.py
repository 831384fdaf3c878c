"""attn.report.compare: grouping by config minus seed, band statistics against numpy,
labels, smoothing, diverged/partial/torn/running runs, the files written, and
the `compare` and `runs` commands.

Real runs (2 scales x 2 seeds, 20 steps) are trained once for the module;
the odd cases are copies of them edited by hand.
"""

import csv
import dataclasses
import json
import os
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import facts_in

from attn import cli, text
from attn.analysis import curves, grouping, listing
from attn.config.loading import build_task, load_config, parse_override
from attn.config.schema import TaskConfig, read_only_by, to_dict
from attn.config.yamlio import ConfigError
from attn.report import compare, compare_figure
from attn.store import locks, runs
from attn.train import figures, lifecycle

SCALES = ("sqrt", "none")
SEEDS = (0, 1)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A runs root holding one experiment, exp/, of real runs named <scale>-s<seed>."""
    root = tmp_path_factory.mktemp("runs")
    for scale, seed in ((scale, seed) for scale in SCALES for seed in SEEDS):
        overrides = [
            "train.steps=20",
            "logging.log_every=5",
            "logging.plots=false",
            "logging.attention_examples=0",
            "task.eval_size=128",
            f"runs_dir={root / 'exp'}",
            f"model.scale={scale}",
            f"seed={seed}",
        ]
        config = load_config(None, overrides)
        lifecycle.execute(config, lifecycle.create(config, None, overrides, name=f"{scale}-s{seed}"))
    return root


def loaded_groups(*paths):
    run_dirs, _ = grouping.find_run_dirs(paths)
    loaded, skipped = grouping.load_runs(run_dirs)
    return grouping.group_runs(loaded), skipped


def config_run(directory: str, *overrides: str) -> grouping.Run:
    """A run (without records) whose settings are a config's as a run directory
    holds it: every field present, the overrides set as they are (a run made
    before unread fields were refused may hold another task's field set)."""
    settings = lifecycle.flatten_config(to_dict(load_config(None)))
    settings.update(parse_override(text) for text in overrides)
    return grouping.Run(Path(directory), settings, [], {}, "completed")


def fake_run(directory: str, **changes) -> grouping.Run:
    settings = {
        "name": None,
        "seed": 0,
        "runs_dir": "runs",
        "model.d_k": 32,
        "model.scale": "sqrt",
        "optim.lr": 0.5,
        "task.name": "retrieval",
    }
    settings.update({key.replace("__", "."): value for key, value in changes.items()})
    return grouping.Run(Path(directory), settings, [], {}, "completed")


# ---------------------------------------------------------------------------
# Grouping and labels
# ---------------------------------------------------------------------------
def test_real_runs_group_by_config_minus_seed(root):
    groups, skipped = loaded_groups(root / "exp")
    assert skipped == []
    assert [g.label for g in groups] == ["scale=none", "scale=sqrt"]
    for group in groups:
        assert [r.settings["seed"] for r in group.runs] == list(SEEDS)
        assert {r.settings["model.scale"] for r in group.runs} == {group.settings["model.scale"]}
        assert {r.path.name for r in group.runs} == {f"{group.settings['model.scale']}-s{s}" for s in SEEDS}


def test_only_seed_and_bookkeeping_keys_are_ignored_when_grouping():
    same = [
        fake_run("a", seed=0, name="a", runs_dir="x", logging__plots=False),
        fake_run("b", seed=1, name="b", runs_dir="y", logging__plots=True),
    ]
    other = fake_run("c", optim__lr=0.1)
    groups = grouping.group_runs(same + [other])
    assert [(g.label, [r.path.name for r in g.runs]) for g in groups] == [("lr=0.1", ["c"]), ("lr=0.5", ["a", "b"])]


def test_labels_name_the_differing_keys_in_config_order_and_sort_by_value():
    grid = [
        fake_run(f"r{d_k}{scale}", model__d_k=d_k, model__scale=scale)
        for d_k in (256, 64)
        for scale in ("sqrt", "none")
    ]
    assert [g.label for g in grouping.group_runs(grid)] == [
        "d_k=64, scale=none",
        "d_k=64, scale=sqrt",
        "d_k=256, scale=none",
        "d_k=256, scale=sqrt",
    ]
    assert [g.label for g in grouping.group_runs([fake_run("a"), fake_run("b", seed=3)])] == [
        "task.name=retrieval, scale=sqrt, d_k=32"
    ]  # one group: what it is; `name` alone would be ambiguous


def test_two_differing_keys_are_drawn_as_colour_and_dash():
    groups = grouping.group_runs(
        [
            fake_run(f"r{d_k}{scale}", model__d_k=d_k, model__scale=scale)
            for d_k in (16, 64, 256)
            for scale in ("sqrt", "none")
        ]
    )
    styles = compare_figure.group_styles(groups)
    colour = {g.settings["model.d_k"]: set() for g in groups}
    dash = {g.settings["model.scale"]: set() for g in groups}
    for group, style in zip(groups, styles):
        colour[group.settings["model.d_k"]].add(style["color"])
        dash[group.settings["model.scale"]].add(style["linestyle"])
    assert all(len(c) == 1 for c in colour.values()) and len(set().union(*colour.values())) == 3
    assert all(len(d) == 1 for d in dash.values()) and len(set().union(*dash.values())) == 2


def test_short_names_are_the_shortest_unambiguous_suffix():
    assert grouping.short_names(["model.d_k", "model.scale"]) == {"model.d_k": "d_k", "model.scale": "scale"}
    assert grouping.short_names(["model.lr", "optim.lr", "optim.eps"]) == {
        "model.lr": "model.lr",
        "optim.lr": "optim.lr",
        "optim.eps": "eps",
    }
    assert grouping.short_names(["a.b.c", "d.b.c"]) == {"a.b.c": "a.b.c", "d.b.c": "d.b.c"}
    assert grouping.short_names(["task.name"], among=["name", "task.name"]) == {"task.name": "task.name"}


def test_task_fields_the_task_does_not_read_neither_group_nor_label():
    loaded = [
        config_run(
            f"{task}-{scale}-s{seed}",
            f"task.name={task}",
            f"model.scale={scale}",
            f"seed={seed}",
            "task.length=12" if task == "copy" else "task.n_pairs=6",
        )
        for task in ("retrieval", "copy")
        for scale in ("sqrt", "none")
        for seed in (0, 1)
    ]
    loaded.append(
        config_run(
            "retrieval-odd-length",
            "task.name=retrieval",
            "model.scale=sqrt",
            "task.n_pairs=6",
            "task.length=5",
            "task.mode=shift",
            "seed=2",
        )
    )  # copy's fields: no new setting
    groups = grouping.group_runs(loaded)
    assert [(g.label, len(g.runs)) for g in groups] == [
        ("scale=none, task.name=copy", 2),
        ("scale=none, task.name=retrieval", 2),
        ("scale=sqrt, task.name=copy", 2),
        ("scale=sqrt, task.name=retrieval", 3),
    ]
    rows = compare.group_rows(groups, 0.99)
    assert [row.settings for row in rows] == [
        {"model.scale": s, "task.name": t} for s in ("none", "sqrt") for t in ("copy", "retrieval")
    ]
    modes = [
        config_run(f"copy-{mode}-{shift}", "task.name=copy", f"task.mode={mode}", f"task.shift={shift}")
        for mode, shift in (("reverse", 1), ("reverse", 2), ("shift", 1), ("shift", 3))
    ]
    assert [g.label for g in grouping.group_runs(modes)] == [
        "mode=reverse",
        "mode=shift, shift=1",
        "mode=shift, shift=3",
    ]
    listing_keys = grouping.varying_keys([run.settings for run in loaded])
    assert "task.length" not in listing_keys and "task.n_pairs" not in listing_keys  # each read by one task only


@pytest.mark.parametrize("task", ["task.name=retrieval", "task.name=copy", "task.name=copy task.mode=shift"])
def test_unused_task_keys_are_exactly_those_the_task_ignores(task):
    """Changing a key unused_task_keys names leaves the task's batches unchanged; changing any other task key
    read by one task only changes them."""
    base = task.split()
    settings = config_run("base", *base).settings
    unused = grouping.unused_task_keys(settings)
    choices = {f"task.{f.name}": f.metadata["choices"] for f in dataclasses.fields(TaskConfig)}
    only_some = {key for key in read_only_by() if key.startswith("task.")}
    assert only_some - unused and only_some & unused

    def batch(*overrides):
        sample = build_task(load_config(None, [*base, *overrides])).sample(np.random.default_rng(0), 4)
        return [getattr(sample, f.name) for f in dataclasses.fields(sample)]

    reference = batch()
    for key in sorted(only_some):
        changed = next(c for c in choices[key] if c != settings[key]) if choices[key] else settings[key] + 1
        if key in unused:  # the task would not read it: setting it is refused, naming who reads it
            with pytest.raises(ConfigError, match=f"{key}: got .*; read only with task"):
                batch(f"{key}={changed}")
            continue
        assert any(a.shape != b.shape or (a != b).any() for a, b in zip(reference, batch(f"{key}={changed}"))), key


def test_values_are_written_as_yaml_would():
    shown = [text.format_value(v) for v in (None, True, 1e-3, 0.5, 256, "none", {"W_q": 0.1})]
    assert shown == ["null", "true", "0.001", "0.5", "256", "none", "{W_q: 0.1}"]


# ---------------------------------------------------------------------------
# Band statistics and smoothing
# ---------------------------------------------------------------------------
def test_band_statistics_match_numpy_on_the_union_of_steps():
    rng = np.random.default_rng(7)
    run_curves = [
        (np.arange(0, 35, 5), rng.random(7)),
        (np.arange(0, 20, 5), rng.random(4)),  # stopped early
        (np.array([0, 2, 5, 30]), np.array([0.3, np.nan, 0.1, 0.9])),
    ]  # off-grid steps, a NaN
    band = curves.band_stats(run_curves)
    union = sorted(set().union(*(s.tolist() for s, _ in run_curves)))
    matrix = np.full((len(run_curves), len(union)), np.nan)
    for row, (steps, values) in enumerate(run_curves):
        matrix[row, [union.index(s) for s in steps]] = values
    logged = ~np.isnan(matrix).all(axis=0)  # step 2 holds only a NaN: left out
    matrix = matrix[:, logged]
    assert band.steps.tolist() == [s for s, kept in zip(union, logged) if kept] and not logged.all()
    np.testing.assert_array_equal(band.count, (~np.isnan(matrix)).sum(axis=0))
    np.testing.assert_allclose(band.mean, np.nanmean(matrix, axis=0), rtol=1e-12)
    many = band.count >= 2
    assert many.any() and (~many).any()
    np.testing.assert_allclose(band.std[many], np.nanstd(matrix[:, many], axis=0, ddof=1), rtol=1e-12)
    assert np.isnan(band.std[~many]).all()
    np.testing.assert_array_equal(band.low, np.nanmin(matrix, axis=0))
    np.testing.assert_array_equal(band.high, np.nanmax(matrix, axis=0))


def test_drawn_band_stays_within_the_runs_values():
    skewed = curves.band_stats(
        [
            (np.array([0, 1]), np.array([1.0, 0.5])),
            (np.array([0, 1]), np.array([0.01, 0.4])),
            (np.array([0, 1]), np.array([0.02, 0.45])),
        ]
    )
    lower, upper = skewed.edges()
    assert skewed.mean[0] - skewed.std[0] < 0 and lower[0] == 0.01  # clipped to the lowest run: a log axis can draw it
    assert upper[0] == pytest.approx(skewed.mean[0] + skewed.std[0]) and upper[0] < skewed.high[0]
    np.testing.assert_allclose([lower[1], upper[1]], [skewed.mean[1] - skewed.std[1], skewed.mean[1] + skewed.std[1]])


def test_group_curves_of_real_runs_are_the_seed_mean_and_std(root):
    groups, _ = loaded_groups(root / "exp")
    for group in groups:
        steps = [r["step"] for r in group.runs[0].records]
        losses = np.array([[r["eval_loss"] for r in run.records] for run in group.runs])  # (seeds, steps)
        xs, band = curves.group_curve(group, "eval_loss")
        np.testing.assert_array_equal(xs, steps)
        np.testing.assert_allclose(band.mean, losses.mean(axis=0), rtol=1e-12)
        np.testing.assert_allclose(band.std, losses.std(axis=0, ddof=1), rtol=1e-12)
        clocks = np.array([[r["wall_time"] for r in run.records] for run in group.runs])
        xs, _ = curves.group_curve(group, "eval_loss", x="wall_time")
        np.testing.assert_allclose(xs, clocks.mean(axis=0), rtol=1e-12)


def test_smoothing_is_the_bias_corrected_moving_average():
    values = np.random.default_rng(3).normal(size=40)
    beta = 0.8
    direct = [
        sum(beta ** (t - i) * values[i] for i in range(t + 1)) / sum(beta ** (t - i) for i in range(t + 1))
        for t in range(len(values))
    ]
    np.testing.assert_allclose(curves.ema(values, beta), direct, rtol=1e-12)
    np.testing.assert_allclose(curves.ema(np.full(10, 3.0), 0.95), 3.0, rtol=1e-12)  # no pull toward 0
    np.testing.assert_array_equal(curves.ema(values, 0.0), values)


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------
def test_table_rows_are_computed_from_the_metrics(root):
    groups, _ = loaded_groups(root / "exp")
    accuracies = [r["eval_accuracy"] for g in groups for run in g.runs for r in run.records]
    threshold = float(np.median(accuracies))  # some runs reach it, some steps do not
    rows = compare.group_rows(groups, threshold)
    for group, row in zip(groups, rows):
        assert row.label == group.label and row.statuses == {"completed": len(SEEDS)}
        finals = np.array([run.records[-1]["eval_loss"] for run in group.runs])
        assert row.stats["final_eval_loss"].mean == pytest.approx(finals.mean(), rel=1e-12)
        assert row.stats["final_eval_loss"].std == pytest.approx(finals.std(ddof=1), rel=1e-12)
        bests = [min(r["eval_loss"] for r in run.records) for run in group.runs]
        assert row.stats["best_eval_loss"].mean == pytest.approx(np.mean(bests), rel=1e-12)
        reached = [
            next((r["step"] for r in run.records if r["eval_accuracy"] >= threshold), None) for run in group.runs
        ]
        stat = row.stats["steps_to_threshold"]
        assert stat.n == sum(s is not None for s in reached) and stat.total == len(SEEDS)
        if stat.n:
            assert stat.mean == pytest.approx(np.mean([s for s in reached if s is not None]))
    never = compare.group_rows(groups, 1.5)
    assert [compare.format_steps(r.stats["steps_to_threshold"]) for r in never] == [
        f"never ({len(SEEDS)}/{len(SEEDS)})"
    ] * 2


def test_final_figures_are_the_last_record_and_none_after_a_divergence():
    def final(*records):
        return grouping.final_figures(grouping.Run(Path("r"), {}, list(records), {}, "completed"))

    finite = {"step": 10, "eval_loss": 0.25, "eval_accuracy": 0.875}
    assert final({"step": 0, "eval_loss": 2.0, "eval_accuracy": 0.0}, finite) == (0.25, 0.875)
    for loss in (float("nan"), float("inf"), None):  # NaN as a number or as null: the accuracy there is no result
        assert final(finite, {**finite, "step": 20, "eval_loss": loss}) == (None, None)
    assert final() == (None, None)
    assert final({"step": 0, "eval_loss": 0.5, "eval_accuracy": None}) == (0.5, None)


def test_stat_formatting_says_how_many_runs_have_a_value():
    assert compare.format_stat(compare.describe([1.0, 3.0, None]), ".3g") == "2 ± 1.4 (2/3)"
    assert compare.format_stat(compare.describe([0.5]), ".3f") == "0.500"
    assert compare.format_stat(compare.describe([None, float("nan")]), ".3f") == "—"
    assert compare.format_steps(compare.describe([100, 300, None])) == "200 ± 141; never 1/3"


# ---------------------------------------------------------------------------
# Diverged, torn, running, stale and unreadable runs
# ---------------------------------------------------------------------------
def write_metrics(run_dir: Path, records: list, tail: str = "") -> None:
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def edit_summary(run_dir: Path, **fields) -> None:
    summary = runs.read_summary(run_dir)
    summary.update(fields)
    runs.write_json(run_dir / "summary.json", summary)


@pytest.fixture
def zoo(root, tmp_path) -> Path:
    """Copies of the real runs, each broken or unfinished in its own way."""
    zoo = tmp_path / "zoo"
    exp = root / "exp"
    for name, source in (
        ("diverged", "none-s0"),
        ("stale", "none-s1"),
        ("torn", "sqrt-s0"),
        ("running", "sqrt-s1"),
        ("no_metrics", "sqrt-s0"),
        ("bad_config", "sqrt-s1"),
        ("bad_line", "none-s0"),
    ):
        shutil.copytree(exp / source, zoo / name)
    records = runs.read_metrics(exp / "none-s0")
    write_metrics(zoo / "diverged", records[:3] + [{**records[3], "eval_loss": None, "train_loss": None}])
    edit_summary(zoo / "diverged", status="diverged", reason="non-finite loss at step 15")
    edit_summary(
        zoo / "stale", status="running", host="elsewhere", updated_at=time.time() - 10 * locks.STALE_AFTER_SECONDS
    )
    write_metrics(zoo / "torn", runs.read_metrics(exp / "sqrt-s0"), tail='{"step": 25, "eval_lo')
    write_metrics(zoo / "running", runs.read_metrics(exp / "sqrt-s1")[:2])
    edit_summary(zoo / "running", status="running", host=socket.gethostname(), pid=os.getpid(), updated_at=time.time())
    (zoo / "no_metrics" / "metrics.jsonl").unlink()
    edit_summary(
        zoo / "no_metrics", status="running", host=socket.gethostname(), pid=os.getpid(), updated_at=time.time()
    )
    (zoo / "bad_config" / "config.yaml").write_text("model: [unclosed\n")
    write_metrics(zoo / "bad_line", records[:1], tail="not json\n" + json.dumps(records[1]) + "\n")
    return zoo


def test_unfinished_and_broken_runs_are_plotted_or_skipped_with_a_reason(zoo, tmp_path):
    result = compare.compare([zoo], out=tmp_path / "out")
    reasons = {s.path.name: s.reason for s in result.skipped}
    assert set(reasons) == {"no_metrics", "bad_config", "bad_line"}
    assert reasons["no_metrics"].startswith("no metrics yet")
    assert reasons["bad_config"].startswith("config.yaml: unreadable")
    assert reasons["bad_line"].startswith("metrics.jsonl: line 2 is not JSON; ")  # then what to do about it
    by_label = {g.label: g for g in result.groups}
    assert [(r.path.name, r.status) for r in by_label["scale=none"].runs] == [
        ("diverged", "diverged"),
        ("stale", "stale"),
    ]
    assert [(r.path.name, r.status) for r in by_label["scale=sqrt"].runs] == [
        ("torn", "completed"),
        ("running", "running"),
    ]
    torn = by_label["scale=sqrt"].runs[0]
    assert [r["step"] for r in torn.records] == [0, 5, 10, 15, 20]  # the torn line is dropped
    rows = {row.label: row for row in result.rows}
    assert rows["scale=none"].statuses == {"diverged": 1, "stale": 1}
    final_loss = rows["scale=none"].stats["final_eval_loss"]
    assert (final_loss.n, final_loss.total, rows["scale=none"].left_out) == (0, 1, 1)  # the stale run is left out
    assert rows["scale=none"].outcomes == {"diverged": 1}  # the stale run has not ended: no outcome
    assert "| scale=none | 2 (1 left out) | diverged 1, stale 1 | diverged 1 | — |" in result.table
    assert "Left out of the statistics: 2 runs that did not finish" in result.table
    counted = {row.label: row for row in compare.group_rows(result.groups, 0.99, include_unfinished=True)}
    final_loss = counted["scale=none"].stats["final_eval_loss"]
    assert (final_loss.n, final_loss.total, counted["scale=none"].left_out) == (1, 2, 0)
    _, band = curves.group_curve(by_label["scale=sqrt"], "eval_loss")
    assert band.count.tolist() == [2, 2, 1, 1, 1]  # the running seed has logged two steps
    assert np.isnan(band.std[2:]).all()
    assert "skipped" not in result.table  # printed by the CLI on stderr; the file keeps them:
    assert f"skipped {zoo / 'bad_line'}: metrics.jsonl: line 2 is not JSON" in (result.out_dir / "table.md").read_text()


def test_axes_ignore_non_finite_values_and_mark_where_a_run_diverged(zoo):
    loaded, _ = grouping.load_runs([zoo / "diverged", zoo / "stale", zoo / "torn", zoo / "running"])
    fig = compare_figure.draw_comparison(
        grouping.group_runs(loaded),
        ["eval_loss", "eval_accuracy"],
        references=compare_figure.shared_references(loaded),
        threshold=0.99,
    )
    loss_ax, acc_ax = fig.axes
    low, high = loss_ax.get_ylim()
    finite_losses = [r["eval_loss"] for run in loaded for r in run.records if r["eval_loss"] is not None]
    assert loss_ax.get_yscale() == "log" and acc_ax.get_yscale() == "linear"
    assert 0 < low <= min(finite_losses) and max(finite_losses) <= high < 10 * max(finite_losses)
    marks = [line for line in loss_ax.get_lines() if line.get_label().startswith("diverged run")]
    last_finite = runs.read_metrics(zoo / "diverged")[2]
    assert len(marks) == 1 and marks[0].get_xdata().tolist() == [last_finite["step"]]
    assert marks[0].get_ydata().tolist() == [last_finite["eval_loss"]]
    drawn = {line.get_label() for line in loss_ax.get_lines()}
    groups = grouping.group_runs(loaded)
    at_the_end = [int(curves.group_curve(group, "eval_loss")[1].count[-1]) for group in groups]
    assert at_the_end == [1, 1]  # a seed of each stopped early: the legend says how many make the last point
    assert {f"{g.label}  (n=1 of 2 at the last step)" for g in groups} <= drawn
    assert any(d.startswith("no retrieval") for d in drawn)


def test_automatic_y_scale_is_log_for_losses_and_for_positive_values_spanning_decades():
    def band(*values):
        return curves.band_stats([(np.arange(len(values)), np.array(values, dtype=float))])

    assert compare_figure.log_scale("eval_loss", [band(0.5, 0.4)])
    assert compare_figure.log_scale("score_std", [band(1.0, 3.0), band(2.0, 1e30)])
    assert not compare_figure.log_scale("score_std", [band(1.0, 3.0), band(2.0, 900.0)])
    assert not compare_figure.log_scale("eval_accuracy", [band(0.0, 0.5, 1.0)])
    assert not compare_figure.log_scale("eval_loss", [band(0.5)], yscale="linear")


# ---------------------------------------------------------------------------
# Files and the default output directory
# ---------------------------------------------------------------------------
def test_compare_writes_figures_and_tables_into_the_experiment(root, monkeypatch):
    save_figure, through_plots = figures.save_figure, []

    def recording(fig, path, **options):
        through_plots.append(path)
        return save_figure(fig, path, **options)

    monkeypatch.setattr(figures, "save_figure", recording)
    result = compare.compare([str(root / "exp" / "*")], threshold=0.2)
    assert result.out_dir == (root / "exp" / "compare").absolute()
    assert [p.name for p in result.written] == ["compare.png", "compare.svg", "table.md", "table.csv"]
    assert through_plots == result.written[:2]  # figures are written by the one figures.save_figure
    assert (result.out_dir / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (result.out_dir / "compare.svg").read_text()
    assert (result.out_dir / "table.md").read_text() == result.table
    rows = list(csv.DictReader((result.out_dir / "table.csv").open()))
    assert [(r["group"], r["model.scale"], r["n_runs"], r["seeds"]) for r in rows] == [
        ("scale=none", "none", "2", "0 1"),
        ("scale=sqrt", "sqrt", "2", "0 1"),
    ]
    for row, group_row in zip(rows, result.rows):
        assert float(row["final_eval_loss_mean"]) == pytest.approx(group_row.stats["final_eval_loss"].mean)
    run_dirs, not_runs = grouping.find_run_dirs([root / "exp" / "*"])
    assert (run_dirs, not_runs) == (
        grouping.find_run_dirs([root / "exp"])[0],
        [grouping.Skipped(root / "exp" / "compare", grouping.NOT_A_RUN)],
    )  # compare/ is no run


@pytest.fixture
def finished(root, tmp_path) -> Path:
    """A finished experiment: the real runs beside a report's files and a comparison."""
    exp = tmp_path / "finished"
    for run_dir in (root / "exp").glob("*-s*"):
        shutil.copytree(run_dir, exp / run_dir.name)
    for name in ("report.md", "report.csv", "loss_curves.png"):
        (exp / name).write_text(name)
    (exp / "compare").mkdir()
    return exp


def test_files_a_glob_matches_beside_the_runs_are_skipped(finished, tmp_path, capsys):
    not_runs = {finished / n for n in ("compare", "loss_curves.png", "report.csv", "report.md")}
    shell_expanded = sorted(str(p) for p in finished.iterdir())  # what make's shell passes
    for argv in ([str(finished / "*")], shell_expanded):
        assert cli.main(["compare", *argv, "--out", str(tmp_path / "out")]) == 0
        captured = capsys.readouterr()
        assert {line for line in captured.err.splitlines()} == {f"skipped {p}: {grouping.NOT_A_RUN}" for p in not_runs}
        assert any(line.startswith("| scale=none | 2 | completed 2 |") for line in captured.out.splitlines())
        assert "skipped" not in (tmp_path / "out" / "table.md").read_text()  # it lists the runs not plotted
    assert cli.main(["compare", str(finished / "report*"), str(finished / "compare")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "no run directories found" in err
    assert f"{grouping.NOT_A_RUN}: {finished / 'report.csv'}, {finished / 'report.md'}, {finished / 'compare'}" in err


def test_default_output_directory_follows_the_runs_not_the_working_directory(finished, tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    one_run = finished / "sqrt-s0"
    result = compare.compare([one_run])
    assert result.out_dir == finished / "compare" and result.written[0] == finished / "compare" / "compare.png"
    assert (finished / "compare" / "compare.png").is_file()
    # Where the next comparisons go is the question; their figures are not rendered (most of a comparison's
    # time): each is written as a placeholder, by name, into the output directory chosen.
    monkeypatch.setattr(
        figures, "save_figure", lambda fig, path, tight=True: runs.write_atomic(path, b"figure") or path
    )
    nested = tmp_path / "nested"
    shutil.copytree(one_run, nested / "a" / "sqrt-s0")
    shutil.copytree(finished / "none-s0", nested / "b" / "c" / "none-s0")
    out = compare.compare([nested]).out_dir  # no one parent: a new folder where the runs are
    assert out.parent == nested and out.name.startswith("compare-") and (out / "table.csv").is_file()
    assert compare.compare([nested]).out_dir != out  # never overwritten
    assert list(elsewhere.iterdir()) == []
    assert (
        compare.compare([one_run], out="mine").out_dir == Path("mine") and (elsewhere / "mine" / "table.md").is_file()
    )
    (nested / "a" / "compare").write_text("a file where the output directory would go")
    with pytest.raises(runs.RunError) as info:
        compare.compare([nested / "a"])
    assert facts_in(str(info.value), str(nested / "a" / "compare"), "cannot create", "--out")


# ---------------------------------------------------------------------------
# The commands
# ---------------------------------------------------------------------------
def test_compare_command(root, tmp_path, capsys):
    code = cli.main(
        [
            "compare",
            str(root / "exp" / "*"),
            "--out",
            str(tmp_path / "o"),
            "--metric",
            "eval_loss",
            "--metric",
            "score_std",
            "--smooth",
            "0.5",
            "--x",
            "wall_time",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert any(line.startswith("| scale=none | 2 | completed 2 |") for line in out)
    assert out[-4:] == [str(tmp_path / "o" / n) for n in ("compare.png", "compare.svg", "table.md", "table.csv")]


@pytest.mark.parametrize(
    "args, message",
    [
        (["compare", "{tmp}/missing"], "missing: no such file or directory"),
        (["compare", "{tmp}/missing/*"], "no such file or directory"),
        (["compare", "{exp}", "--metric", "nope"], "--metric: got 'nope'; expected a logged metric"),
        (["compare", "{exp}", "--smooth", "1"], "--smooth: got 1.0; expected a number in [0, 1)"),
        (["compare", "{exp}", "--x", "epoch"], "argument --x: invalid choice"),
        (["runs", "{tmp}/missing"], "missing: no such directory"),
        (["runs", "{root}", "--experiment", "nope"], "--experiment: got 'nope'; expected a directory of runs under"),
        (["runs", "{root}", "--experiment", "{root}/exp"], "expected a directory of runs under"),  # not under: whole
        (["runs", "{root}/exp", "--experiment", "../exp"], "--experiment: got '../exp'; expected a directory of runs"),
        (["runs", "{root}", "--experiment", ""], "--experiment: got ''; expected a directory of runs under"),
        (["runs", "{root}", "--status", "done"], "--status: got 'done'; expected one of running"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(root, tmp_path, capsys, args, message):
    argv = [a.format(tmp=tmp_path, exp=root / "exp", root=root) for a in args]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err


def test_ages_read_like_ls():
    assert [listing.format_age(s) for s in (42, 12 * 60, 5 * 3600, 3 * 86400, None)] == ["42s", "12m", "5h", "3d", "—"]


def test_runs_command_lists_runs_with_the_settings_that_differ(root, zoo, capsys):
    assert cli.main(["runs", str(root)]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split() == [
        "name",
        "status",
        "outcome",
        "task",
        "scale",
        "seed",
        "eval_loss",
        "eval_acc",
        "age",
        "disk",
    ]
    assert [line.split()[:2] + line.split()[3:6] for line in lines] == [
        [f"exp/{scale}-s{seed}", "completed", "retrieval", scale, str(seed)]
        for scale in sorted(SCALES)
        for seed in SEEDS
    ]
    assert cli.main(["runs", str(root), "--experiment", "exp", "--status", "diverged"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "no runs" in captured.err
    assert cli.main(["runs", str(zoo)]) == 0
    captured = capsys.readouterr()
    listed = {line.split()[0]: line.split() for line in captured.out.splitlines()[1:]}
    assert {name: cells[1] for name, cells in listed.items()} == {
        "diverged": "diverged",
        "no_metrics": "running",
        "running": "running",
        "stale": "stale",
        "torn": "completed",
    }
    assert listed["diverged"][2] == "diverged" and listed["running"][2] == "—"  # no outcome before the end
    assert listed["diverged"][6:8] == ["—", "—"]  # no final figures after a divergence
    assert listed["torn"][6] == f"{runs.read_metrics(zoo / 'torn')[-1]['eval_loss']:.4g}"
    assert "skipped" in captured.err and "bad_config" in captured.err and "bad_line" in captured.err

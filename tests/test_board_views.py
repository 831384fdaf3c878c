"""The board's chart read as a researcher reads it, in headless Chromium
(the browser and its helpers from tests/test_board.py): a diverged run does
not set the y axis (robust range, a toggle for every value, a × at its last
finite value), numbers are written by their size, smoothing is by step with
the raw curve behind, and the same rules hold for the figures' y ranges
(attn.store.runs.robust_limits) and smoothing (attn.analysis.curves.ema)."""

import math

import numpy as np
import pytest
from board_runs import write_run
from test_board import chart, click, errors_logged, open_page, serving, wait_for  # noqa: F401

from attn.analysis import curves
from attn.board import data
from attn.store import runs

EXPLODING = (3.45, 21.7, 408.0, 1.07e7, 4.37e20)  # an unscaled run's eval loss, steps 0..4, then NaN


def write_diverged_run(directory, *overrides):
    """A run whose eval loss grows by twenty orders of magnitude, then is NaN at step 5."""
    write_run(directory, "model.scale=none", "model.d_k=1024", *overrides, steps=200, logged_until=0)
    (directory / "metrics.jsonl").unlink()
    for step, loss in enumerate(EXPLODING):
        runs.append_metrics(directory, {"step": step, "eval_loss": loss, "train_loss": loss, "eval_accuracy": 0.06})
    runs.append_metrics(
        directory, {"step": 5, "eval_loss": math.nan, "train_loss": math.nan, "eval_accuracy": math.nan}
    )
    summary = runs.read_summary(directory)
    runs.write_json(
        directory / "summary.json", {**summary, "status": "diverged", "reason": "non-finite loss at step 5"}
    )
    return directory


@pytest.fixture(scope="module")
def diverged_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("board-views") / "runs"
    for seed in (0, 1):
        write_run(root / f"sqrt-s{seed}", f"seed={seed}")
    write_diverged_run(root / "none-diverged")
    return root


def test_robust_limits_come_from_the_bulk_and_everything_on_request():
    steady = [2.5 * np.exp(-np.arange(0, 201, 10) / 40) + 1e-3 for _ in range(3)]
    bulk = runs.robust_limits(steady + [np.array(EXPLODING)], log=True)
    assert bulk[1] < 1e4 and bulk[0] < 0.0178  # the 4e20 tail does not set the top; the smallest loss is shown
    everything = runs.robust_limits(steady + [np.array(EXPLODING)], log=True, robust=False)
    assert everything[1] > 4e20
    assert runs.robust_limits([[np.nan, np.inf]], log=False) is None
    low, high = runs.robust_limits([[0.0, 1.0]], log=False)
    assert low < 0 < 1 < high


def test_smoothing_is_by_step_so_a_sparser_log_is_smoothed_over_the_same_steps():
    steps = np.arange(0, 101, 1.0)
    values = np.exp(-steps / 20)
    dense = curves.ema(values, 0.9, steps, unit=1.0)
    sparse = curves.ema(values[::10], 0.9, steps[::10], unit=1.0)
    by_point = curves.ema(values[::10], 0.9)  # smoothing over logged points: a much longer window of steps
    assert np.allclose(dense[::10][3:], sparse[3:], rtol=0.25)  # about the same curve, whatever the logging rate
    assert not np.allclose(dense[::10][3:], by_point[3:], rtol=0.5)
    assert np.allclose(curves.ema(values, 0.9), curves.ema(values, 0.9, steps, unit=1.0))  # even: the debiased EMA
    assert curves.ema([5.0], 0.99, [0.0])[0] == 5.0  # debiased: the first point is its own value


def test_a_diverged_run_does_not_set_the_boards_y_axis(browser, diverged_root):  # noqa: F811
    with serving(data.Board([diverged_root])) as httpd:
        open_page(browser, httpd.url + "?runs=all&metric=eval_loss", 3)
        wait_for(browser, lambda: chart(browser)["series"] == "3")
        shown = chart(browser)
        lowest = min(r["eval_loss"] for seed in (0, 1) for r in runs.read_metrics(diverged_root / f"sqrt-s{seed}"))
        assert float(shown["yhigh"]) < 1e4 and float(shown["ylow"]) < lowest, shown
        assert shown["crosses"] == "1"  # its × at the last finite value, held to the top edge
        click(browser, "#y-all")
        wait_for(browser, lambda: float(chart(browser)["yhigh"]) > 4e20)
        # tick labels by size, and an axis as wide as its widest label
        labels, width, widest = browser.execute_script(
            "const s = AttnBoard.page.state, u = s.plot, labels = s.yAxis.labels;"
            "u.ctx.font = '12px system-ui, sans-serif';"
            "return [labels, u.axes[1]._size || s.yAxis.size, Math.max(...labels.map(v => u.ctx.measureText(v).width))]"
        )
        assert any("e+" in label for label in labels) and not any(len(label) > 8 for label in labels), labels
        assert width >= widest + 14, (width, widest)
        assert errors_logged(browser) == []


def test_numbers_read_by_their_size(browser, diverged_root):  # noqa: F811
    with serving(data.Board([diverged_root])) as httpd:
        open_page(browser, httpd.url, 3)
        shown = browser.execute_script(
            "return [1.1e-4, 0.012, 3.456, 3200, 4.4e20, 0, -2.5e-5, null].map(AttnBoard.formatNumber)"
        )
    assert shown == ["1.1e-4", "0.012", "3.46", "3.2k", "4.4e+20", "0", "-2.5e-5", "—"]


def test_smoothing_on_the_board_is_by_step_with_the_raw_curve_behind(browser, diverged_root):  # noqa: F811
    with serving(data.Board([diverged_root])) as httpd:
        open_page(browser, httpd.url + "?runs=all&metric=eval_loss&smooth=0.9", 3)
        wait_for(browser, lambda: chart(browser)["series"] == "3")
        labels = browser.execute_script("return AttnBoard.page.state.plot.series.map(s => s.label)")
        assert sum(label.endswith("(raw)") for label in labels) == 3
        # the page's smoothing is attn.analysis.curves.ema, by step
        steps = [0, 10, 20, 50, 51, 52, 100]
        values = [3.0, 2.0, 1.5, 0.3, 0.2, 0.25, 0.01]
        page = browser.execute_script("return AttnBoard.ema(arguments[0], 0.9, arguments[1], 2)", values, steps)
        assert np.allclose(page, curves.ema(np.array(values), 0.9, np.array(steps, float), unit=2.0))
        # the hover shows both: the legend's live values for the smoothed and the raw curve
        browser.execute_script("const u = AttnBoard.page.state.plot; u.setCursor({left: u.valToPos(50, 'x'), top: 10})")
        values_shown = browser.execute_script(
            "return [...document.querySelectorAll('.u-legend .u-series')].map(e => e.textContent)"
        )
        assert any("(raw)" in v and "—" not in v.split(":")[-1] for v in values_shown), values_shown
        assert errors_logged(browser) == []


def test_compare_figure_takes_its_y_range_from_the_runs_that_stayed_finite(diverged_root, tmp_path):
    from attn.report import compare, compare_figure

    result = compare.compare([diverged_root], out=tmp_path / "cmp")
    fig = compare_figure.draw_comparison(result.groups, ["eval_loss"], smoothing=0.9)
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    steady = [r["eval_loss"] for seed in (0, 1) for r in runs.read_metrics(diverged_root / f"sqrt-s{seed}")]
    assert high < 1e2 and low < min(steady)  # not 4e20: the diverged run's tail is off the axis
    crosses = [line for line in ax.get_lines() if line.get_marker() == "x"]
    assert len(crosses) == 1 and crosses[0].get_ydata()[0] == high  # its × held to the top edge
    faint = [line for line in ax.get_lines() if line.get_alpha() == 0.3]
    assert len(faint) == len(result.groups)  # each raw curve behind its smoothed one
    everything = compare_figure.draw_comparison(result.groups, ["eval_loss"], robust=False)
    assert everything.axes[0].get_ylim()[1] > 4e20


def test_compare_keeps_an_earlier_comparison_of_other_runs_and_says_where_it_wrote(diverged_root):
    from attn.report import compare

    first = compare.compare([diverged_root / "sqrt-s0", diverged_root / "sqrt-s1"])
    assert first.out_dir == diverged_root / "compare"
    again = compare.compare([diverged_root / "sqrt-s1", diverged_root / "sqrt-s0"])  # the same runs: refreshed
    assert again.out_dir == first.out_dir and not any("kept" in w for w in again.warnings)
    other = compare.compare([diverged_root / "sqrt-s0", diverged_root / "none-diverged"])
    assert other.out_dir != first.out_dir and other.out_dir.parent == diverged_root
    assert any(str(first.out_dir) in w and str(other.out_dir) in w for w in other.warnings), other.warnings
    assert (first.out_dir / "compare.png").exists()


def test_the_filter_drives_the_chart_and_guesses_a_mistyped_key(browser, diverged_root):  # noqa: F811
    from test_board import set_filter

    with serving(data.Board([diverged_root])) as httpd:
        open_page(browser, httpd.url + "?runs=all&groups=all&metric=eval_loss", 3)
        wait_for(browser, lambda: chart(browser)["series"] == "5")  # 3 runs, 2 groups
        set_filter(browser, "scale=none")
        wait_for(
            browser, lambda: chart(browser)["series"] == "2"
        )  # the diverged run and its group, nothing hidden drawn
        set_filter(browser, "sclae=none")
        errors = browser.execute_script(
            "return [...document.querySelectorAll('#filter-errors li')].map(l => l.textContent)"
        )
        assert any("did you mean scale?" in e for e in errors), errors
        assert errors_logged(browser) == []


NAMES = ["lr0.1-s1", "lr0.01-s0", "lr0.1-s0", "lr0.03-s0", "lr0.01-s1", "lr1e-3-s0", "dk256", "dk16"]
NATURAL = ["dk16", "dk256", "lr1e-3-s0", "lr0.01-s0", "lr0.01-s1", "lr0.03-s0", "lr0.1-s0", "lr0.1-s1"]


def test_natural_order_reads_decimals_as_numbers(tmp_path, capsys):
    from attn import cli
    from attn.analysis.grouping import natural_key

    assert sorted(NAMES, key=natural_key) == NATURAL
    for name, lr in (("lr0.1-s0", 0.1), ("lr0.01-s0", 0.01), ("lr0.03-s0", 0.03), ("lr0.01-s1", 0.01)):
        write_run(tmp_path / "runs" / name, f"optim.lr={lr}", f"seed={name[-1]}")
    assert cli.main(["runs", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    order = [
        name
        for line in out.splitlines()
        for name in ("lr0.01-s0", "lr0.01-s1", "lr0.03-s0", "lr0.1-s0")
        if line.split() and line.split()[0].endswith(name)
    ]
    assert order == ["lr0.01-s0", "lr0.01-s1", "lr0.03-s0", "lr0.1-s0"], out


def test_the_board_sorts_names_and_settings_in_natural_order(browser, diverged_root):  # noqa: F811
    with serving(data.Board([diverged_root])) as httpd:
        open_page(browser, httpd.url, 3)
        shown = browser.execute_script("return arguments[0].slice().sort(AttnBoard.page.naturalCompare)", NAMES)
    assert shown == NATURAL


def test_a_groups_n_counts_the_seeds_alive_at_its_last_step(browser, tmp_path):  # noqa: F811
    root = tmp_path / "runs"
    for seed in (1, 2):
        write_diverged_run(root / f"died-s{seed}", f"seed={seed}")
    write_run(root / "lived-s3", "model.scale=none", "model.d_k=1024", "seed=3")
    with serving(data.Board([root])) as httpd:
        open_page(browser, httpd.url + "?groups=all&metric=eval_loss", 3)
        wait_for(browser, lambda: chart(browser)["series"] == "1")
        labels = browser.execute_script("return AttnBoard.page.state.plot.series.map(s => s.label)")
        assert any("(n=1 of 3 at the last step)" in label for label in labels), labels
        assert chart(browser)["crosses"] == "2"  # where each of the two died


def test_group_by_any_setting_draws_a_curve_per_value_over_the_runs_shown(browser, diverged_root):  # noqa: F811
    from test_board import set_filter

    with serving(data.Board([diverged_root])) as httpd:
        open_page(browser, httpd.url + "?metric=eval_loss&group_by=model.scale", 3)
        wait_for(browser, lambda: chart(browser)["series"] == "2")
        labels = browser.execute_script("return AttnBoard.page.state.plot.series.map(s => s.label)")
        assert "scale=none (n=1)" in labels and "scale=sqrt (n=2)" in labels, labels
        assert chart(browser)["bands"] == "1" and chart(browser)["crosses"] == "1"
        set_filter(browser, "seed=0")  # the filter still decides which runs are pooled
        wait_for(
            browser,
            lambda: (
                "scale=sqrt (n=1)"
                in browser.execute_script("return AttnBoard.page.state.plot.series.map(s => s.label)")
            ),
        )
        assert errors_logged(browser) == []

"""The board shows a stall without a click (issue 44 item 5), in headless Chromium (the browser and
its helpers from tests/test_board.py): with nothing ticked it draws the runs; a log axis within one
decade has tick labels; loss charts carry the runs' own chance and no-retrieval levels; gradient
norms are log by default; a run has one colour in every view; a group's mean breaks where a seed
diverged and says how many runs each point averages; open= takes a run's name; the runs table has
an outcome column and the filter an outcome term.

The runs are written by hand: a scaled pair that learns and an unscaled pair that stays at chance,
as configs/wide.yaml and configs/wide_unscaled.yaml do."""

import math
import os
import re
import shutil
import socket
import time

import pytest
from test_board import chart, click, errors_logged, open_page, row_ids, serving, set_filter, text_of, wait_for  # noqa: F401

from attn.analysis import grouping
from attn.board import STATIC_DIR, data, export
from attn.config.loading import load_config
from attn.config.schema import to_dict
from attn.store import runs

STEPS = 200
CHANCE = math.log(16)
REFERENCES = {"chance": CHANCE, "no_retrieval": 1.7983973799733117}


def loss_at(step: int, scale: str, seed: int) -> float:
    """The scaled head leaves chance near step 90 and learns; the unscaled one stays at chance."""
    if step == 0:
        return 3.7
    wobble = 0.01 * math.sin(step / 7 + seed)
    if scale == "none":
        return CHANCE + wobble
    return 2.8 / (1 + math.exp((step - 90) / 12)) + 0.004 + wobble * 0.1


def record(step: int, scale: str, seed: int) -> dict:
    loss = loss_at(step, scale, seed)
    return {
        "step": step,
        "eval_loss": loss,
        "train_loss": loss,
        "eval_accuracy": min(1.0, max(0.06, 1 - loss / 2.8)),
        "grad_norm/W_q": (0.05 + math.exp(-step / 60)) if scale == "sqrt" else 0.3 + 0.01 * seed,  # within 1e3
        "update_ratio/W_q": 0.01 * (1 + step / 100),
        "wall_time": step * 0.01,
    }


def write_run(directory, *overrides, records, status="completed", outcome=None, updated_at=None, references=REFERENCES):
    """A run directory: config.yaml from the overrides, the records, a summary with the references and,
    when given, the outcome as attn train writes it (a run without one is an older run)."""
    config = load_config(None, [f"train.steps={STEPS}", *overrides])
    directory.mkdir(parents=True)
    runs.write_config(directory, to_dict(config), {"overrides": list(overrides)})
    for r in records:
        runs.append_metrics(directory, r)
    summary = {
        "status": status,
        "steps": STEPS,
        "task": "retrieval",
        "references": references,
        "updated_at": time.time() if updated_at is None else updated_at,
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }
    if outcome:
        summary.update(outcome=outcome[0], outcome_said=outcome[1])
    runs.write_json(directory / "summary.json", summary)
    return directory


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """wide/: scaled-s0, scaled-s1 (learned), unscaled-s0, unscaled-s1 (stalled at chance); the s0 runs
    carry their outcome in summary.json, the s1 runs do not (the board classifies them)."""
    root = tmp_path_factory.mktemp("board-stall") / "runs"
    for scale, name, said in (
        ("sqrt", "scaled", ("learned", "learned")),
        ("none", "unscaled", ("stalled", "stalled (loss at chance)")),
    ):
        for seed in (0, 1):
            write_run(
                root / "wide" / f"{name}-s{seed}",
                f"model.scale={scale}",
                f"seed={seed}",
                records=[record(step, scale, seed) for step in range(0, STEPS + 1, 10)],
                outcome=said if seed == 0 else None,
            )
    return root


def ids_by_name(board) -> dict:
    return {run["name"]: run["id"] for run in board.snapshot()["runs"]}


def built(driver, panel: int = 0) -> dict:
    """What the chart drew: each series' label, class, stroke and data column (null for a break)."""
    return driver.execute_script(
        "const b = AttnBoard.page.panels()[arguments[0]].built;"
        "return b.series.map((s, i) => ({label: s.label, cls: s.class || '', stroke: s.stroke || '',"
        " counts: s.counts ? s.counts.map(v => v === undefined ? -1 : v) : null,"
        " data: b.data[i].map(v => v === undefined ? 'skip' : v)}))",
        panel,
    )


def test_each_run_names_its_outcome_and_carries_its_reference_levels(pair):
    snapshot = data.Board([pair]).snapshot()
    shown = {run["name"]: (run["outcome"], run["outcome_said"], run["references"]) for run in snapshot["runs"]}
    assert shown == {
        "wide/scaled-s0": ("learned", "learned", REFERENCES),
        "wide/scaled-s1": ("learned", "learned", REFERENCES),  # classified by attn.outcomes.of_run
        "wide/unscaled-s0": ("stalled", "stalled (loss at chance)", REFERENCES),
        "wide/unscaled-s1": ("stalled", "stalled (loss at chance)", REFERENCES),
    }
    assert {"grad_norm", "update_ratio", "loss"} <= set(snapshot["log_metrics"])


def test_a_summary_outcome_that_is_no_class_or_disagrees_with_the_status_is_classified_as_compare_does(tmp_path):
    """The board takes summary.json's outcome as grouping.Run.said_outcome does (compare, `attn runs`): a class
    that agrees with the run's status; else the run is classified from its records, or has none yet."""
    records = [record(step, "none", 0) for step in range(0, STEPS + 1, 10)]
    write_run(tmp_path / "bogus", records=records, outcome=("finished nicely", "finished nicely"))
    write_run(tmp_path / "not-diverged", records=records, outcome=("diverged", "diverged"))
    write_run(tmp_path / "running", records=records, status="running", outcome=("learned", "learned"))
    shown = {run["name"]: (run["outcome"], run["outcome_said"]) for run in data.Board([tmp_path]).snapshot()["runs"]}
    compared = {run.path.name: run.outcome for run in grouping.load_runs(sorted(tmp_path.iterdir()))[0]}
    assert shown == {
        "bogus": ("stalled", "stalled (loss at chance)"),
        "not-diverged": ("stalled", "stalled (loss at chance)"),
        "running": (None, None),  # not ended yet
    }
    assert {name: outcome for name, (outcome, _) in shown.items()} == compared


def test_with_nothing_ticked_the_page_draws_the_runs_with_their_reference_lines(browser, pair, tmp_path):  # noqa: F811
    page = export.export(data.Board([pair]), tmp_path / "page")
    open_page(browser, page.as_uri(), 4)  # no URL parameters: what make board-screenshot shows
    wait_for(browser, lambda: chart(browser)["series"] == "4")
    assert chart(browser)["references"] == "2" and chart(browser)["log"] == "true"
    assert "all 4 runs" in text_of(browser, "#chart-default")
    assert not browser.find_element("id", "chart-empty").is_displayed()
    assert errors_logged(browser) == []


def test_the_y_range_holds_every_run_from_its_first_logged_step(browser, pair):  # noqa: F811
    """The stalled pair alone: its bulk spans a hair around chance, and step 0's loss (3.7) stays inside the axes."""
    board = data.Board([pair])
    ids = ids_by_name(board)
    with serving(board) as httpd:
        open_page(browser, httpd.url + f"?runs={ids['wide/unscaled-s0']},{ids['wide/unscaled-s1']}&metric=eval_loss", 4)
        wait_for(browser, lambda: chart(browser)["series"] == "2")
        assert float(chart(browser)["yhigh"]) >= loss_at(0, "none", 0)
        assert errors_logged(browser) == []


def test_with_nothing_ticked_many_runs_the_newest_are_drawn_and_the_page_says_so(browser, tmp_path):  # noqa: F811
    n = int(re.search(r"const DEFAULT_RUNS = (\d+);", (STATIC_DIR / "board.js").read_text()).group(1))
    root = tmp_path / "runs"
    first = write_run(root / "run-0", records=[record(s, "none", 0) for s in (0, 10, 20)], updated_at=1e9)
    for i in range(1, n + 2):  # copies of one run (one group): run-0 and run-1 the least recently updated
        shutil.copytree(first, root / f"run-{i}")
        runs.write_json(root / f"run-{i}" / "summary.json", {**runs.read_summary(first), "updated_at": 1e9 + i})
    with serving(data.Board([root])) as httpd:
        open_page(browser, httpd.url, n + 2)
        wait_for(browser, lambda: chart(browser)["series"] == str(n))
        labels = {s["label"] for s in built(browser)[1:] if not s["cls"]}
        assert labels == {f"run-{i}" for i in range(2, n + 2)}
        assert f"the {n} most recently updated of {n + 2} runs" in text_of(browser, "#chart-default")
        click(browser, "#runs tr[data-id='0/run-0'] input")  # a tick: that run alone
        wait_for(browser, lambda: chart(browser)["series"] == "1")
        assert not browser.find_element("id", "chart-default").is_displayed()
        click(browser, "#clear-selection")
        wait_for(browser, lambda: chart(browser)["series"] == str(n))
        assert "runs=" not in browser.current_url
        assert errors_logged(browser) == []


def test_a_log_axis_within_one_decade_has_tick_labels(browser, pair):  # noqa: F811
    board = data.Board([pair])
    ids = ids_by_name(board)
    stalled = f"{ids['wide/unscaled-s0']},{ids['wide/unscaled-s1']}"
    with serving(board) as httpd:
        open_page(browser, httpd.url + f"?runs={stalled}&metric=eval_loss", 4)
        wait_for(browser, lambda: chart(browser)["series"] == "2")
        shown = chart(browser)
        low, high = float(shown["ylow"]), float(shown["yhigh"])
        assert shown["log"] == "true" and high / low < 10  # one decade: no power of ten inside
        labels = browser.execute_script("return AttnBoard.page.state.yAxis.labels")
        assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
        assert all(low <= float(label) <= high for label in labels), labels
        assert errors_logged(browser) == []


def test_loss_charts_draw_the_runs_chance_and_no_retrieval_levels_inside_the_axes(browser, pair):  # noqa: F811
    with serving(data.Board([pair])) as httpd:
        open_page(browser, httpd.url + "?runs=all&metric=eval_loss", 4)
        wait_for(browser, lambda: chart(browser)["series"] == "4")
        references = {s["label"].split(" (")[0]: set(s["data"]) for s in built(browser) if s["cls"] == "reference"}
        assert references == {"chance": {REFERENCES["chance"]}, "no retrieval": {REFERENCES["no_retrieval"]}}
        shown = chart(browser)
        assert shown["references"] == "2"
        assert float(shown["ylow"]) < REFERENCES["no_retrieval"] < REFERENCES["chance"] < float(shown["yhigh"])
        browser.find_element("css selector", "#metric option[value='eval_accuracy']").click()
        wait_for(browser, lambda: chart(browser)["metric"] == "eval_accuracy")
        assert chart(browser)["references"] == "0"  # not a loss
        assert errors_logged(browser) == []


def test_gradient_norms_and_update_ratios_are_drawn_on_a_log_axis_by_default(browser, pair):  # noqa: F811
    with serving(data.Board([pair])) as httpd:
        open_page(browser, httpd.url + "?runs=all", 4)
        for metric, log in (("grad_norm/W_q", "true"), ("update_ratio/W_q", "true"), ("eval_accuracy", "false")):
            browser.execute_script(
                "const s = document.getElementById('metric'); s.value = arguments[0];"
                "s.dispatchEvent(new Event('change'))",
                metric,
            )
            wait_for(browser, lambda: chart(browser).get("metric") == metric and chart(browser)["series"] == "4")
            assert chart(browser)["log"] == log, metric
        assert errors_logged(browser) == []


def colours(driver) -> dict:
    """Each run's colour in the chart (its curve), the scatter, the parallel coordinates and the table."""
    return driver.execute_script(
        "const page = AttnBoard.page, hp = page.hp, b = page.panels()[0].built, out = {};"
        "const add = (name, view, colour) => { (out[name] = out[name] || {})[view] = colour; };"
        "b.series.forEach(s => { if (!s.class && s.label) add(s.label, 'chart', s.stroke); });"
        "hp.scatter.forEach(p => add(hp.rows[p.row].run.name, 'scatter', p.style.color));"
        "hp.parallel.forEach(l => add(hp.rows[l.row].run.name, 'parallel', l.style.color));"
        "document.querySelectorAll('#runs tbody tr').forEach(tr =>"
        " add(page.state.runsById.get(tr.dataset.id).name, 'table', tr.dataset.color));"
        "return out;"
    )


def test_a_run_has_one_colour_in_the_chart_the_hyperparameter_views_and_the_table(browser, pair):  # noqa: F811
    with serving(data.Board([pair])) as httpd:
        open_page(browser, httpd.url + "?runs=all&metric=eval_loss", 4)
        wait_for(browser, lambda: view_points(browser) == 4 and chart(browser)["series"] == "4")
        assert browser.execute_script("return document.getElementById('color-by').value") == "model.scale"
        shown = colours(browser)
        assert all(len(set(views.values())) == 1 and len(views) == 4 for views in shown.values()), shown
        by_scale = {name.split("-")[0]: views["chart"] for name, views in shown.items()}
        assert len(set(by_scale.values())) == 2  # a colour per value of the setting that varies, seeds alike
        browser.execute_script(
            "const s = document.getElementById('color-by'); s.value = 'none'; s.dispatchEvent(new Event('change'))"
        )
        wait_for(browser, lambda: len({views["chart"] for views in colours(browser).values()}) == 4)
        shown = colours(browser)  # a colour per curve, the same in every view
        assert all(len(set(views.values())) == 1 and len(views) == 4 for views in shown.values()), shown
        assert errors_logged(browser) == []


def view_points(driver) -> int:
    return int(driver.execute_script("return document.getElementById('hp-scatter').dataset.points"))


def test_colour_by_defaults_to_the_setting_that_varies_not_one_that_follows_another(browser, tmp_path):  # noqa: F811
    """d_v set with d_k (as it once followed it) and the scale varying: colour by the scale."""
    root = tmp_path / "runs"
    for d_k in (16, 64):
        for scale in ("sqrt", "none"):
            write_run(
                root / f"dk{d_k}-{scale}",
                f"model.d_k={d_k}",
                f"model.d_v={d_k}",
                f"model.scale={scale}",
                records=[record(s, scale, 0) for s in (0, 10, 20)],
            )
    with serving(data.Board([root])) as httpd:
        open_page(browser, httpd.url, 4)
        wait_for(browser, lambda: browser.execute_script("return document.getElementById('color-by').value") != "")
        controls = browser.execute_script("return ['hp-x', 'color-by'].map(id => document.getElementById(id).value)")
        assert controls == ["model.d_k", "model.scale"]
        assert errors_logged(browser) == []


def test_a_groups_mean_is_over_the_seeds_still_finite_broken_where_one_diverged_with_n(browser, tmp_path):  # noqa: F811
    root = tmp_path / "runs"
    write_run(root / "s0", "seed=0", records=[record(s, "sqrt", 0) for s in range(0, STEPS + 1, 10)])
    early = [record(s, "sqrt", 1) for s in range(0, 101, 10)]
    early[-1] = {**early[-1], "eval_loss": 4.97e4}  # its last finite value, as a seed blowing up has
    nan = {"step": 110, "eval_loss": math.nan, "train_loss": math.nan, "eval_accuracy": math.nan}
    write_run(root / "s1", "seed=1", records=[*early, nan], status="diverged")
    board = data.Board([root])
    [group] = board.snapshot()["groups"]
    with serving(board) as httpd:
        open_page(browser, httpd.url + f"?groups={group['id']}&metric=eval_loss", 2)
        wait_for(browser, lambda: chart(browser)["series"] == "1")
        series = built(browser)
        xs = series[0]["data"]
        [mean] = [s for s in series if s["counts"] is not None]
        counts = {x: n for x, n in zip(xs, mean["counts"]) if n != -1}
        assert counts == {step: 2 if step <= 100 else 1 for step in range(0, STEPS + 1, 10)}
        breaks = [x for x, v in zip(xs, mean["data"]) if v is None]
        assert len(breaks) == 1 and 100 < breaks[0] < 110  # the mean of two is not joined to the mean of one
        s0 = {r["step"]: r["eval_loss"] for r in runs.read_metrics(root / "s0")}
        assert all(v == pytest.approx(s0[x]) for x, v in zip(xs, mean["data"]) if x > 110 and v not in (None, "skip"))
        assert "n=1" in mean["label"] and "of 2" in mean["label"]
        assert errors_logged(browser) == []


def test_open_takes_a_runs_name_and_still_its_id(browser, pair):  # noqa: F811
    board = data.Board([pair])
    ids = ids_by_name(board)
    with serving(board) as httpd:
        for wanted in ("wide/unscaled-s1", ids["wide/unscaled-s1"]):
            open_page(browser, httpd.url + "?open=" + wanted, 4)
            wait_for(browser, lambda: browser.find_element("id", "run-details").is_displayed())
            assert text_of(browser, "#run-details h2").startswith("Run wide/unscaled-s1")
            wait_for(
                browser, lambda: text_of(browser, "#run-config tr[data-key='model.scale'] td:last-child") == "none"
            )
            assert "stalled (loss at chance)" in text_of(browser, "#run-details p")
        wait_for(browser, lambda: "open=wide%2Funscaled-s1" in browser.current_url)  # the URL names it
        assert errors_logged(browser) == []


def test_the_runs_table_has_an_outcome_column_and_the_filter_an_outcome_term(browser, pair):  # noqa: F811
    board = data.Board([pair])
    snapshot = board.snapshot()
    with serving(board) as httpd:
        open_page(browser, httpd.url, 4)
        cells = browser.execute_script(
            "const at = [...document.querySelectorAll('#runs thead th')].findIndex(th => th.dataset.key === 'outcome');"
            "return Object.fromEntries([...document.querySelectorAll('#runs tbody tr')]"
            ".map(tr => [tr.dataset.id, tr.children[at].textContent]))"
        )
        assert cells == {run["id"]: run["outcome_said"] for run in snapshot["runs"]}
        for term, outcome in (("outcome=stalled", "stalled"), ("outcome=learned", "learned")):
            set_filter(browser, term)
            assert row_ids(browser) == [run["id"] for run in snapshot["runs"] if run["outcome"] == outcome], term
            assert browser.find_elements("css selector", "#filter-errors li") == []
        set_filter(browser, "outcome!=stalled scale=none")
        assert row_ids(browser) == []
        assert errors_logged(browser) == []

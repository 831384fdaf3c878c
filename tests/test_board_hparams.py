"""The board's hyperparameter views (issue 22 item 4) and one colour per setting value across
views (item 2), in headless Chromium (the browser and its helpers from tests/test_board.py):
a scatter of a metric's final or best value per run against a setting, and parallel
coordinates over the settings that differ, drawing the runs the curves draw (selection,
filter, group-by), coloured by a setting; a diverged run at the top edge with a ×.

What was drawn is read from the page's `AttnBoard.page.hp` (the points' pixels, the rows
behind them) and the views' datasets (points, crosses, axes, keys)."""

import json

import pytest
from board_runs import write_run
from test_board import chart, errors_logged, open_page, serving, set_filter, wait_for  # noqa: F401
from test_board_views import EXPLODING, write_diverged_run

from attn.board import data
from attn.store import runs

LRS = (0.01, 0.1)
N_RUNS = 2 * len(LRS) * 2 + 1  # scales x rates x seeds, and the diverged run
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """Two scales x two rates x two seeds, and an unscaled run at lr 1 that diverged at step 5."""
    root = tmp_path_factory.mktemp("board-hparams") / "runs"
    for scale in ("sqrt", "none"):
        for lr in LRS:
            for seed in (0, 1):
                write_run(root / f"{scale}-lr{lr}-s{seed}", f"model.scale={scale}", f"optim.lr={lr}", f"seed={seed}")
    write_diverged_run(root / "diverged", "optim.lr=1.0")
    return root


def view(driver, name: str) -> dict:
    return driver.execute_script(f"return {{...document.getElementById('hp-{name}').dataset}}")


def drawn_points(driver) -> list[dict]:
    """Each point of the scatter: its run, the value drawn, its pixels and colour."""
    return driver.execute_script(
        "const hp = AttnBoard.page.hp; return hp.scatter.map(p => ({id: hp.rows[p.row].run.id,"
        " name: hp.rows[p.row].run.name, value: hp.rows[p.row].value, px: p.px, py: p.py, crossed: p.crossed,"
        " color: p.style.color}))"
    )


def choose(driver, **selects) -> None:
    """Set the views' controls (by element id) as a person would, each firing its change."""
    for element_id, value in selects.items():
        driver.execute_script(
            "const s = document.getElementById(arguments[0]); s.value = arguments[1];"
            "s.dispatchEvent(new Event('change'))",
            element_id.replace("_", "-"),
            value,
        )


def hover(driver, view_name: str, x: float, y: float) -> str:
    """The pointer moved to (x, y) of a view's canvas; the tip's text."""
    from selenium.webdriver.common.action_chains import ActionChains

    canvas = driver.find_element("css selector", f"#hp-{view_name} canvas")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
    size = canvas.size
    ActionChains(driver).move_to_element_with_offset(
        canvas, round(x - size["width"] / 2), round(y - size["height"] / 2)
    ).perform()
    return driver.execute_script(f"return document.querySelector('#hp-{view_name} .hp-tip').textContent")


def test_each_run_has_its_metrics_ends_over_every_record(sweep):
    snapshot = data.Board([sweep]).snapshot()
    by_name = {run["name"]: run for run in snapshot["runs"]}
    records = runs.read_metrics(sweep / "sqrt-lr0.1-s1")
    ends = by_name["sqrt-lr0.1-s1"]["ends"]
    assert ends["eval_loss"] == {
        "final": records[-1]["eval_loss"],
        "step": records[-1]["step"],
        "best": min(r["eval_loss"] for r in records),
    }
    assert ends["eval_accuracy"]["best"] == max(r["eval_accuracy"] for r in records)  # accuracy: best at its highest
    assert snapshot["best_highest"] == ["eval_accuracy"]
    # the diverged run: no finite final value, the last finite one and its step kept
    assert by_name["diverged"]["ends"]["eval_loss"] == {
        "final": None,
        "step": 5,
        "best": EXPLODING[0],
        "last_finite": EXPLODING[-1],
        "last_finite_step": 4,
    }


def test_the_scatter_draws_a_point_per_run_drawn_where_its_values_are(browser, sweep):  # noqa: F811
    board = data.Board([sweep])
    snapshot = board.snapshot()
    with serving(board) as httpd:
        open_page(browser, httpd.url + "?runs=all&metric=eval_loss&hp_x=optim.lr&color_by=model.scale", N_RUNS)
        wait_for(browser, lambda: view(browser, "scatter").get("points") == str(N_RUNS))
        shown = view(browser, "scatter")
        assert (shown["x"], shown["xkind"], shown["xlog"], shown["ylog"]) == ("optim.lr", "numeric", "true", "true")
        assert shown["crosses"] == "1"  # the diverged run, at the top edge
        points = drawn_points(browser)
        finals = {run["id"]: run["final_eval_loss"] for run in snapshot["runs"]}
        assert {p["id"]: p["value"] for p in points} == finals  # the table's final eval loss, None where diverged
        [crossed] = [p for p in points if p["crossed"]]
        assert crossed["name"] == "diverged" and crossed["py"] == min(p["py"] for p in points)
        finite = sorted((p for p in points if not p["crossed"]), key=lambda p: p["value"])
        assert [p["py"] for p in finite] == sorted((p["py"] for p in finite), reverse=True)  # higher value, higher up
        lr = {run["id"]: run["values"]["optim.lr"] for run in snapshot["runs"]}
        by_lr = sorted(points, key=lambda p: lr[p["id"]])
        assert [p["px"] for p in by_lr] == sorted(p["px"] for p in by_lr)  # left to right in lr
        # the filter removes points; so does untick a run
        set_filter(browser, "scale=sqrt")
        wait_for(browser, lambda: view(browser, "scatter").get("points") == "4")
        assert view(browser, "scatter")["crosses"] == "0" and view(browser, "parallel")["lines"] == "4"
        set_filter(browser, "")
        wait_for(browser, lambda: view(browser, "scatter").get("points") == str(N_RUNS))
        first = snapshot["runs"][0]["id"]
        browser.execute_script(
            "document.querySelector('#runs tr[data-id=\"' + arguments[0] + '\"] input').click()", first
        )
        wait_for(browser, lambda: view(browser, "scatter").get("points") == str(N_RUNS - 1))
        assert first not in {p["id"] for p in drawn_points(browser)}
        assert errors_logged(browser) == []


def test_best_and_a_categorical_setting(browser, sweep):  # noqa: F811
    snapshot = data.Board([sweep]).snapshot()
    with serving(data.Board([sweep])) as httpd:
        open_page(
            browser,
            httpd.url + "?runs=all&metric=eval_loss&hp_metric=eval_accuracy&hp_value=best&hp_x=model.scale",
            N_RUNS,
        )
        wait_for(browser, lambda: view(browser, "scatter").get("points") == str(N_RUNS))
        shown = view(browser, "scatter")
        assert shown["xkind"] == "categorical" and json.loads(shown["categories"]) == ["none", "sqrt"]
        assert shown["crosses"] == "0"  # a diverged run's best value is finite
        points = drawn_points(browser)
        assert {p["id"]: p["value"] for p in points} == {
            run["id"]: run["best_eval_accuracy"] for run in snapshot["runs"]
        }
        scale = {run["id"]: run["settings"]["model.scale"] for run in snapshot["runs"]}
        columns = {value: {p["px"] for p in points if scale[p["id"]] == value} for value in ("none", "sqrt")}
        assert all(len(xs) == 1 for xs in columns.values())  # a category is one column of points
        assert min(columns["none"]) < min(columns["sqrt"])  # in natural order
        assert errors_logged(browser) == []


def test_parallel_coordinates_have_an_axis_per_differing_setting_and_the_metric_last(browser, sweep):  # noqa: F811
    with serving(data.Board([sweep])) as httpd:
        open_page(browser, httpd.url + "?runs=all&metric=eval_loss", N_RUNS)
        wait_for(browser, lambda: view(browser, "parallel").get("lines") == str(N_RUNS))
        shown = view(browser, "parallel")
        assert json.loads(shown["keys"]) == ["model.d_k", "model.scale", "optim.lr", "seed", "eval_loss"]
        assert shown["axes"] == "5" and shown["crosses"] == "1"
        lines = browser.execute_script("return AttnBoard.page.hp.parallel.map(l => l.points.length)")
        assert lines == [5] * N_RUNS
        set_filter(browser, "scale=sqrt")  # d_k and scale no longer differ among the runs drawn
        wait_for(browser, lambda: view(browser, "parallel").get("lines") == "4")
        assert json.loads(view(browser, "parallel")["keys"]) == ["optim.lr", "seed", "eval_loss"]
        assert view(browser, "parallel")["axes"] == "3"
        assert errors_logged(browser) == []


def test_hover_names_the_run_and_its_values(browser, sweep):  # noqa: F811
    board = data.Board([sweep])
    diverged = next(run["id"] for run in board.snapshot()["runs"] if run["name"] == "diverged")
    with serving(board) as httpd:
        open_page(browser, httpd.url + "?runs=all&metric=eval_loss&hp_x=optim.lr", N_RUNS)
        # the curves drawn too (their records fetched), so the page above the views no longer grows
        wait_for(
            browser,
            lambda: (
                chart(browser).get("series") == str(N_RUNS) and view(browser, "scatter").get("points") == str(N_RUNS)
            ),
        )
        [crossed] = [p for p in drawn_points(browser) if p["crossed"]]
        tip = hover(browser, "scatter", crossed["px"], crossed["py"])
        wait_for(browser, lambda: view(browser, "scatter").get("hover") == diverged)
        lines = browser.execute_script(
            "return [...document.querySelector('#hp-scatter .hp-tip').children].map(e => e.textContent)"
        )
        assert lines[0].startswith("diverged") and "lr=1" in lines and tip == "".join(lines)
        assert (
            "step 5" in lines[-1] and f"{EXPLODING[-1]:.2g} at step 4" in lines[-1]
        )  # where it ended, its last finite value
        end = browser.execute_script(
            "const l = AttnBoard.page.hp.parallel.find(l => l.points.some(p => p.crossed));"
            "return [l.points[l.points.length - 1].x, l.points[l.points.length - 1].y]"
        )
        tip = hover(browser, "parallel", *end)
        wait_for(browser, lambda: view(browser, "parallel").get("hover") == diverged)
        lines = browser.execute_script(
            "return [...document.querySelector('#hp-parallel .hp-tip').children].map(e => e.textContent)"
        )
        assert lines[0].startswith("diverged") and {"d_k=1024", "scale=none", "lr=1", "seed=0"} <= set(lines)
        assert errors_logged(browser) == []


def test_a_value_has_one_colour_in_the_curves_and_the_hyperparameter_views(browser, sweep):  # noqa: F811
    curve_colours = (
        "return Object.fromEntries(AttnBoard.page.panels()[0].built.series.slice(1)"
        ".filter(s => !s.class).map(s => [s.label.split(' ')[0], s.stroke]))"
    )
    legend_colours = (
        "return Object.fromEntries([...document.querySelectorAll('#hp-legend li')]"
        ".map(li => [li.dataset.value, li.dataset.color]))"
    )
    with serving(data.Board([sweep])) as httpd:
        open_page(browser, httpd.url + "?metric=eval_loss&group_by=model.scale&color_by=model.scale", N_RUNS)
        wait_for(
            browser,
            lambda: chart(browser).get("series") == "2" and view(browser, "scatter").get("points") == str(N_RUNS),
        )
        curves = browser.execute_script(curve_colours)
        legend = browser.execute_script(legend_colours)
        # from the sorted values (none, sqrt), not the order drawn
        assert curves == {"scale=none": PALETTE[0], "scale=sqrt": PALETTE[1]}
        assert legend == {"none": PALETTE[0], "sqrt": PALETTE[1]}
        colours = browser.execute_script(
            "const hp = AttnBoard.page.hp;"
            "return hp.parallel.map(l => [hp.rows[l.row].run.settings['model.scale'], l.style.color])"
        )
        assert {scale: colour for scale, colour in colours} == legend
        assert {p["color"] for p in drawn_points(browser) if p["name"].startswith("sqrt")} == {PALETTE[1]}
        # filtered to one value, it keeps its colour (draw order would make it the first)
        set_filter(browser, "scale=sqrt")
        wait_for(browser, lambda: chart(browser).get("series") == "1" and view(browser, "scatter").get("points") == "4")
        assert browser.execute_script(curve_colours) == {"scale=sqrt": PALETTE[1]}
        assert browser.execute_script(legend_colours) == {"sqrt": PALETTE[1]}
        assert errors_logged(browser) == []


def test_the_url_keeps_the_hyperparameter_view_through_a_reload(browser, sweep):  # noqa: F811
    snapshot = data.Board([sweep]).snapshot()
    with serving(data.Board([sweep])) as httpd:
        open_page(browser, httpd.url + "?runs=all&poll=5", N_RUNS)
        wait_for(browser, lambda: view(browser, "scatter").get("points") == str(N_RUNS))
        choose(browser, hp_metric="eval_accuracy", hp_value="best", hp_x="optim.lr", color_by="optim.lr")
        wait_for(browser, lambda: "color_by=optim.lr" in browser.current_url)
        url = browser.current_url
        assert "hp_metric=eval_accuracy" in url and "hp_value=best" in url and "hp_x=optim.lr" in url
        browser.refresh()
        wait_for(browser, lambda: view(browser, "scatter").get("points") == str(N_RUNS))
        controls = browser.execute_script(
            "return ['hp-metric', 'hp-value', 'hp-x', 'color-by'].map(id => document.getElementById(id).value)"
        )
        assert controls == ["eval_accuracy", "best", "optim.lr", "optim.lr"]
        assert view(browser, "scatter")["x"] == "optim.lr"
        assert sorted(
            browser.execute_script(
                "return [...document.querySelectorAll('#hp-legend li')].map(li => li.dataset.value)"
            ),
            key=float,
        ) == ["0.01", "0.1", "1"]
        assert {p["id"]: p["value"] for p in drawn_points(browser)} == {
            run["id"]: run["best_eval_accuracy"] for run in snapshot["runs"]
        }
        assert errors_logged(browser) == []


def test_the_metric_axis_cuts_only_a_tail_above_the_bulk_unless_every_value_is_asked(browser, sweep):  # noqa: F811
    values = [0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 4.4e20]
    with serving(data.Board([sweep])) as httpd:
        open_page(browser, httpd.url, N_RUNS)
        placed = browser.execute_script(
            "return [false, true].map(all => { const axis = AttnBoard.views.metricAxis('m', arguments[0], true, all);"
            " return arguments[0].map(v => axis.at(v)); })",
            values,
        )
    bulk, every = placed
    assert [p["clamped"] for p in bulk] == [False] * 8 + [True]  # the 4e20 tail held to the top edge, nothing cut below
    assert bulk[-1]["f"] == 1 and 0 < bulk[0]["f"] < bulk[1]["f"]
    assert not any(p["clamped"] for p in every) and every[-1]["f"] < 1


def test_the_static_export_draws_the_hyperparameter_views(browser, sweep, tmp_path):  # noqa: F811
    from attn.board import export

    page = export.export(data.Board([sweep]), tmp_path / "page")
    open_page(browser, page.as_uri() + "?runs=all&hp_x=optim.lr&color_by=model.scale", N_RUNS)
    wait_for(browser, lambda: view(browser, "scatter").get("points") == str(N_RUNS))
    assert view(browser, "scatter")["crosses"] == "1" and view(browser, "parallel")["axes"] == "5"
    assert len(browser.execute_script("return [...document.querySelectorAll('#hp-legend li')]")) == 2
    assert errors_logged(browser) == []


def test_a_view_the_url_asks_for_is_kept_until_the_runs_that_offer_it_arrive(browser, tmp_path):  # noqa: F811
    """One run: no setting differs, so optim.lr is not yet a choice; the URL keeps it, and the controls take it
    when a second run with another rate arrives."""
    root = tmp_path / "runs"
    write_run(root / "first", "optim.lr=0.01")
    with serving(data.Board([root])) as httpd:
        open_page(browser, httpd.url + "?runs=all&poll=1&hp_x=optim.lr&color_by=optim.lr", 1)
        assert "hp_x=optim.lr" in browser.current_url and "color_by=optim.lr" in browser.current_url
        write_run(root / "second", "optim.lr=0.1")
        wait_for(browser, lambda: browser.execute_script("return AttnBoard.page.state.data.runs.length") == 2)
        wait_for(
            browser,
            lambda: (
                browser.execute_script("return ['hp-x', 'color-by'].map(id => document.getElementById(id).value)")
                == ["optim.lr", "optim.lr"]
            ),
        )
        assert "hp_x=optim.lr" in browser.current_url and "color_by=optim.lr" in browser.current_url
        assert errors_logged(browser) == []

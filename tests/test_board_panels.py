"""The board's grid of panels (issue 22 item 3) and a run's page (item 5), in headless Chromium
(the browser and its helpers from tests/test_board.py): panels=METRIC,METRIC in the URL draws a
card per metric from the same curves as the main chart, the add control appends one and a reload
keeps them."""

import pytest
from board_runs import write_run
from helpers import PNG_SIGNATURE
from test_board import chart, click, errors_logged, open_page, serving, wait_for  # noqa: F401

from attn.board import data


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("board-panels") / "runs"
    write_run(root / "a", "seed=0")
    write_run(root / "b", "seed=1", "model.d_k=256", "model.scale=none")
    return root


def panels(driver) -> list[dict]:
    return driver.execute_script(
        "return [...document.querySelectorAll('#panels .panel-card')].map(card => ({"
        " title: card.querySelector('.panel-title').textContent,"
        " ...card.querySelector('.panel-plot').dataset,"
        " canvases: card.querySelectorAll('canvas').length}))"
    )


def test_panels_in_the_url_are_drawn_added_and_kept_on_reload(browser, two_runs):  # noqa: F811
    with serving(data.Board([two_runs])) as httpd:
        open_page(browser, httpd.url + "?runs=all&metric=eval_loss&panels=eval_loss,eval_accuracy&smooth=0.5", 2)
        wait_for(browser, lambda: [p.get("series") for p in panels(browser)] == ["2", "2"])
        shown = panels(browser)
        assert [p["title"] for p in shown] == ["eval_loss", "eval_accuracy"]
        assert [p["metric"] for p in shown] == ["eval_loss", "eval_accuracy"]
        assert all(p["canvases"] >= 1 for p in shown)
        # the same curves as the main chart: a panel of the main chart's metric draws the same points
        assert shown[0]["points"] == chart(browser)["points"] and shown[0]["ylow"] == chart(browser)["ylow"]
        click(browser, "#add-panel")
        wait_for(browser, lambda: len(panels(browser)) == 3 and panels(browser)[2].get("series") == "2")
        third = panels(browser)[2]["title"]
        assert third not in ("eval_loss", "eval_accuracy")
        assert f"panels=eval_loss%2Ceval_accuracy%2C{third.replace('/', '%2F')}" in browser.current_url
        browser.refresh()
        wait_for(browser, lambda: [p.get("series") for p in panels(browser)] == ["2", "2", "2"])
        assert [p["title"] for p in panels(browser)] == ["eval_loss", "eval_accuracy", third]
        # removed: gone from the page and from the URL
        browser.execute_script("document.querySelectorAll('#panels .panel-remove')[1].click()")
        wait_for(browser, lambda: [p["title"] for p in panels(browser)] == ["eval_loss", third])
        assert "eval_accuracy" not in browser.current_url
        assert errors_logged(browser) == []


def test_a_runs_page_shows_its_config_a_diff_its_files_and_a_csv_of_a_panel(browser, two_runs):  # noqa: F811
    from attn.analysis import grouping
    from attn.store import runs

    board = data.Board([two_runs])
    ids = {run["name"]: run["id"] for run in board.snapshot()["runs"]}
    with serving(board) as httpd:
        open_page(browser, httpd.url + f"?runs={ids['b']}&metric=eval_loss&panels=eval_accuracy", 2)
        wait_for(browser, lambda: chart(browser)["series"] == "1")
        browser.execute_script(
            "document.querySelector('#runs tr[data-id=\"' + arguments[0] + '\"] .run-link').click()", ids["a"]
        )
        wait_for(
            browser,
            lambda: browser.execute_script("return document.querySelectorAll('#run-config tbody tr').length") > 0,
        )
        config = grouping.flatten_config(runs.read_config_dict(two_runs / "a"))
        shown = browser.execute_script(
            "return Object.fromEntries([...document.querySelectorAll('#run-config tbody tr')]"
            ".map(tr => [tr.dataset.key, tr.cells[1].textContent]))"
        )
        assert set(shown) == set(config) and shown["seed"] == "0"
        # the diff against the ticked run b: exactly the keys whose values differ, side by side
        other = grouping.flatten_config(runs.read_config_dict(two_runs / "b"))
        differing = {k for k in config.keys() | other.keys() if config.get(k) != other.get(k)}
        assert {"seed", "model.d_k", "model.scale"} <= differing
        wait_for(
            browser,
            lambda: browser.execute_script("return document.querySelectorAll('#diff-table tbody tr').length") > 0,
        )
        rows = browser.execute_script(
            "return [...document.querySelectorAll('#diff-table tbody tr')]"
            ".map(tr => [...tr.cells].map(c => c.textContent))"
        )
        assert {row[0] for row in rows} == differing
        assert ["model.d_k", str(config["model.d_k"]), "256"] in rows
        # a link to its metrics.jsonl, fetched through /files/
        href = browser.execute_script("return document.querySelector('#run-files a[data-name=\"metrics.jsonl\"]').href")
        assert href.startswith(httpd.url) and href.endswith("/a/metrics.jsonl")
        status, body = browser.execute_async_script(
            "const done = arguments[1]; fetch(arguments[0]).then(async r => done([r.status, await r.text()]))", href
        )
        assert status == 200 and body == (two_runs / "a" / "metrics.jsonl").read_text()
        # the CSV of a panel: a header, a row per point drawn, from a Blob URL
        for selector, holder in (("#chart-csv", "#chart"), ("#panels .csv-link", "#panels .panel-plot")):
            click(browser, selector)
            text = browser.execute_async_script(
                "const done = arguments[1], a = document.querySelector(arguments[0]);"
                "a.href.startsWith('blob:') ? AttnBoard.page.state.lastDownload.text().then(done) : done(a.href)",
                selector,
            )
            points = browser.execute_script("return document.querySelector(arguments[0]).dataset.points", holder)
            lines = text.strip().split("\n")
            assert lines[0].startswith("curve,step,") and len(lines) - 1 == int(points) > 0, (selector, lines[:3])
        # and the chart as PNG
        for selector in ("#chart-png", "#panels .png-link"):
            click(browser, selector)
            head = browser.execute_async_script(
                "const done = arguments[0], blob = AttnBoard.page.state.lastDownload;"
                "blob.arrayBuffer().then(b => done([blob.type, blob.size, [...new Uint8Array(b.slice(0, 8))]]))"
            )
            assert head[0] == "image/png" and head[1] > 1000 and bytes(head[2]) == PNG_SIGNATURE, head
        assert errors_logged(browser) == []


def test_the_static_export_holds_each_runs_page(browser, two_runs, tmp_path):  # noqa: F811
    from attn.board import export

    page = export.export(data.Board([two_runs]), tmp_path / "page")
    open_page(browser, page.as_uri() + "?runs=all&open=0/a", 2)
    wait_for(
        browser, lambda: browser.execute_script("return document.querySelectorAll('#run-config tbody tr').length") > 0
    )
    href = browser.execute_script("return document.querySelector('#run-files a[data-name=\"metrics.jsonl\"]').href")
    assert href.startswith("file://") and (tmp_path / "page" / "files" / "0" / "a" / "metrics.jsonl").is_file()
    assert browser.execute_script("return document.querySelectorAll('#diff-table tbody tr').length") > 0
    assert errors_logged(browser) == []


def test_the_url_keeps_the_view_through_a_reload(browser, two_runs):  # noqa: F811
    from test_board import set_filter

    board = data.Board([two_runs])
    ids = {run["name"]: run["id"] for run in board.snapshot()["runs"]}
    with serving(board) as httpd:
        open_page(browser, httpd.url + "?poll=5", 2)
        click(browser, f'#runs tr[data-id="{ids["a"]}"] input')
        click(browser, f'#runs tr[data-id="{ids["b"]}"] input')
        wait_for(browser, lambda: chart(browser)["series"] == "2")
        set_filter(browser, "seed=1")
        wait_for(browser, lambda: chart(browser)["series"] == "1")
        browser.execute_script(
            "const s = document.getElementById('smoothing'); s.value = '0.6';"
            "s.dispatchEvent(new Event('input'));"
            "const m = document.getElementById('metric'); m.value = 'eval_accuracy';"
            "m.dispatchEvent(new Event('change'));"
        )
        click(browser, "#add-panel")
        wait_for(browser, lambda: chart(browser).get("metric") == "eval_accuracy" and "panels=" in browser.current_url)
        url = browser.current_url
        assert "poll=5" in url and "smooth=0.6" in url and "filter=seed%3D1" in url and "metric=eval_accuracy" in url
        browser.refresh()
        wait_for(
            browser, lambda: chart(browser).get("series") == "1" and chart(browser).get("metric") == "eval_accuracy"
        )
        view = browser.execute_script(
            "return [document.getElementById('filter').value, document.getElementById('smoothing').value,"
            " [...AttnBoard.page.state.selectedRuns].sort(), document.querySelectorAll('#panels .panel-card').length]"
        )
        assert view == ["seed=1", "0.6", sorted(ids.values()), 1]
        assert errors_logged(browser) == []


def test_a_runs_page_is_get_only_and_names_an_unknown_run(two_runs):
    import json
    import urllib.error
    import urllib.request

    board = data.Board([two_runs])
    page = board.run_page("0/a")
    assert [f["name"] for f in page["files"]][:3] == ["config.yaml", "metrics.jsonl", "summary.json"]
    assert page["config"]["seed"] == 0 and page["checkpoints"] == []
    with serving(board) as httpd:
        with urllib.request.urlopen(httpd.url + "api/run?run=0%2Fb") as answer:
            assert json.load(answer)["config"]["model.d_k"] == 256
        for request in (
            urllib.request.Request(httpd.url + "api/run?run=0%2Fnope"),
            urllib.request.Request(
                httpd.url + "api/run?run=0%2Fa",
                data=b"{}",
                method="POST",
                headers={"Content-Type": "application/json", "X-Attn-Board": "1"},
            ),
        ):
            try:
                urllib.request.urlopen(request)
            except urllib.error.HTTPError as err:
                assert err.code in (403, 404), err.code
                assert "nope" in json.load(err)["error"] or request.get_method() == "POST"
            else:
                raise AssertionError(f"{request.get_method()} {request.full_url} answered")

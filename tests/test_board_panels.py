"""The board's grid of panels (issue 22 item 3) and a run's page (item 5), in headless Chromium
(the browser and its helpers from tests/test_board.py): panels=METRIC,METRIC in the URL draws a
card per metric from the same curves as the main chart, the add control appends one and a reload
keeps them."""

import pytest
from board_runs import write_run
from test_board import browser, chart, click, errors_logged, open_page, serving, wait_for  # noqa: F401

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
        " canvases: card.querySelectorAll('canvas').length}))")


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

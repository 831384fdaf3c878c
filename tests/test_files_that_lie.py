"""Files that lie (issue 46.6): an .npy header in an .npz declaring far more than its bytes, a gzip stream
that inflates to gigabytes, a report naming its seeds file by a path out of its directory; each refused in
one line with the right reason before anything is allocated or shown, from every command that reads them,
and from the board."""

import gzip
import hashlib
import io
import json
import shutil
import tracemalloc
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import pytest
from board_runs import serving, write_run
from helpers import TINY, facts_in

from attn import cli
from attn.board import data
from attn.config.loading import load_config
from attn.store import arrayfiles, runs
from attn.train import lifecycle


def lie_about(path: Path, key: str, count: int) -> None:
    """Rewrite the .npz at path so that array `key`'s .npy header declares `count` elements (its bytes kept)."""
    with zipfile.ZipFile(path) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    raw = io.BytesIO(members[key + ".npy"])
    np.lib.format.read_magic(raw)
    _, fortran, dtype = np.lib.format.read_array_header_1_0(raw)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": fortran, "shape": (count,)}
    )
    members[key + ".npy"] = header.getvalue() + raw.read()
    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            archive.writestr(name, content)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished run with checkpoints at steps 4 and 8 and an attention snapshot."""
    root = tmp_path_factory.mktemp("lies")
    config = load_config(
        None, [*TINY, f"runs_dir={root}", "train.steps=8", "logging.checkpoint_every=4", "logging.log_every=2"]
    )
    run_dir = lifecycle.create(config, name="base")
    lifecycle.execute(config, run_dir)
    return run_dir


@pytest.fixture
def run_copy(trained, tmp_path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "runs" / "base"))


def one_line(capsys, *args) -> str:
    code = cli.main([str(a) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("error: "), err
    return err


@pytest.mark.parametrize("count", [10**11, 10**9])
def test_an_array_whose_header_declares_more_than_the_file_can_hold_is_refused_for_that(count, run_copy):
    lie_about(run_copy / "attention.npz", "attn_init", count)
    with pytest.raises(runs.RunError) as info:
        arrayfiles.load_arrays(run_copy / "attention.npz")
    assert facts_in(str(info.value), "attention.npz", "'attn_init'", f"float32[{count}]", f"{4 * count} bytes")
    assert "pickle" not in str(info.value)


def test_an_array_whose_header_declares_other_than_the_bytes_it_holds_is_damaged(run_copy):
    held = arrayfiles.load_arrays(run_copy / "attention.npz")["attn_init"].size
    lie_about(run_copy / "attention.npz", "attn_init", held + 1)
    with pytest.raises(runs.RunError) as info:
        arrayfiles.load_arrays(run_copy / "attention.npz")
    assert facts_in(str(info.value), "'attn_init' is damaged", f"{4 * (held + 1)} bytes", f"but {4 * held} follow")


@pytest.mark.parametrize("count", [10**11, 10**9])
def test_plot_resume_and_fork_refuse_a_lying_array_in_one_line(count, run_copy, capsys):
    for name in ("checkpoint.npz", "checkpoint-8.npz"):  # one file, two names
        if name == "checkpoint.npz":
            lie_about(run_copy / name, "param/W_q", count)
    assert facts_in(one_line(capsys, "train", "--resume", run_copy, "train.steps=12"), "checkpoint.npz", "W_q")
    assert facts_in(one_line(capsys, "train", "--fork", run_copy), "checkpoint.npz", f"float32[{count}]")
    lie_about(run_copy / "attention.npz", "attn_init", count)
    assert facts_in(one_line(capsys, "plot", run_copy), "attention.npz", f"float32[{count}]")
    assert not (run_copy.parent / "base-fork-8").exists()


def test_the_boards_draw_figures_answers_a_lying_array_with_its_one_line(tmp_path):
    run_dir = write_run(tmp_path / "runs" / "r")
    arrayfiles.save_arrays(run_dir / "attention.npz", {"attn_init": np.zeros((1, 2, 2), np.float32)})
    lie_about(run_dir / "attention.npz", "attn_init", 10**11)
    with serving(data.Board([tmp_path / "runs"])) as httpd:
        own = f"http://127.0.0.1:{httpd.server_address[1]}"
        request = urllib.request.Request(
            f"{own}/api/plot?run=0/r",
            data=b"{}",
            method="POST",
            headers={"Content-Type": "application/json", "Origin": own, "X-Attn-Board": "1"},
        )
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(request, timeout=30)
    error = json.loads(answer.value.read())["error"]
    assert answer.value.code == 422 and facts_in(error, "attention.npz", "float32[100000000000]")
    assert "\n" not in error and "MemoryError" not in error


# ---------------------------------------------------------------------------
# A report's seeds file: inflated with its output bounded, named only beside it
# ---------------------------------------------------------------------------
def report_with_seeds(directory: Path, name: str, seeds: bytes) -> None:
    """A report.json naming `name` as its seeds file, with the sha256 of `seeds` (its bytes, wherever they are)."""
    directory.mkdir(parents=True, exist_ok=True)
    named = {"name": name, "sha256": hashlib.sha256(seeds).hexdigest()}
    (directory / runs.REPORT_FILE).write_text(json.dumps({"cells": [{"n": 1}], "seeds_file": named}))


def test_a_seeds_file_that_inflates_past_the_cap_is_refused_as_it_inflates(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "MAX_SEEDS_BYTES", 1 << 20)
    bomb = gzip.compress(b'{"cells": [[' + b" " * (24 << 20) + b"]]}", mtime=0)  # 24 kB that inflate to 24 MB
    (tmp_path / runs.SEEDS_FILE).write_bytes(bomb)
    report_with_seeds(tmp_path, runs.SEEDS_FILE, bomb)
    tracemalloc.start()
    try:
        with pytest.raises(runs.RunError) as info:
            runs.read_report_json(tmp_path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert facts_in(str(info.value), runs.SEEDS_FILE, "inflates to more than 1048576 bytes")
    assert peak < 8 << 20, f"{peak} bytes traced: the stream was inflated whole"


@pytest.mark.parametrize(
    "damage, fact",
    [
        (lambda whole: whole[: len(whole) // 2], "not one whole gzip stream"),
        (lambda whole: whole + whole, "not one whole gzip stream"),
        (lambda whole: b"plain secret text", "not a gzip stream"),
        (lambda whole: gzip.compress(b"[1, 2]"), "do not fit"),
        (lambda whole: gzip.compress(b"\xff not json"), "not JSON"),
    ],
)
def test_a_damaged_seeds_file_is_one_line_showing_none_of_its_bytes(damage, fact, tmp_path):
    runs.write_report_json(tmp_path, {"cells": [{"n": 1, "seeds": [{"seed": 0}]}]})
    seeds = damage((tmp_path / runs.SEEDS_FILE).read_bytes())
    (tmp_path / runs.SEEDS_FILE).write_bytes(seeds)
    report_with_seeds(tmp_path, runs.SEEDS_FILE, seeds)
    with pytest.raises(runs.RunError) as info:
        runs.read_report_json(tmp_path)
    assert facts_in(str(info.value), str(tmp_path / runs.SEEDS_FILE), fact) and "secret" not in str(info.value)


@pytest.mark.parametrize("name", ["../outside/hostname", "/etc/hostname", "..", ".", "", "a/b", 5, None])
def test_a_seeds_file_named_other_than_a_file_beside_its_report_is_refused_unread(name, tmp_path):
    secret = b"SECRET-BYTES of a file outside"
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "hostname").write_bytes(secret)
    report_with_seeds(tmp_path / "report", name, secret)
    with pytest.raises(runs.RunError) as info:
        runs.read_report_json(tmp_path / "report")
    assert facts_in(str(info.value), "seeds_file", runs.SEEDS_FILE) and "SECRET" not in str(info.value)


@pytest.mark.parametrize(
    "content, fact",
    [
        (b'{"cells": [', "not JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[1, 2]", "not a JSON object (got a list)"),
        (b'{"cells": "all"}', "`cells` is a string"),
        (b'{"cells": [], "seeds_file": "seeds.json.gz"}', "`seeds_file`"),
    ],
)
def test_a_malformed_report_is_one_line(content, fact, tmp_path):
    (tmp_path / runs.REPORT_FILE).write_bytes(content)
    with pytest.raises(runs.RunError) as info:
        runs.read_report_json(tmp_path)
    assert facts_in(str(info.value), str(tmp_path / runs.REPORT_FILE), fact)


# ---------------------------------------------------------------------------
# A run's files read as much as the command needs, and named as they are (issue 46.8)
# ---------------------------------------------------------------------------
def test_attn_runs_reads_a_huge_metrics_file_a_line_at_a_time(tmp_path, capsys):
    run_dir = write_run(tmp_path / "runs" / "big")
    line = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    with open(run_dir / "metrics.jsonl", "a") as grown:
        for step in range(line["step"] + 1, line["step"] + 10_001):
            grown.write(json.dumps({**line, "step": step, "eval_loss": 0.125}) + "\n")
    size = (run_dir / "metrics.jsonl").stat().st_size
    assert size > 2 << 20
    tracemalloc.start()
    try:
        assert cli.main(["runs", str(tmp_path / "runs")]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "0.125" in capsys.readouterr().out, "the last record's figures"
    # Held whole, the file's text alone would be its size; read a line at a time, the peak is a fraction of it
    # (about a quarter at this size, a fifth at 8 MB: what grows with the lines is far less than the lines).
    assert peak < size // 2, f"{peak} bytes traced for a file of {size}: the file was held whole"


def test_a_line_longer_than_any_record_is_refused_by_its_number(tmp_path):
    run_dir = write_run(tmp_path / "runs" / "r")
    with open(run_dir / "metrics.jsonl", "a") as grown:
        grown.write('{"step": 9999, "x": "' + "a" * (runs.MAX_METRICS_LINE_BYTES + 10) + '"}\n{"step": 10000}\n')
    number = len((run_dir / "metrics.jsonl").read_text().splitlines()) - 1
    with pytest.raises(runs.RunError) as info:
        runs.last_metrics_record(run_dir)
    assert facts_in(str(info.value), "metrics.jsonl", f"line {number} is longer than")


def test_a_fork_of_a_damaged_source_names_the_sources_file_and_leaves_no_fork(trained, run_copy, capsys):
    lines = (run_copy / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run_copy / "metrics.jsonl").write_text("".join([*lines[:2], "garbage\n", *lines[2:]]))
    line = one_line(capsys, "train", "--fork", f"{run_copy}@4")
    assert facts_in(line, f"{run_copy / 'metrics.jsonl'}: line 3 is not JSON")
    assert [p.name for p in trained.parent.iterdir()] == ["base"], "the fork made and removed"

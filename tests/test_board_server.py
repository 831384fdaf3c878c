"""The board's server against pages and clients that try to drive it (issue 23.7) and at scale
(issue 22.7): raw sockets for pipelining, bodies and idle sockets; headless Chromium for script in
an SVG under a runs directory and for a POST from another origin; the snapshot's ETag and a
huge metrics.jsonl served downsampled."""

import json
import re
import select
import socket
import threading
import time

import pytest
from board_runs import serving, write_run

from attn.board import data, server


def raw(httpd, payload: bytes, timeout: float = 5.0) -> bytes:
    """Everything the server sends back on one connection for `payload`, until it closes or goes quiet."""
    with socket.create_connection(httpd.server_address[:2], timeout=timeout) as sock:
        sock.sendall(payload)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except TimeoutError:
            pass
        return b"".join(chunks)


def statuses(answer: bytes) -> list[int]:
    """The status of each answer on the connection (a JSON body has no newline before the next one)."""
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]


@pytest.fixture
def board(tmp_path) -> data.Board:
    write_run(tmp_path / "runs" / "r", logged_until=40)
    return data.Board([tmp_path / "runs"])


def test_a_request_hidden_in_a_refused_posts_body_is_never_answered(board, tmp_path):
    with serving(board) as httpd:
        host = f"127.0.0.1:{httpd.server_address[1]}"
        inner = (
            f"POST /api/plot?run=0/r HTTP/1.1\r\nHost: {host}\r\nX-Attn-Board: 1\r\nContent-Type: application/json"
            f"\r\nOrigin: http://{host}\r\nContent-Length: 0\r\n\r\n"
        ).encode()
        outer = (
            f"POST /api/plot?run=0/r HTTP/1.1\r\nHost: {host}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(inner)}\r\n\r\n"
        ).encode() + inner
        answer = raw(httpd, outer, timeout=2)
    assert statuses(answer) == [403], answer
    assert not list((tmp_path / "runs" / "r").glob("*.png")), "the hidden request drew the figures"


def test_a_get_with_a_body_has_it_read_and_the_next_request_is_answered_after_it(board):
    with serving(board) as httpd:
        host = f"127.0.0.1:{httpd.server_address[1]}"
        body = b"GET /nope HTTP/1.1\r\n\r\n"
        first = f"GET /api/board HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        second = f"GET /api/board HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
        assert statuses(raw(httpd, first + second)) == [200, 200]


@pytest.mark.parametrize(
    "headers, status",
    [
        ("Transfer-Encoding: chunked\r\n", 411),
        (f"Content-Length: {server.MAX_BODY_BYTES + 1}\r\n", 413),
        ("Content-Length: 5\r\nContent-Length: 6\r\n", 400),
        ("Content-Length: -1\r\n", 400),
    ],
)
def test_bodies_it_cannot_measure_are_refused_and_the_connection_closed(board, headers, status):
    with serving(board) as httpd:
        host = f"127.0.0.1:{httpd.server_address[1]}"
        request = f"POST /api/plot?run=0/r HTTP/1.1\r\nHost: {host}\r\n{headers}\r\n".encode()
        answer = raw(httpd, request + b"0\r\n\r\nGET /api/board HTTP/1.1\r\nHost: " + host.encode() + b"\r\n\r\n")
    assert statuses(answer) == [status] and b"Connection: close" in answer


def post(httpd, headers: dict, body: bytes = b"{}") -> int:
    host = f"127.0.0.1:{httpd.server_address[1]}"
    lines = "".join(f"{k}: {v}\r\n" for k, v in {"Host": host, "Connection": "close", **headers}.items())
    request = f"POST /api/plot?run=0/r HTTP/1.1\r\n{lines}Content-Length: {len(body)}\r\n\r\n".encode() + body
    return statuses(raw(httpd, request, timeout=30))[0]


def test_a_post_needs_json_the_boards_own_origin_and_the_header(board, monkeypatch):
    drawn = []
    monkeypatch.setattr(board, "draw_figures", lambda run_id: drawn.append(run_id) or [])  # matplotlib is slow
    with serving(board) as httpd:
        own = f"http://127.0.0.1:{httpd.server_address[1]}"
        good = {"Content-Type": "application/json", "Origin": own, "X-Attn-Board": "1"}
        refused = [
            {k: v for k, v in good.items() if k != "Content-Type"},
            {**good, "Content-Type": "text/plain"},
            {**good, "Origin": "http://127.0.0.2:8000"},
            {**good, "Origin": "null"},
            {k: v for k, v in good.items() if k != "Origin"},
            {**good, "Sec-Fetch-Site": "cross-site"},
            {**good, "Sec-Fetch-Site": "same-site"},
            {k: v for k, v in good.items() if k != "X-Attn-Board"},
        ]
        assert [post(httpd, headers) for headers in refused] == [403] * len(refused) and not drawn
        assert post(httpd, {**good, "Sec-Fetch-Site": "same-origin"}) == 200
        no_origin = {k: v for k, v in good.items() if k != "Origin"}
        assert post(httpd, {**no_origin, "Sec-Fetch-Site": "same-origin"}) == 200 and drawn == ["0/r"] * 2


def test_every_answer_has_a_strict_policy_and_files_are_sandboxed(board, tmp_path):
    (tmp_path / "runs" / "r" / "x.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg"/>')
    with serving(board) as httpd:
        host = f"127.0.0.1:{httpd.server_address[1]}"
        for path in ("/", "/static/board.js", "/api/board", "/nope", "/api/records?run=0/r"):
            answer = raw(httpd, f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            head = answer.split(b"\r\n\r\n")[0].decode()
            assert f"Content-Security-Policy: {server.PAGE_POLICY}" in head and "nosniff" in head, path
            assert "'unsafe-inline'" not in server.PAGE_POLICY.split("script-src")[1].split(";")[0]
        for name, attachment in (("x.svg", True), ("config.yaml", False)):
            answer = raw(httpd, f"GET /files/0/r/{name} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            head = answer.split(b"\r\n\r\n")[0].decode()
            assert statuses(answer) == [200] and "Content-Security-Policy: sandbox" in head
            assert ("Content-Disposition: attachment" in head) == attachment


def test_a_file_over_the_size_cap_is_refused_and_one_under_it_streamed(board, tmp_path, monkeypatch):
    big = tmp_path / "runs" / "r" / "big.csv"
    big.write_bytes(b"x" * 300_000)
    with serving(board) as httpd:
        host = f"127.0.0.1:{httpd.server_address[1]}"
        ask = f"GET /files/0/r/big.csv HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
        answer = raw(httpd, ask)
        assert statuses(answer) == [200] and answer.endswith(b"x" * 300_000)
        monkeypatch.setattr(data, "MAX_FILE_BYTES", 100_000)
        answer = raw(httpd, ask)
    assert statuses(answer) == [413] and b"at most 100000" in answer


@pytest.mark.parametrize("query", ["since=" + "9" * 4300, "since=9007199254740993", "since=0&last=" + "1" * 40])
def test_huge_numeric_parameters_are_a_400(board, query):
    with serving(board) as httpd:
        host = f"127.0.0.1:{httpd.server_address[1]}"
        answer = raw(
            httpd, f"GET /api/records?run=0/r&{query} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
        )
    assert statuses(answer) == [400] and b"expected an integer from 0 to 2^53" in answer


def test_idle_sockets_are_closed_and_do_not_hold_the_board(board):
    with serving(board, timeout=0.5) as httpd:
        idle = [socket.create_connection(httpd.server_address[:2], timeout=5) for _ in range(3)]
        idle[1].sendall(b"GET /api/board HTTP/1.1\r\n")  # a request begun and never finished
        started = time.monotonic()
        for sock in idle:
            assert sock.recv(1024) == b""  # closed by the server once idle for its timeout
            sock.close()
        assert time.monotonic() - started < 4
        host = f"127.0.0.1:{httpd.server_address[1]}"
        assert statuses(
            raw(httpd, f"GET /api/board HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        ) == [200]


def test_the_listen_backlog_holds_many_clients_at_once(board):
    with serving(board) as httpd:
        assert httpd.request_queue_size >= 128
        host = f"127.0.0.1:{httpd.server_address[1]}"
        results = []

        def poll():
            answer = raw(httpd, f"GET /api/board HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode(), 20)
            results.append(statuses(answer))

        started = time.monotonic()
        threads = [threading.Thread(target=poll) for _ in range(60)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert results.count([200]) == 60 and time.monotonic() - started < 15


# ---------------------------------------------------------------------------
# Scale: the ETag before the snapshot, a huge metrics.jsonl downsampled
# ---------------------------------------------------------------------------
def test_a_poll_that_finds_nothing_new_builds_nothing_and_a_change_is_seen(tmp_path, monkeypatch):
    from board_runs import record

    run_dir = write_run(tmp_path / "runs" / "r", status="running", steps=300, logged_until=40)
    board = data.Board([tmp_path / "runs"])
    etag, content = board.snapshot_json()
    built = []
    monkeypatch.setattr(board, "_build", lambda *a, **k: built.append(1) or data.Board._build(board, *a, **k))
    assert board.snapshot_json() == (etag, content) and not built
    from attn.store import runs

    runs.append_metrics(run_dir, record(50, "sqrt", 0))
    etag2, content2 = board.snapshot_json()
    assert etag2 != etag and built and json.loads(content2)["runs"][0]["step"] == 50


def test_a_huge_metrics_file_is_served_downsampled_with_its_figures_exact(tmp_path, monkeypatch):
    from board_runs import record

    monkeypatch.setattr(data, "MAX_POINTS", 50)
    run_dir = write_run(tmp_path / "runs" / "r", steps=20_000, logged_until=0)
    with open(run_dir / "metrics.jsonl", "a") as out:
        for step in range(1, 1001):
            rec = record(step, "sqrt", 0)
            rec["eval_loss"] = 0.5 if step == 777 else 1.0 + step  # the best one falls between kept records
            out.write(json.dumps(rec) + "\n")
    board = data.Board([tmp_path / "runs"])
    entry = board.snapshot()["runs"][0]
    answer = board.records("0/r")
    steps = [r["step"] for r in answer["records"]]
    assert len(steps) <= 2 * 50 + 1 and steps[0] == 0 and steps[-1] == 1000 and steps == sorted(steps)
    assert answer["downsampled"] and answer["n_logged"] == 1001 and entry["n_records"] == 1001
    assert entry["best_eval_loss"] == 0.5 and entry["step"] == 1000
    assert entry["ends"]["eval_loss"] == {
        "final": 1001.0,
        "step": 1000,
        "best": 0.5,
    }  # the hyperparameter views' values
    # unchanged: the page's incremental ask gets nothing new; a grown file is read on from where it was
    again = board.records("0/r", len(steps), steps[-1])
    assert not again["reset"] and again["records"] == []
    with open(run_dir / "metrics.jsonl", "a") as out:
        out.write(json.dumps(record(1001, "sqrt", 0)) + "\n")
    grown = board.records("0/r", len(steps), steps[-1])
    assert grown["records"][-1]["step"] == 1001 and grown["n_logged"] == 1002


def test_a_rewritten_metrics_file_is_read_again_from_the_start(tmp_path):
    from board_runs import record

    from attn.store import runs

    run_dir = write_run(tmp_path / "runs" / "r", steps=300, logged_until=100)
    board = data.Board([tmp_path / "runs"])
    assert board.records("0/r")["total"] == 11
    runs.truncate_metrics(run_dir, 50)  # as a resume from an earlier checkpoint does
    runs.append_metrics(run_dir, record(50, "sqrt", 0))
    answer = board.records("0/r", 11, 100)
    assert answer["reset"] and [r["step"] for r in answer["records"]] == list(range(0, 51, 10))


def test_a_bad_line_in_a_metrics_file_skips_the_run_with_the_line_named(tmp_path):
    run_dir = write_run(tmp_path / "runs" / "r", logged_until=40)
    with open(run_dir / "metrics.jsonl", "a") as out:
        out.write("not json\n" + json.dumps({"step": 100}) + "\n")
    write_run(tmp_path / "runs" / "ok", logged_until=40)
    snapshot = data.Board([tmp_path / "runs"]).snapshot()
    assert [r["id"] for r in snapshot["runs"]] == ["0/ok"]
    assert any("line 6 is not JSON" in s["reason"] for s in snapshot["skipped"])


# ---------------------------------------------------------------------------
# In a browser: an SVG among the runs, and another origin's page
# ---------------------------------------------------------------------------
SVG = """<svg xmlns="http://www.w3.org/2000/svg"><script>
fetch('/api/board').then(r => r.text()).then(t => { document.title = 'read ' + t.length; })
  .catch(e => { document.title = 'refused'; });
document.title = 'ran';
</script></svg>"""


def test_script_in_an_svg_under_a_runs_directory_never_runs_on_the_boards_origin(browser, tmp_path):
    write_run(tmp_path / "runs" / "r", logged_until=40)
    (tmp_path / "runs" / "r" / "evil.svg").write_text(SVG)
    with serving(data.Board([tmp_path / "runs"])) as httpd:
        browser.get(httpd.url + "files/0/r/evil.svg")  # an attachment: downloaded, not shown
        time.sleep(0.3)
        assert "ran" not in browser.title and "read" not in browser.title
        browser.get(httpd.url)
        ran = browser.execute_script("""
            const frame = document.createElement('iframe'); frame.src = 'files/0/r/evil.svg';
            document.body.append(frame); return new Promise(done => setTimeout(() => {
              let title; try { title = frame.contentDocument && frame.contentDocument.title; }
              catch (e) { title = 'opaque'; } done(String(title)); }, 500));""")
        assert "read" not in ran and "ran" not in ran


def test_another_origins_page_cannot_post_even_hiding_a_request_in_its_body(browser, tmp_path, monkeypatch):
    posts = []
    answer = server._Handler.do_POST
    monkeypatch.setattr(server._Handler, "do_POST", lambda self: posts.append(self.path) or answer(self))
    write_run(tmp_path / "runs" / "r", logged_until=40)
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    (attacker / "index.html").write_text("<!doctype html><title>elsewhere</title>")
    import functools
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(attacker)))
    threading.Thread(target=other.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    with serving(data.Board([tmp_path / "runs"])) as httpd:
        board_host = f"127.0.0.1:{httpd.server_address[1]}"
        hidden = (
            f"POST /api/plot?run=0/r HTTP/1.1\\r\\nHost: {board_host}\\r\\nX-Attn-Board: 1\\r\\n"
            f"Content-Type: application/json\\r\\nOrigin: http://{board_host}\\r\\nContent-Length: 0\\r\\n\\r\\n"
        )
        browser.get(f"http://localhost:{other.server_address[1]}/")  # another origin, with no policy of its own
        browser.execute_script(f"""
            return Promise.all(['{{}}', "{hidden}"].map(body =>
              fetch('http://{board_host}/api/plot?run=0/r', {{method: 'POST', mode: 'no-cors', body,
                    headers: {{'Content-Type': 'text/plain'}}}}).catch(() => null)));""")
        other.shutdown()
        other.server_close()
    assert posts == ["/api/plot?run=0/r"] * 2, "the page's two POSTs reached the board, and nothing hidden in them"
    assert not list((tmp_path / "runs" / "r").glob("*.png")), "another origin's page drew the figures"


def test_a_file_that_grows_while_it_is_sent_sends_the_bytes_its_length_declared(tmp_path):
    """A live metrics.jsonl grows between the stat that sets Content-Length and the copy: exactly that many
    bytes go out, never the start of something the client would read as the next answer."""
    import io

    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"x" * 100)
    status, served, _, _ = server._served_file(path)
    with open(path, "ab") as grown:
        grown.write(b"HTTP/1.1 200 OK\r\n\r\n")
    out = io.BytesIO()
    served.send(out)
    served.handle.close()
    assert status == 200 and served.size == 100 and out.getvalue() == b"x" * 100


def test_a_directory_is_not_served_as_a_file(tmp_path):
    (tmp_path / "sub").mkdir()
    with pytest.raises(data.NotFound):
        server._served_file(tmp_path / "sub")


# ---------------------------------------------------------------------------
# Many slow clients (issue 46.8): a bounded number of handler threads, each request a deadline
# ---------------------------------------------------------------------------
def handler_threads() -> int:
    return sum("process_request_thread" in thread.name for thread in threading.enumerate())


def test_a_flood_of_trickling_connections_holds_a_bounded_number_of_threads_then_the_board_answers(board):
    httpd = server.BoardServer(board, "127.0.0.1", 0, timeout=2.0, max_connections=4)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    before, most = handler_threads(), 0
    clients = []
    try:
        for _ in range(60):  # each sends a byte now and then, never a whole request
            sock = socket.create_connection(httpd.server_address[:2], timeout=5)
            sock.sendall(b"G")
            clients.append(sock)
        for _ in range(5):
            for sock in clients:
                try:
                    sock.sendall(b"E")
                except OSError:
                    pass
            most = max(most, handler_threads() - before)
            time.sleep(0.1)
        assert most <= 4, f"{most} handler threads for 60 slow clients"
        for sock in clients:
            sock.close()
        host = f"127.0.0.1:{httpd.server_address[1]}"
        answer = raw(httpd, f"GET /api/board HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode(), 30)
        assert statuses(answer) == [200]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_request_that_trickles_in_is_cut_off_at_its_deadline(board):
    request = b"GET /api/board HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    with serving(board, timeout=0.5) as httpd:
        sock = socket.create_connection(httpd.server_address[:2], timeout=5)
        started, closed_after = time.monotonic(), None
        for byte in request:  # a byte every 0.05 s, for up to 3 s: never idle for the timeout
            try:
                sock.sendall(bytes([byte]))
                if select.select([sock], [], [], 0.05)[0] and sock.recv(1024) == b"":
                    closed_after = time.monotonic() - started
            except OSError:
                closed_after = time.monotonic() - started
            if closed_after is not None or time.monotonic() - started > 3:
                break
        sock.close()
    assert closed_after is not None and closed_after < 2.5, "closed at its deadline though it never went idle"

"""The board over HTTP, with the standard library's ThreadingHTTPServer.

    GET  /                             the page (static/index.html; it polls /api/board)
    GET  /static/<name>                the page's own files (board.js, board.css, uPlot)
    GET  /api/board                    Board.snapshot(): runs, groups, experiments, columns, metrics;
                                       with an ETag, so an unchanged board is a 304
    GET  /api/records?run=ID&since=N[&last=STEP]
                                       the run's records from index N on (Board.records): the page
                                       holds the first N, the last of them at step STEP
    POST /api/plot?run=ID              draw the run's figures (attn.train.figures.plot_run); the request must
                                       carry the header X-Attn-Board (the page's own requests do)
    GET  /api/run?run=ID               Board.run_page(): a run's resolved config (flattened), its files' links,
                                       its checkpoints
    GET  /files/<root>/<path>          a figure or report under a served root (Board.resolve_file)

Errors are JSON, {"error": "<one line>"}, with status 400 (a bad parameter), 403
(a refused request), 404 (no such run or file), 422 (a run file that is damaged
or lies, named as the CLI names it) or 500 (anything else; the server carries
on). The server never prints.

Safety. It listens on 127.0.0.1 unless --host says otherwise; it serves only
files under the served roots (Board.resolve_file) and the package's static
directory (by name, no path). On a loopback address, a request whose Host
header names another host is refused, so a page elsewhere cannot reach the
board through a DNS name rebound to 127.0.0.1. The one request that writes
(POST /api/plot) needs `Content-Type: application/json`, an Origin naming the
board itself (or `Sec-Fetch-Site: same-origin`) and the X-Attn-Board header:
another site's page can send none of them without a CORS preflight that the
board never answers. Every request body is read (at most MAX_BODY_BYTES;
larger, chunked or unmeasured bodies are refused and the connection closed),
so no second request can hide inside one. Every answer carries a strict
Content-Security-Policy (the page's own scripts and styles only) and
`nosniff`; files under a runs directory are served with `sandbox` (a page
among them runs with no origin), SVG and HTML as attachments, streamed, at
most MAX_FILE_BYTES. The listen backlog is REQUEST_QUEUE_SIZE; a socket idle
for TIMEOUT_SECONDS is closed, and so is one whose request (its line, headers
and body) has not arrived whole TIMEOUT_SECONDS after the board began to wait
for it, however it trickles in; numeric parameters are bounded (400). At most
MAX_CONNECTIONS connections are served at once, each by its own thread: while
all are taken no other is accepted (they wait in the listen backlog), so
thousands of slow clients hold that many threads, not thousands.
"""

from __future__ import annotations

import io
import ipaddress
import mimetypes
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from attn.board import DEFAULT_HOST, DEFAULT_PORT, STATIC_DIR
from attn.board.data import FILES_PREFIX, Board, NotFound, TooLarge, open_file, to_json
from attn.store import runs
from attn.store.locks import RunLocked

WRITE_HEADER = "X-Attn-Board"
REQUEST_QUEUE_SIZE = 128  # listen backlog: many pages polling at once
TIMEOUT_SECONDS = 30.0  # a socket idle this long (mid-request or between requests) is closed
MAX_BODY_BYTES = 64 << 10  # a request body larger than this is refused (the page sends "{}")
MAX_COUNT = 2**53  # the largest since= / last= accepted
MAX_CONNECTIONS = 64  # connections served at once (a page opens a few; many pages poll at once)
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
FILE_POLICY = "sandbox; default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'"
ATTACHMENT_SUFFIXES = (".svg", ".svgz", ".html", ".htm", ".xhtml", ".xml")  # active types: downloaded, never shown
TEXT_SUFFIXES = {".md": "text/plain", ".jsonl": "text/plain", ".yaml": "text/plain", ".csv": "text/plain"}


class _Refused(Exception):
    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class BoardServer(ThreadingHTTPServer):
    """Serves one Board; each connection in its own daemon thread, at most `max_connections` at once."""

    daemon_threads = True
    request_queue_size = REQUEST_QUEUE_SIZE

    def __init__(
        self,
        board: Board,
        host: str,
        port: int,
        timeout: float = TIMEOUT_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
    ):
        self.timeout_seconds = timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        self._closing = threading.Event()
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET  # read by the base class's __init__
        super().__init__((host, port), _Handler)
        self.board = board
        self.static_names = {p.name for p in STATIC_DIR.iterdir() if p.is_file()}
        port = self.server_address[1]
        names = {host, "localhost", "127.0.0.1", "[::1]"}
        self.allowed_hosts = {f"{name}:{port}" for name in names} if is_loopback(host) else None  # None: any

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"

    def handle_error(self, request, client_address):
        """Silent: the handler answers every error itself; what reaches here is a dropped connection."""

    def process_request(self, request, client_address):
        """Serve the connection in its own thread once one of the slots is free; until then accept no
        other (they wait in the listen backlog)."""
        while not self._slots.acquire(timeout=0.25):
            if self._closing.is_set():
                self.shutdown_request(request)
                return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def shutdown(self):
        self._closing.set()  # a loop waiting for a free slot stops waiting
        super().shutdown()


def open_server(
    board: Board, host: str = DEFAULT_HOST, port: int | None = None, default_port: int = DEFAULT_PORT
) -> tuple[BoardServer, int | None]:
    """A server listening on host:port (0: any free port). port None: default_port, or any free
    port if that one is taken; the second value is then the port that was taken, else None.
    OSError when it cannot listen there (an explicit port that is taken, a host not on this machine)."""
    if port is not None:
        return BoardServer(board, host, port), None
    try:
        return BoardServer(board, host, default_port), None
    except OSError:
        return BoardServer(board, host, 0), default_port


class _Handler(BaseHTTPRequestHandler):
    server_version = "attn-board"
    protocol_version = "HTTP/1.1"
    server: BoardServer

    def setup(self):
        self.timeout = self.server.timeout_seconds  # StreamRequestHandler sets it on the socket
        super().setup()
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection))

    def handle_one_request(self):
        self.rfile.raw.deadline = time.monotonic() + self.server.timeout_seconds  # for this request to arrive whole
        super().handle_one_request()

    def log_message(self, format, *args):  # the server never prints
        pass

    def do_GET(self):
        self._answer(self._get)

    def do_HEAD(self):
        self._answer(self._get, body=False)

    def do_POST(self):
        self._answer(self._post)

    # ------------------------------------------------------------------ routing
    def _answer(self, route, body: bool = True) -> None:
        file = None
        try:
            self._read_body()
            self.connection.settimeout(self.server.timeout_seconds)  # the answer's writes: the idle timeout
            host = self.headers.get("Host", "")
            if self.server.allowed_hosts is not None and host not in self.server.allowed_hosts:
                raise _Refused(
                    HTTPStatus.FORBIDDEN,
                    f"Host {host!r}: the board answers only to {', '.join(sorted(self.server.allowed_hosts))}",
                )
            url = urlsplit(self.path)
            status, content, content_type, headers = route(url.path, parse_qs(url.query, keep_blank_values=True))
            if isinstance(content, _File):
                file, content = content, b""
        except _Refused as err:
            status, content, content_type, headers = err.status, _error(err), "application/json", {}
        except NotFound as err:
            status, content, content_type, headers = HTTPStatus.NOT_FOUND, _error(err), "application/json", {}
        except runs.RunError as err:  # a run file that is damaged or lies: its one line, as the CLI says it
            status, content = HTTPStatus.UNPROCESSABLE_ENTITY, _error(err)
            content_type, headers = "application/json", {}
        except Exception as err:  # the server carries on; the page shows the message
            status, content = HTTPStatus.INTERNAL_SERVER_ERROR, _error(f"{type(err).__name__}: {err}")
            content_type, headers = "application/json", {}
        etag = headers.get("ETag")
        if etag and self.headers.get("If-None-Match") == etag:
            status, content = HTTPStatus.NOT_MODIFIED, b""
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(file.size if file else len(content)))
            self.send_header("Cache-Control", "no-cache")
            self.send_header("X-Content-Type-Options", "nosniff")
            if "Content-Security-Policy" not in headers:
                self.send_header("Content-Security-Policy", PAGE_POLICY)
            self.send_header("Referrer-Policy", "no-referrer")
            for name, value in headers.items():
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if body and status != HTTPStatus.NOT_MODIFIED:
                if file:
                    file.send(self.wfile)
                else:
                    self.wfile.write(content)
        except (ConnectionError, TimeoutError):  # the page went away mid-answer
            self.close_connection = True
        finally:
            if file:
                file.handle.close()

    def _read_body(self) -> None:
        """Read the request's body (and drop it), so that none of it is taken for a next request;
        a body it cannot measure or that is too large: refused, and the connection closed."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise _Refused(HTTPStatus.LENGTH_REQUIRED, "Transfer-Encoding: refused; send a Content-Length")
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            return
        text = lengths[0].strip()
        if len(set(lengths)) != 1 or not (text.isascii() and text.isdigit()) or len(text) > 18:
            self.close_connection = True
            raise _Refused(
                HTTPStatus.BAD_REQUEST, f"Content-Length: got {', '.join(lengths)!r}; expected one integer >= 0"
            )
        length = int(text)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise _Refused(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                f"request body of {length} bytes: refused; at most {MAX_BODY_BYTES}",
            )
        while length > 0:
            try:
                chunk = self.rfile.read(min(length, 1 << 16))
            except TimeoutError:
                self.close_connection = True
                raise _Refused(HTTPStatus.REQUEST_TIMEOUT, "request body: not sent in time") from None
            if not chunk:
                self.close_connection = True
                raise _Refused(HTTPStatus.BAD_REQUEST, "request body: shorter than its Content-Length")
            length -= len(chunk)

    def _same_origin(self) -> bool:
        origin, site = self.headers.get("Origin"), self.headers.get("Sec-Fetch-Site")
        if site is not None and site != "same-origin":
            return False
        if origin is None:
            return site == "same-origin"
        host = self.headers.get("Host", "")
        return origin in (f"http://{host}", f"https://{host}") and (
            self.server.allowed_hosts is None or host in self.server.allowed_hosts
        )

    def _get(self, path: str, query: dict):
        if path in ("/", "/index.html"):
            return self._static("index.html")
        if path.startswith("/static/"):
            return self._static(unquote(path.removeprefix("/static/")))
        if path == "/api/board":
            etag, content = self.server.board.snapshot_json()  # unchanged since the last look: nothing built
            return HTTPStatus.OK, content, "application/json", {"ETag": etag}
        if path == "/api/records":
            since, last = _count(query, "since", 0), _count(query, "last", None)
            return _json(self.server.board.records(_required(query, "run"), since, last))
        if path == "/api/run":
            return _json(self.server.board.run_page(_required(query, "run")))
        if path.startswith("/" + FILES_PREFIX):
            file = self.server.board.resolve_file(unquote(path.removeprefix("/" + FILES_PREFIX)))
            return _served_file(file)
        raise NotFound(f"{path}: no such page")

    def _post(self, path: str, query: dict):
        if path != "/api/plot":
            raise NotFound(f"{path}: nothing to post to")
        refusal = None
        if self.headers.get_content_type() != "application/json" or "Content-Type" not in self.headers:
            refusal = "without Content-Type: application/json"
        elif not self._same_origin():
            refusal = "from another origin (Origin and Sec-Fetch-Site must name the board itself)"
        elif not self.headers.get(WRITE_HEADER):
            refusal = f"without the {WRITE_HEADER} header"
        if refusal:
            self.close_connection = True
            raise _Refused(HTTPStatus.FORBIDDEN, f"POST {path}: refused {refusal}")
        try:
            return _json({"figures": self.server.board.draw_figures(_required(query, "run"))})
        except RunLocked as err:  # training, or another writer: the page says who, and can try again later
            raise _Refused(HTTPStatus.CONFLICT, err) from None

    def _static(self, name: str):
        if name not in self.server.static_names:
            raise NotFound(f"static/{name}: no such file of the page")
        file = STATIC_DIR / name
        return HTTPStatus.OK, file.read_bytes(), _content_type(file.suffix), {}


class _DeadlineReader(io.RawIOBase):
    """A connection's reads, each allowed only the time left until `deadline` (time.monotonic()): a request
    that trickles in a byte at a time is cut off then, as a silent one is."""

    def __init__(self, connection: socket.socket):
        self.connection, self.deadline = connection, time.monotonic()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.connection.settimeout(left)
        return self.connection.recv_into(buffer)


class _File:
    """An open file to stream as the answer's body."""

    def __init__(self, handle, size: int):
        self.handle, self.size = handle, size

    def send(self, out) -> None:
        """Exactly the `size` bytes its Content-Length declared, though the file grew since (a live
        metrics.jsonl): a byte more would be read by the client as the start of the next answer."""
        left = self.size
        while left > 0:
            chunk = self.handle.read(min(left, 64 << 10))
            if not chunk:
                break
            out.write(chunk)
            left -= len(chunk)


def _served_file(path) -> tuple:
    """A file under a served root: opened (no symbolic link at the end), at most MAX_FILE_BYTES,
    streamed; sandboxed, and active types as attachments."""
    try:
        handle, size = open_file(path)
    except TooLarge as err:
        raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, str(err)) from None
    headers = {"Content-Security-Policy": FILE_POLICY}
    if path.suffix.lower() in ATTACHMENT_SUFFIXES:
        headers["Content-Disposition"] = "attachment"
    return HTTPStatus.OK, _File(handle, size), _content_type(path.suffix), headers


def _json(payload) -> tuple:
    return HTTPStatus.OK, to_json(payload).encode(), "application/json", {}


def _error(message) -> bytes:
    return to_json({"error": str(message)}).encode()


def _content_type(suffix: str) -> str:
    kind = TEXT_SUFFIXES.get(suffix) or mimetypes.guess_type("file" + suffix)[0] or "application/octet-stream"
    return kind + "; charset=utf-8" if kind.startswith("text/") or kind.endswith(("javascript", "json")) else kind


def _required(query: dict, name: str) -> str:
    values = query.get(name)
    if not values or not values[0]:
        raise _Refused(HTTPStatus.BAD_REQUEST, f"{name}: missing; expected ?{name}=...")
    return values[0]


def _count(query: dict, name: str, default: int | None) -> int | None:
    values = query.get(name)
    if not values:
        return default
    text = values[0]
    if not (text.isascii() and text.isdigit()) or len(text) > 16 or int(text) > MAX_COUNT:
        shown = text if len(text) <= 40 else text[:20] + f"… ({len(text)} characters)"
        raise _Refused(HTTPStatus.BAD_REQUEST, f"{name}: got {shown!r}; expected an integer from 0 to 2^53")
    return int(text)

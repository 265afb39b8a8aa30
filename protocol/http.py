"""HTTP/JSON: one WSGI router, one threaded server and one client call, used by every CES API.

    app = JsonApp(token=None)                       # token: every request must carry it
    app.route("GET", "/jobs/(?P<name>[^/]+)", lambda req, name: {...})
    server = Server(app, "127.0.0.1", 0).start()   # or any WSGI server (Ryu's eventlet one)
    call("GET", server.url + "/jobs/a", timeout=5, token=None)

A handler gets a `Request` and the route's named groups; it returns the response body (any JSON
value) or a (status, body) pair, and raises `ApiError` for a 4xx answer. Errors travel as
`{"error": message, "field": name?}`. The app refuses bodies over `max_body` (413) before
reading them, requests without the bearer token when one is set (401, nothing else runs), and
answers an unexpected exception with a 500 whose details stay in the log. The server drops a
client that sends nothing for `REQUEST_TIMEOUT_S`.

Every CES server that listens beyond loopback requires the deployment's shared secret, read from a
token file (`--token-file`, default $CES_TOKEN_FILE) by `listen_token`; clients send it with `call`.
Beyond loopback a server also speaks TLS (`listen_tls`, `protocol.tls`): mutual, each side's
certificate verified against the lab's CA, and the API's `peers` rule says which certificate may
call what (403 otherwise). Plain HTTP beyond loopback is refused unless the user says --insecure.
"""

from __future__ import annotations

import hmac
import http.client
import ipaddress
import json
import logging
import os
import queue
import re
import select
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import ServerHandler, WSGIRequestHandler, WSGIServer, make_server

from .tls import HANDSHAKE_TIMEOUT_S, Tls, TlsError, load_tls, peer_identity

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024 * 1024
REQUEST_TIMEOUT_S = 30.0
# HTTPS connections are kept for the next request (HTTP/1.1 keep-alive; `call` keeps one per
# thread and server) and closed after this long idle, or at once when another connection waits
# for a serving thread. A full mutual handshake costs ~2 ms of CPU at each end (OpenSSL 3.0,
# ECDSA P-256, the development VM): 200 agents heartbeating every second over new connections
# got their replies in p50 77 ms, p99 829 ms (experiments/bench_load.py --tls --no-keep-alive,
# seed 0); kept, p50 5.1 ms, p99 87 ms, as plain HTTP the same hour (88 ms; docs/lab.md).
KEEPALIVE_IDLE_S = 15.0
KEEP_ALIVE = True  # `call` keeps HTTPS connections (False: one per request; for measuring)
_REASONS = {
    200: "OK",
    201: "Created",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    413: "Payload Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


TOKEN_FILE_ENV = "CES_TOKEN_FILE"


class TokenError(ValueError):
    """No usable shared secret: the file is unreadable, too open or too short, or a server would
    listen beyond loopback without one."""


def read_token(path: str | os.PathLike) -> str:
    """The shared secret in `path` (its first line); a TokenError naming the file otherwise. A file
    others may read is refused: the secret would not be one."""
    try:
        mode = os.stat(path).st_mode
        with open(path, encoding="utf-8") as f:
            token = f.readline().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise TokenError(
            f"token file {path}: cannot read it ({getattr(e, 'strerror', e)})"
        ) from None
    if mode & 0o077:
        raise TokenError(
            f"token file {path}: readable by others (mode {mode & 0o777:o}); chmod 600 it"
        )
    if len(token) < 16:
        raise TokenError(
            f"token file {path}: expected a secret of at least 16 characters on its first line"
        )
    return token


def default_token_file() -> str:
    return os.environ.get(TOKEN_FILE_ENV, "")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def listen_token(host: str, token_file: str = "") -> str | None:
    """The token a server listening on `host` requires: the token file's; none on loopback
    without one; beyond loopback without one, a TokenError (every caller on the network could
    otherwise start containers and rewrite flows)."""
    if token_file:
        return read_token(token_file)
    if not is_loopback(host):
        raise TokenError(
            f"listening on {host} (beyond loopback) needs a shared secret: give "
            f"--token-file FILE or set ${TOKEN_FILE_ENV}"
        )
    return None


def listen_tls(
    host: str, folder: str = "", insecure: bool = False, what: str = "server"
) -> Tls | None:
    """The TLS a server `what` on `host` serves with: the identity in `folder`; none on loopback
    without one; beyond loopback without one, a TlsError — unless `insecure`, then a warning at
    every start: the shared secret and every job would cross the network in clear."""
    if folder:
        return load_tls(folder)
    if is_loopback(host):
        return None
    if not insecure:
        raise TlsError(
            f"{what} would listen on {host} (beyond loopback) in plain HTTP: give --tls DIR "
            f"(an identity made by `python -m lab certs`, or $CES_TLS_DIR), or --insecure"
        )
    log.warning(
        "%s listens on %s in PLAIN HTTP (--insecure): the shared secret and every job cross "
        "the network in clear",
        what,
        host,
    )
    return None


def free_port() -> int:
    """A TCP port free on loopback now, for a server to be started elsewhere (a child process,
    a worker's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ApiError(Exception):
    """An HTTP error answer: raised by handlers (4xx) and by `call` for any error status."""

    def __init__(self, status: int, message: str, field: str = ""):
        super().__init__(f"{field}: {message}" if field else message)
        self.status, self.message, self.field = status, message, field

    def body(self) -> dict[str, str]:
        return {"error": self.message} | ({"field": self.field} if self.field else {})


class Unreachable(ConnectionError):
    """The peer did not answer (connection refused, timeout, DNS)."""


class TlsRefused(Unreachable):
    """The TLS handshake failed: the peer's certificate (or ours, to the peer) was refused."""


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names
    body: bytes
    peer: str | None = None  # the identity of the caller's verified certificate (TLS only)

    def json(self) -> Any:
        """The body as JSON (an empty body is null); a 400 naming the problem otherwise."""
        try:
            return json.loads(self.body or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"request body is not valid JSON: {e}") from None
        except RecursionError:
            raise ApiError(400, "request body is nested too deeply") from None


Handler = Callable[..., Any]


# Who may call what over TLS: (the caller's identity, method, path) -> allowed.
Peers = Callable[[str | None, str, str], bool]


class JsonApp:
    """WSGI app: routes (method, path regex) to handlers; see the module doc. `peers`: over TLS,
    which caller identities may make which requests (403 for the others, before anything runs);
    None lets every certificate of the lab's CA call everything."""

    def __init__(
        self, token: str | None = None, max_body: int = MAX_BODY, peers: Peers | None = None
    ):
        self.routes: list[tuple[str, re.Pattern, Handler]] = []
        self.token, self.max_body, self.peers = token, max_body, peers

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        self.routes.append((method, re.compile(f"^{pattern}/?$"), handler))

    def __call__(self, environ: dict, start_response: Callable) -> list[bytes]:
        method, path = environ.get("REQUEST_METHOD", "GET"), _path(environ)
        try:
            status, body = self._answer(environ, method, path)
        except ApiError as e:
            status, body = e.status, e.body()
        except Exception:  # a bug in a handler: answer, log, keep serving
            log.exception("%s %s failed", method, path)
            status, body = 500, {"error": "internal error (see the server's log)"}
        data = json.dumps(body).encode()
        headers = [
            ("Content-Type", "application/json; charset=utf-8"),
            ("Content-Length", str(len(data))),
        ]
        if status == 401:
            headers.append(("WWW-Authenticate", "Bearer"))
        start_response(f"{status} {_REASONS.get(status, 'Error')}", headers)
        return [data]

    def _answer(self, environ: dict, method: str, path: str) -> tuple[int, Any]:
        peer = environ.get(PEER_KEY)
        tls = environ.get("wsgi.url_scheme") == "https"
        if tls and self.peers is not None and not self.peers(peer, method, path):
            raise ApiError(403, f"the certificate of '{peer}' may not {method} {path}")
        if self.token is not None and not _authorised(environ, self.token):
            raise ApiError(401, "missing or wrong bearer token (Authorization: Bearer TOKEN)")
        handler, groups = self._match(method, path)
        req = Request(
            method, path, _query(environ), _headers(environ), _body(environ, self.max_body), peer
        )
        out = handler(req, **groups)
        return out if isinstance(out, tuple) else (200, out)

    def _match(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        allowed = []
        for m, rx, handler in self.routes:
            found = rx.match(path)
            if found:
                if m == method:
                    return handler, found.groupdict()
                allowed.append(m)
        if allowed:
            raise ApiError(
                405,
                f"method {method} not allowed on {path} (allowed: "
                f"{', '.join(sorted(set(allowed)))})",
            )
        raise ApiError(404, f"no such resource: {path}")


def _path(environ: dict) -> str:
    # PEP 3333: PATH_INFO is the decoded path as latin-1 text; names may be UTF-8.
    raw = environ.get("PATH_INFO", "") or "/"
    return raw.encode("latin-1", "replace").decode("utf-8", "replace")


def _query(environ: dict) -> dict[str, str]:
    return {k: v[-1] for k, v in urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).items()}


def _headers(environ: dict) -> dict[str, str]:
    out = {k[5:].replace("_", "-").lower(): v for k, v in environ.items() if k.startswith("HTTP_")}
    if environ.get("CONTENT_TYPE"):
        out["content-type"] = environ["CONTENT_TYPE"]
    return out


def _authorised(environ: dict, token: str) -> bool:
    given = environ.get("HTTP_AUTHORIZATION", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


def _body(environ: dict, limit: int) -> bytes:
    text = environ.get("CONTENT_LENGTH") or "0"
    try:
        length = int(text)
    except ValueError:
        raise ApiError(400, f"Content-Length is not a number: {text!r}") from None
    if length < 0:
        raise ApiError(400, f"Content-Length is negative: {length}")
    if length > limit:
        raise ApiError(
            413, f"request body of {length} bytes is larger than the limit of {limit} bytes"
        )
    try:
        data = environ["wsgi.input"].read(length) if length else b""
    except (TimeoutError, OSError):
        raise ApiError(408, "the request body did not arrive in time") from None
    if len(data) < length:
        raise ApiError(400, f"request body ended after {len(data)} of {length} bytes")
    return data


class _PooledServer(WSGIServer):
    """A WSGI server whose connections are served by a pool of daemon threads, grown on demand
    up to `max_threads` (then connections wait their turn in a queue). socketserver's
    ThreadingMixIn starts a thread per connection, and `Thread.start` waits until the new thread
    runs: under load (200 agents heartbeating while jobs start, experiments/bench_load.py) the
    accepting thread spent its time waiting for the GIL on each while connections piled up in
    the listen backlog (requests took p99 32 ms from accept to close, the agents saw 256 ms)."""

    allow_reuse_address = True
    # The listen backlog (socketserver's default is 5): a burst of clients beyond it has its SYNs
    # dropped or reset, and each retries after 1 s, 2 s, ... — measured as 1-2 s heartbeat
    # replies with 20 agents and 16 submitting clients (experiments/bench_load.py).
    request_queue_size = 128
    max_threads = 256

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._connections: queue.SimpleQueue = queue.SimpleQueue()
        self._count = threading.Lock()
        self._threads = self._idle = 0
        # A byte here asks one thread that holds an idle kept connection to give it up: a
        # connection waits and every thread is taken (`_QuietHandler._next_request`).
        self.yield_r, self._yield_w = socket.socketpair()
        self.yield_r.setblocking(False)

    def process_request(self, request: Any, client_address: Any) -> None:
        self._connections.put((request, client_address))
        with self._count:
            # `_idle` counts the threads waiting for a connection, each decrementing it as it
            # takes one: a thread that took one queued before it was counted is not idle.
            if self._idle >= self._connections.qsize():  # a waiting thread takes it
                return
            if self._threads >= self.max_threads:
                self._yield_w.send(b"y")
                return
            self._threads += 1
        threading.Thread(
            target=self._serve_connections, daemon=True, name=f"http-{self.server_address[1]}"
        ).start()

    def _serve_connections(self) -> None:
        while True:
            with self._count:
                self._idle += 1
            request, client_address = self._connections.get()
            with self._count:
                self._idle -= 1
            if request is None:
                return
            try:
                if _handshake(request, client_address):
                    self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        self.yield_r.close()
        self._yield_w.close()
        for _ in range(self._threads):
            self._connections.put((None, None))


def _handshake(conn: Any, client_address: Any) -> bool:
    """A TLS connection's handshake, in the serving thread (never the accepting one, which one
    slow or hostile client would stall): whether it succeeded. A refusal — no certificate, one
    of another CA, an expired one, plain HTTP — is one warning line; the connection is closed
    before a byte of a request is read."""
    if not isinstance(conn, ssl.SSLSocket):
        return True
    conn.settimeout(HANDSHAKE_TIMEOUT_S)
    try:
        conn.do_handshake()
        return True
    except (ssl.SSLError, OSError) as e:
        reason = getattr(e, "verify_message", "") or getattr(e, "reason", "") or e
        log.warning("refused a TLS connection from %s: %s", client_address[0], reason)
        return False


class _PooledServer6(_PooledServer):
    address_family = socket.AF_INET6


class _KeepingHandler(ServerHandler):
    """wsgiref's handler, answering in HTTP/1.1 and keeping the connection when `may_keep` (a
    TLS client that asked for it) and the answer is a success: the request's body was read
    then, so the next request starts where this one ended (an error answer may leave a body
    unread; its connection is closed)."""

    may_keep = False
    keep = False
    status: str | None
    headers: Any
    request_handler: Any

    def cleanup_headers(self) -> None:
        super().cleanup_headers()
        self.keep = self.may_keep and str(self.status).startswith("2")
        self.http_version = "1.1" if self.keep else "1.0"
        if not self.keep:
            self.headers["Connection"] = "close"


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # the connection's socket timeout: a silent client is dropped
    # Buffered: wsgiref writes the status line, each default header, the headers and the body
    # separately, and an unbuffered write is a send of its own that gives up and re-takes the
    # GIL. One flush, one send.
    wbufsize = 64 * 1024
    protocol_version = "HTTP/1.1"  # parse_request then honours a client's keep-alive

    def handle(self) -> None:
        """Requests on this connection, while the client keeps it (TLS only: `_KeepingHandler`)
        and it does not sit idle (`_next_request`)."""
        self._handle_one()
        while not self.close_connection and self._next_request():
            self._handle_one()

    def _handle_one(self) -> None:
        self.close_connection = True
        self.raw_requestline = self.rfile.readline(65537)
        if not self.raw_requestline:  # the client closed it
            return
        if len(self.raw_requestline) > 65536:
            self.requestline = self.request_version = self.command = ""
            self.send_error(414)
            return
        if not self.parse_request():
            return
        handler = _KeepingHandler(
            self.rfile,
            self.wfile,  # type: ignore[arg-type]
            self.get_stderr(),
            self.get_environ(),
            multithread=False,
        )
        handler.may_keep = isinstance(self.connection, ssl.SSLSocket) and not self.close_connection
        handler.request_handler = self
        handler.run(self.server.get_app())  # type: ignore[attr-defined]
        self.close_connection = not handler.keep

    def _next_request(self) -> bool:
        """Wait for the client's next request on this connection: whether it came. Gives up
        after `KEEPALIVE_IDLE_S`, or when asked to yield (`_PooledServer.yield_r`: another
        connection waits and every thread is taken; an idle connection must not hold one, and
        its client opens a new one when it needs it). One wait in `select`, no polling: a
        0.25 s poll woke the Master 800 times a second for 200 kept connections (with it, and
        `_idle` miscounted, the heartbeat p99 of bench_load --tls was 181 ms; without, 87)."""
        conn = self.connection
        if isinstance(conn, ssl.SSLSocket) and conn.pending():
            return True
        wake = self.server.yield_r  # type: ignore[attr-defined]
        deadline = time.monotonic() + KEEPALIVE_IDLE_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                readable, _, _ = select.select([conn, wake], [], [], left)
                if conn in readable:
                    return True
                if wake in readable:
                    wake.recv(1)
                    return False  # this one yields
            except BlockingIOError:
                continue  # another idle thread took the request to yield
            except OSError:  # the server is closing
                return False
        return False

    def log_message(self, fmt: str, *args: Any) -> None:  # heartbeats would flood the log
        log.debug("%s " + fmt, self.address_string(), *args)

    def get_environ(self) -> dict:
        env = super().get_environ()
        if isinstance(self.connection, ssl.SSLSocket):
            env["wsgi.url_scheme"], env["HTTPS"] = "https", "on"
            env[PEER_KEY] = peer_identity(self.connection)
        return env


PEER_KEY = "ces.peer"  # the WSGI environ's key for the caller's identity


class Server:
    """A threaded HTTP server for a WSGI app on (host, port); port 0 picks a free one. With
    `tls`, HTTPS: the caller's certificate is required (mutual TLS)."""

    def __init__(
        self, app: Callable, host: str = "127.0.0.1", port: int = 0, tls: Tls | None = None
    ):
        cls = _PooledServer6 if ":" in host else _PooledServer
        self.httpd = make_server(host, port, app, server_class=cls, handler_class=_QuietHandler)
        if tls is not None:  # the handshake is done by the serving thread (`_handshake`)
            self.httpd.socket = tls.server.wrap_socket(
                self.httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self.host, self.port, self.tls = host, self.httpd.server_address[1], tls
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}"

    def start(self) -> Server:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:  # shutdown() waits for a serve loop that must be running
            self.httpd.shutdown()
            self._thread = None
        self.httpd.server_close()


def call(
    method: str,
    url: str,
    body: Any = None,
    timeout: float = 5.0,
    token: str | None = None,
    tls: Tls | None = None,
) -> Any:
    """One JSON request; an https URL with the identity `tls` (its certificate shown to the
    server, the server's checked against the lab's CA and the URL's host). Raises `ApiError` for
    an error answer, `TlsRefused` when the handshake fails, `Unreachable` when there is no
    answer at all."""
    if url.startswith("https:") and tls is None:
        raise TlsRefused(f"{method} {url}: an https URL needs a TLS identity (--tls DIR)")
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if url.startswith("https:") and tls is not None:
        try:
            status, reason, raw = _https(method, url, data, headers, timeout, tls)
        except ssl.SSLError as e:
            raise TlsRefused(f"{method} {url}: TLS refused ({e})") from None
        except (OSError, http.client.HTTPException) as e:
            raise Unreachable(f"{method} {url}: {e or type(e).__name__}") from None
        if status >= 400:
            raise _api_error(status, raw, reason)
    else:
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise _api_error(e.code, e.read(), str(e.reason)) from None
        except (urllib.error.URLError, OSError) as e:
            raise Unreachable(f"{method} {url}: {getattr(e, 'reason', e)}") from None
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        raise ApiError(502, f"{method} {url}: the answer is not JSON") from None


def _api_error(status: int, raw: bytes, reason: str) -> ApiError:
    try:
        doc = json.loads(raw)
        return ApiError(status, str(doc["error"]), str(doc.get("field", "")))
    except (ValueError, KeyError, TypeError):
        return ApiError(status, raw.decode(errors="replace") or reason)


_kept = threading.local()  # this thread's HTTPS connections, by (host, port, identity)
# What a kept connection the server has closed meanwhile (idle) raises on its next use.
_STALE = (http.client.RemoteDisconnected, ConnectionError, ssl.SSLEOFError, ssl.SSLZeroReturnError)


def _https(
    method: str, url: str, data: bytes | None, headers: dict[str, str], timeout: float, tls: Tls
) -> tuple[int, str, bytes]:
    """(status, reason, body) of one request over HTTPS, on this thread's kept connection to
    the server if there is one (`KEEP_ALIVE`). A kept connection the server closed while idle
    is found so on use: the request goes again on a new one (the server closes only idle
    connections, never one whose request it has begun to read)."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    conns: dict = _kept.__dict__.setdefault("conns", {})
    key = (host, port, id(tls.client))
    headers = headers if KEEP_ALIVE else {**headers, "Connection": "close"}
    while True:
        conn = conns.pop(key, None) if KEEP_ALIVE else None
        reused = conn is not None
        if conn is None:
            conn = http.client.HTTPSConnection(host, port, timeout=timeout, context=tls.client)
        elif conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except _STALE:
            conn.close()
            if reused:
                continue
            raise
        except BaseException:
            conn.close()
            raise
        if KEEP_ALIVE and not resp.will_close:
            conns[key] = conn
        else:
            conn.close()
        return resp.status, resp.reason, raw

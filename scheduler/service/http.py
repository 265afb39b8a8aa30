"""HTTP/JSON plumbing shared by the Master and the edge agents.

A small router over WebOb, a threaded wsgiref server and one client call. Both directions of the
Master <-> agent protocol are plain HTTP/JSON, so an agent on a real host needs nothing more than
a reachable address.
"""
from __future__ import annotations

import json
import logging
import re
import threading
import urllib.error
import urllib.request
from socketserver import ThreadingMixIn
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from webob import Request, Response

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An HTTP error with a JSON body {"error": message}; raised by handlers and by `call`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class Unreachable(ConnectionError):
    """The peer did not answer (connection refused, timeout, DNS)."""


Handler = Callable[..., Any]


class JsonApp:
    """WSGI app: routes (method, path regex) to handlers `handler(req, **groups) -> JSON value`.

    A handler returns the response body (any JSON value) or a (status, body) pair, and raises
    `ApiError` for a 4xx answer. Anything else it raises becomes a 500 with the message.
    """

    def __init__(self) -> None:
        self.routes: list[tuple[str, re.Pattern, Handler]] = []

    def route(self, method: str, pattern: str, handler: Handler) -> None:
        self.routes.append((method, re.compile(f"^{pattern}$"), handler))

    def __call__(self, environ: dict, start_response: Callable) -> Any:
        req = Request(environ)
        try:
            status, body = self._dispatch(req)
        except ApiError as e:
            status, body = e.status, {"error": e.message}
        except Exception as e:  # a bug in a handler: answer, log, keep serving
            log.exception("%s %s failed", req.method, req.path_info)
            status, body = 500, {"error": f"{type(e).__name__}: {e}"}
        resp = Response(status=status, content_type="application/json", charset="utf-8")
        resp.text = json.dumps(body)
        return resp(environ, start_response)

    def _dispatch(self, req: Request) -> tuple[int, Any]:
        path_matched = False
        for method, rx, handler in self.routes:
            m = rx.match(req.path_info)
            if not m:
                continue
            path_matched = True
            if method != req.method:
                continue
            out = handler(req, **m.groupdict())
            return out if isinstance(out, tuple) else (200, out)
        if path_matched:
            raise ApiError(405, f"method {req.method} not allowed on {req.path_info}")
        raise ApiError(404, f"no such resource: {req.path_info}")


def json_body(req: Request) -> Any:
    """The request's JSON body; a 400 naming the problem when it is not JSON."""
    try:
        return json.loads(req.body or b"null")
    except ValueError as e:
        raise ApiError(400, f"request body is not valid JSON: {e}") from None


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, fmt: str, *args: Any) -> None:  # heartbeats would flood the log
        log.debug("%s " + fmt, self.address_string(), *args)


class Server:
    """A threaded HTTP server for a WSGI app on (host, port); port 0 picks a free one."""

    def __init__(self, app: Callable, host: str = "127.0.0.1", port: int = 0):
        self.httpd = make_server(host, port, app, server_class=_ThreadingServer,
                                 handler_class=_QuietHandler)
        self.host, self.port = host, self.httpd.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Server:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="http",
                                        daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def call(method: str, url: str, body: Any = None, timeout: float = 5.0) -> Any:
    """One JSON request. Raises `ApiError` for an HTTP error answer, `Unreachable` when there is
    no answer at all."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            message = json.loads(raw)["error"]
        except (ValueError, KeyError, TypeError):
            message = raw.decode(errors="replace") or e.reason
        raise ApiError(e.code, message) from None
    except (urllib.error.URLError, OSError) as e:
        raise Unreachable(f"{method} {url}: {getattr(e, 'reason', e)}") from None
    return json.loads(raw) if raw else None

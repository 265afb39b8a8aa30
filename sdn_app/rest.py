"""The REST API of the SDN app (JSON over HTTP, a WSGI application built with WebOb).

    PUT    /jobs/{job}/flows   {"flows": [{"src", "dst", "path", "rate_mbps", "tcp_src"?,
                                           "tcp_dst"?, "name"?}, ...]}  install / replace
    DELETE /jobs/{job}/flows   remove all of the job's flows and meters
    GET    /jobs               jobs and their flow counts
    GET    /jobs/{job}/flows   a job's flows: path, meter, per-hop and meter counters
    GET    /links              measured Mbit/s per direction of every link
    GET    /switches           switches (connected, synchronised), unknown switches, events
    GET    /health             liveness and readiness

Errors are `{"error": "...", "field": "flows[1].path[2]"}` with a 4xx status (5xx when a switch
fails); a refused request changes nothing.
"""
from __future__ import annotations

import json
import logging
import re
from typing import TYPE_CHECKING, Any, Callable

from webob import Request, Response

from .flows import RequestError

if TYPE_CHECKING:
    from .app import CesSdnApp

LOG = logging.getLogger("sdn_app.rest")
MAX_BODY = 16 * 1024 * 1024


class RestApi:
    def __init__(self, app: "CesSdnApp"):
        self.app = app
        job = r"(?P<job>[^/]+)"
        self.routes: list[tuple[re.Pattern, dict[str, Callable[..., Any]]]] = [
            (re.compile(rf"^/jobs/{job}/flows/?$"), {"GET": self.get_job_flows,
                                                     "PUT": self.put_job_flows,
                                                     "DELETE": self.delete_job_flows}),
            (re.compile(r"^/jobs/?$"), {"GET": self.get_jobs}),
            (re.compile(r"^/links/?$"), {"GET": self.get_links}),
            (re.compile(r"^/switches/?$"), {"GET": self.get_switches}),
            (re.compile(r"^/health/?$"), {"GET": self.get_health}),
        ]

    def __call__(self, environ: dict, start_response: Callable) -> Any:
        req = Request(environ)
        try:
            status, body = self.dispatch(req)
        except RequestError as e:
            status, body = e.status, {"error": e.message} | ({"field": e.field} if e.field else {})
        except Exception:  # a bug must not kill the server thread; the client gets a 500
            LOG.exception("%s %s failed", req.method, req.path)
            status, body = 500, {"error": "internal error (see the controller's log)"}
        resp = Response(status=status, content_type="application/json", charset="utf-8",
                        body=json.dumps(body).encode())
        return resp(environ, start_response)

    def dispatch(self, req: Request) -> tuple[int, Any]:
        for pattern, methods in self.routes:
            m = pattern.match(req.path_info)
            if m is None:
                continue
            handler = methods.get(req.method)
            if handler is None:
                raise RequestError(f"method {req.method} not allowed on {req.path_info} "
                                   f"(allowed: {', '.join(sorted(methods))})", status=405)
            return 200, handler(req, **m.groupdict())
        raise RequestError(f"no such resource {req.path_info}", status=404)

    @staticmethod
    def json_body(req: Request) -> Any:
        if req.content_length is not None and req.content_length > MAX_BODY:
            raise RequestError(f"request body larger than {MAX_BODY} bytes", status=413)
        try:
            return json.loads(req.body or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            raise RequestError(f"request body is not valid JSON: {e}") from None

    def put_job_flows(self, req: Request, job: str) -> Any:
        return self.app.put_job(job, self.json_body(req))

    def delete_job_flows(self, req: Request, job: str) -> Any:
        return self.app.delete_job(job)

    def get_job_flows(self, req: Request, job: str) -> Any:
        return self.app.job_view(job)

    def get_jobs(self, req: Request) -> Any:
        return {"jobs": self.app.jobs_view()}

    def get_links(self, req: Request) -> Any:
        return self.app.links_view()

    def get_switches(self, req: Request) -> Any:
        return self.app.switches_view()

    def get_health(self, req: Request) -> Any:
        return self.app.health_view()

"""The REST API of the SDN app (JSON over HTTP, a `protocol.http.JsonApp`).

    PUT    /jobs/{job}/flows   {"flows": [{"src", "dst", "path", "rate_mbps", "tcp_src"?,
                                           "tcp_dst"?, "name"?}, ...]}  install / replace
    DELETE /jobs/{job}/flows   remove all of the job's flows and meters
    GET    /jobs               jobs and their flow counts
    GET    /jobs/{job}/flows   a job's flows: path, meter, per-hop and meter counters
    GET    /links              measured Mbit/s per direction of every link
    GET    /switches           switches (connected, synchronised), unknown switches, events
    GET    /health             liveness and readiness

Errors are `{"error": "...", "field": "flows[1].path[2]"}` with a 4xx status (5xx when a switch
fails); a refused request changes nothing. Over TLS only the control machine's certificate may
call it (403 for any other of the lab's).
"""

from __future__ import annotations

from protocol.http import JsonApp
from protocol.tls import control_only


def rest_api(app, token: str | None = None) -> JsonApp:
    """The routes of a `CesSdnApp` (`app`): handlers call its job changes and views, which raise
    `flows.RequestError` (an `ApiError`) for what they refuse."""
    api = JsonApp(token=token, peers=control_only)
    job = r"/jobs/(?P<job>[^/]+)/flows"
    api.route("GET", job, lambda req, job: app.job_view(job))
    api.route("PUT", job, lambda req, job: app.put_job(job, req.json()))
    api.route("DELETE", job, lambda req, job: app.delete_job(job))
    api.route("GET", "/jobs", lambda req: {"jobs": app.jobs_view()})
    api.route("GET", "/links", lambda req: app.links_view())
    api.route("GET", "/switches", lambda req: app.switches_view())
    api.route("GET", "/health", lambda req: app.health_view())
    return api

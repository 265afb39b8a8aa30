"""The SDN app's launcher refuses bad input with one clear line and exit code 2, and the client
reports an unreachable app as an error, not a traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sdn_app.client import SdnClient, SdnError

REPO = Path(__file__).resolve().parents[2]


def launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sdn_app", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture()
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--topo", "nosuch"], "nosuch: no such topology"),
        (["--rest", "localhost"], "expected HOST:PORT"),
        (["--rest", "127.0.0.1:99999"], "port must be"),
        (["--stats-interval", "0"], "--stats-interval must be > 0"),
        (["--burst-s", "-1"], "--burst-s must be > 0"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, words):
    proc = launch(*args)
    assert proc.returncode == 2
    assert words in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("sdn_app: error:")


def test_a_busy_port_is_a_clear_error(busy_port):
    proc = launch("--rest", f"127.0.0.1:{busy_port}", "--of-port", "0")
    assert proc.returncode == 2
    assert f"--rest: cannot listen on 127.0.0.1:{busy_port}" in proc.stderr


def test_a_bad_state_file_is_a_clear_error(tmp_path):
    state = tmp_path / "state.json"
    state.write_text(
        json.dumps(
            {
                "version": 1,
                "topology": "campus",
                "jobs": [
                    {
                        "job": "j",
                        "seq": 1,
                        "updated": 0,
                        "flows": [
                            {
                                "src": "lab1",
                                "dst": "srv1",
                                "path": ["acc1", "nosuch", "acc4"],
                                "rate_mbps": 5,
                                "flow_no": 1,
                                "meter_id": 1,
                            }
                        ],
                    }
                ],
            }
        )
    )
    proc = launch("--state", str(state), "--of-port", "0", "--rest", "127.0.0.1:0")
    assert proc.returncode == 2
    assert f"{state}: jobs[0]: flows[0].path[1]: unknown switch 'nosuch'" in proc.stderr


def test_client_reports_an_unreachable_app(busy_port):
    with pytest.raises(SdnError) as e:  # a port that accepts nothing HTTP-like in time
        SdnClient(f"http://127.0.0.1:{busy_port}", timeout_s=0.5).health()
    assert e.value.status == 0 and "cannot reach the SDN app" in e.value.message

"""The SDN app's job table: flow numbers, meter ids, conflicts, switch contents, state file."""

from __future__ import annotations

import json

import pytest

from sdn_app.flows import COOKIE_JOB, RequestError, parse_flows
from sdn_app.jobs import JobTable, StateError
from topologies import load_topology


@pytest.fixture()
def table() -> JobTable:
    return JobTable(load_topology("campus"))


def specs(table: JobTable, *flows: dict):
    return parse_flows({"flows": list(flows)}, table.topo)


def f(src="lab1", dst="srv1", path=("acc1", "agg1", "acc4"), rate=20, **kw):
    return {"src": src, "dst": dst, "path": list(path), "rate_mbps": rate} | kw


def test_meter_ids_are_unique_per_switch_and_kept_across_changes(table):
    job = table.propose(
        "a",
        specs(table, f(), f(src="lab2"), f(src="srv1", dst="lab1", path=("acc4", "agg1", "acc1"))),
    )
    assert [x.meter_id for x in job.flows] == [1, 2, 1]  # two on acc1, one on acc4
    table.commit(job)
    # re-route + rate change of flow 1, flow 2 dropped, a new flow added
    again = table.propose(
        "a", specs(table, f(path=("acc1", "agg2", "core1", "agg3", "acc4"), rate=5), f(src="lab3"))
    )
    assert again.flows[0].meter_id == 1 and again.flows[0].flow_no == 1
    # lab2's meter (2) and flow number (2) stay reserved while its entries are being removed
    assert again.flows[1].meter_id == 3 and again.flows[1].flow_no == 4
    assert again.seq == job.seq


def test_a_flow_belongs_to_one_job(table):
    table.commit(table.propose("a", specs(table, f())))
    with pytest.raises(RequestError) as e:
        table.propose("b", specs(table, f(rate=1)))
    assert e.value.status == 409 and "job 'a'" in e.value.message
    table.propose("b", specs(table, f(tcp_dst=5000)))  # a narrower flow is a different flow


def test_meter_limit_is_enforced(table):
    flows = [f(src=s, tcp_dst=p) for s in ("lab1", "lab2") for p in (1, 2)]
    with pytest.raises(RequestError) as e:
        table.propose("a", specs(table, *flows), meter_limit=lambda dpid: 3)
    assert e.value.status == 409 and "no free meter" in e.value.message
    assert table.propose("a", specs(table, *flows[:3]), meter_limit=lambda dpid: 3)


def test_switch_contents_has_defaults_and_every_jobs_entries(table):
    table.commit(table.propose("a", specs(table, f())))
    table.commit(table.propose("b", specs(table, f(src="lab2", rate=7))))
    agg1 = table.topo.switch("agg1").dpid
    rules, meters = table.switch_contents(agg1)
    assert len([r for r in rules if r.cookie >> 48 == COOKIE_JOB >> 48]) == 2
    assert len([r for r in rules if r.cookie >> 48 != COOKIE_JOB >> 48]) == 2 * 10
    assert meters == []  # meters live at each flow's first switch
    rules, meters = table.switch_contents(table.topo.switch("acc1").dpid)
    assert sorted((m.meter_id, m.rate_kbps) for m in meters) == [(1, 20_000), (2, 7_000)]


def test_state_round_trip(table, tmp_path):
    table.commit(table.propose("a", specs(table, f(tcp_dst=29500, name="r0"), f(src="lab2"))))
    table.commit(
        table.propose("b", specs(table, f(src="srv2", dst="lab3", path=("acc4", "agg1", "acc1"))))
    )
    path = tmp_path / "state.json"
    table.save(path)
    other = JobTable(table.topo)
    other.load(path)
    assert other.jobs == table.jobs
    assert other.next_seq == table.next_seq
    assert not list(tmp_path.glob(".state.json.*"))  # no temp file left


def test_loading_a_missing_file_is_an_empty_table(table, tmp_path):
    table.load(tmp_path / "none.json")
    assert table.jobs == {}


@pytest.mark.parametrize(
    "content, words",
    [
        ("{not json", "cannot read"),
        (json.dumps({"version": 99, "jobs": []}), "version"),
        (json.dumps({"version": 1, "topology": "star", "jobs": []}), "topology 'star'"),
        (
            json.dumps(
                {
                    "version": 1,
                    "topology": "campus",
                    "jobs": [
                        {
                            "job": "a",
                            "seq": 1,
                            "updated": 0,
                            "flows": [
                                {
                                    "src": "lab1",
                                    "dst": "srv1",
                                    "path": ["acc1", "acc4"],
                                    "rate_mbps": 1,
                                    "flow_no": 1,
                                    "meter_id": 1,
                                }
                            ],
                        }
                    ],
                }
            ),
            "jobs[0]: flows[0].path[1]: not contiguous",
        ),
        (json.dumps({"version": 1, "topology": "campus", "jobs": [{"job": "a"}]}), "malformed"),
    ],
)
def test_bad_state_files_are_clear_errors(table, tmp_path, content, words):
    path = tmp_path / "state.json"
    path.write_text(content)
    with pytest.raises(StateError) as e:
        table.load(path)
    assert str(path) in str(e.value) and words in str(e.value)

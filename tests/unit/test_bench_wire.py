"""experiments/bench_wire.py: what a sender's counters read against a class's rate, and its
refusals of bad input (before anything is built)."""

import pytest

from experiments import bench_wire
from protocol.dilation import Dilation


def counters(busy_us: int, payload: int, segments: int) -> dict:
    return {"busy_us": busy_us, "bytes_sent": payload, "data_segs_out": segments, "options": 0}


def test_a_sender_at_its_class_rate_reads_one_in_emulated_units():
    # 1 s of host time busy at K = 4 is 0.25 s emulated; 25 Mbit in it is 100 Mbit/s emulated.
    segments = 2000
    payload = 25_000_000 // 8 - 54 * segments  # with each segment's 54 header bytes: 25 Mbit
    ratio = bench_wire.ratio(counters(1_000_000, payload, segments), 100.0, Dilation(4.0))
    assert ratio == pytest.approx(1.0, abs=1e-3)


def test_the_same_counters_read_against_a_larger_grant_read_lower():
    c = counters(1_000_000, 3_000_000, 2000)
    assert bench_wire.ratio(c, 200.0, Dilation(4.0)) == pytest.approx(
        bench_wire.ratio(c, 100.0, Dilation(4.0)) / 2, abs=1e-3
    )


def test_two_nodes_on_one_switch_at_the_given_link_rate_and_delay():
    topo = bench_wire.topology(40.0, 0.5)
    assert [n["name"] for n in topo["nodes"]] == ["na", "nb"]
    assert topo["defaults"] == {"bw_mbps": 40.0, "delay_ms": 0.5} and len(topo["links"]) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["--rate", "300", "--link", "200"],
        ["--rate", "0"],
        ["--cpus", "1.0,2.0"],
        ["--cpus", "x"],
        ["--dilation", "0.5"],
        ["--dilation", "3.5,0.5"],
        ["--pause-ms", "-1"],
        ["--delay-ms", "-1"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, capsys):
    assert bench_wire.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench_wire:") and "\n" not in err


@pytest.mark.parametrize("flag", ["--messages", "--bytes", "--repeats"])
def test_a_count_below_one_is_refused_by_the_parser(flag, capsys):
    with pytest.raises(SystemExit) as e:
        bench_wire.main([flag, "0"])
    assert e.value.code == 2

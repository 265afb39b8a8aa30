"""bench_headroom's cases and its refusals (the measurement itself is experiments/, not a test)."""

from __future__ import annotations

import pytest

from experiments.bench_headroom import cases, main


def test_each_case_fills_its_busiest_link_to_the_load():
    for load in (0.8, 0.95):
        flows = cases(load)
        assert flows["one"] == [("na", "nb", load)]
        # both ways: each direction of the two links carries one flow's grant
        assert sorted((s, d) for s, d, _ in flows["both"]) == [("na", "nb"), ("nb", "na")]
        # two senders into nc share its link; nc's own flow fills the way back
        into_nc = sum(share for _, d, share in flows["merge"] if d == "nc")
        assert into_nc == pytest.approx(load)
        assert [share for s, _, share in flows["merge"] if s == "nc"] == [load]


@pytest.mark.parametrize(
    "argv", [["--loads", "1.2"], ["--loads", "0.9,x"], ["--link", "0"], ["--repeats", "0"]]
)
def test_bad_settings_are_one_line_and_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bench_headroom: "), err

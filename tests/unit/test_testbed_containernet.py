"""The host-side TCP set-up of the emulated nodes (on files standing in for /proc/sys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed import containernet as node


@pytest.fixture
def allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The host's allowed list ("reno bbr", as on the development VM); cubic is available."""
    allowed, available = tmp_path / "allowed", tmp_path / "available"
    allowed.write_text("reno bbr\n")
    available.write_text("reno bbr cubic\n")
    monkeypatch.setattr(node, "_ALLOWED_CC", allowed)
    monkeypatch.setattr(node, "_AVAILABLE_CC", available)
    return allowed


def test_allow_congestion_control_widens_the_list_once(allowed: Path) -> None:
    node.allow_congestion_control("cubic")
    node.allow_congestion_control("cubic")
    node.allow_congestion_control("reno")
    assert allowed.read_text().split() == ["reno", "bbr", "cubic"]


def test_allow_congestion_control_rejects_what_the_kernel_lacks(allowed: Path) -> None:
    with pytest.raises(ValueError, match=r"'vegas' is not in this kernel.*reno bbr cubic"):
        node.allow_congestion_control("vegas")
    assert allowed.read_text().split() == ["reno", "bbr"]

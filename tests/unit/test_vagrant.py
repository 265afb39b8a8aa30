"""The Vagrantfile: valid for Vagrant (Debian's package, `make test` installs it), and its VM gets
every file the README links to."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VAGRANTFILE = (REPO / "Vagrantfile").read_text()


def test_vagrant_validates() -> None:
    if shutil.which("vagrant") is None:
        if os.environ.get("CI"):
            pytest.fail("vagrant is missing: `make test` installs it")
        pytest.skip("vagrant is not installed")
    # No provider (VirtualBox, libvirt) on a CI machine: their blocks are left out, the rest
    # of the configuration is checked.
    done = subprocess.run(
        ["vagrant", "validate", "--ignore-provider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "validated successfully" in done.stdout, (
        done.stdout + done.stderr
    )


def synced_folders() -> dict[Path, list[str]]:
    """{host folder: rsync excludes} of the Vagrantfile's synced folders."""
    folders = {}
    for m in re.finditer(
        r'synced_folder\s+"([^"]+)",\s*"[^"]+"(.*?)(?=\n\s*(?:config|#|end)\b)', VAGRANTFILE, re.S
    ):
        excludes = re.search(r"rsync__exclude:\s*\[([^\]]*)\]", m.group(2))
        folders[(REPO / m.group(1)).resolve()] = (
            re.findall(r'"([^"]+)"', excludes.group(1)) if excludes else []
        )
    return folders


def test_the_vm_gets_what_the_readme_links_to() -> None:
    folders = synced_folders()
    assert REPO in folders, folders
    links = re.findall(r"\]\(([^)#\s]+)", (REPO / "README.md").read_text())
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local, "README links to no file?"
    for link in local:
        target = (REPO / link).resolve()
        home = next((f for f in folders if target.is_relative_to(f)), None)
        assert home is not None, f"README links to {link}, which no synced folder holds"
        relative = target.relative_to(home).as_posix()
        assert not any(relative.startswith(x.rstrip("/")) for x in folders[home]), (
            f"README links to {link}, which the rsync excludes leave out"
        )
        if home == REPO:  # the folders beside the checkout exist only where they are
            assert target.exists(), f"README links to {link}, which does not exist"

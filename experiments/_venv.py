"""Re-exec the calling script under the project's venv when started with another Python.

`sudo python experiments/run.py ...` then works once scripts/setup.sh has made .venv. Import it
first thing in an entry point: `import _venv  # noqa: F401` (experiments/ is on sys.path when a
script in it runs). It also puts the repository root on sys.path for the project's packages.
"""

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENV_PYTHON = REPO / ".venv" / "bin" / "python"

if VENV_PYTHON.exists() and Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
    os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), *sys.argv])
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

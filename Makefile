# The README's commands: `make run` and `make test` (as root; `sudo make ...` from a user account).
# Both set up what is missing first.
PY := .venv/bin/python

.PHONY: setup run test lint unit cleanup ryu figures docs
setup:
	bash scripts/setup.sh

run: setup
	$(PY) experiments/run.py --topo campus

test: setup lint
	bash scripts/test-tools.sh
	$(PY) -m pytest tests

# ruff (lint + format, pyproject.toml's [tool.ruff]) and mypy on the packages it covers
lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy

ryu:
	bash scripts/ryu-env.sh

unit:
	$(PY) -m pytest tests/unit

cleanup:
	$(PY) experiments/run.py --cleanup

# the plots of every committed results file, re-made beside it (git ignores them); nothing is run
figures:
	$(PY) experiments/plots.py --all

# the docs' generated tables re-rendered from results/, then every documented figure checked
docs:
	$(PY) experiments/doc_figures.py --write

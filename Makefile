# The README's two commands: `sudo make run` and `sudo make test`. Both set up what is missing first.
PY := .venv/bin/python

.PHONY: setup run test unit cleanup
setup:
	bash scripts/setup.sh

run: setup
	$(PY) experiments/run.py --topo campus

test: setup
	$(PY) -m pytest tests

unit:
	$(PY) -m pytest tests/unit

cleanup:
	$(PY) experiments/run.py --cleanup

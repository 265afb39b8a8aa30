# The README's two commands: `sudo make run` and `sudo make test`. Both set up what is missing first.
PY := .venv/bin/python

.PHONY: setup run test unit cleanup ryu
setup:
	bash scripts/setup.sh

run: setup
	$(PY) experiments/run.py --topo campus

test: setup
	bash scripts/test-tools.sh
	$(PY) -m pytest tests

ryu:
	bash scripts/ryu-env.sh

unit:
	$(PY) -m pytest tests/unit

cleanup:
	$(PY) experiments/run.py --cleanup

# polygate: `make serve` and `make test` do all set-up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
DATA   ?= .data

.PHONY: serve test lint venv bench clean

MQTT   := plugins/polygate-mqtt

$(STAMP): setup.cfg pyproject.toml $(MQTT)/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel
	$(PIP) install --quiet -e '.[test]'
	$(PIP) install --quiet -e './$(MQTT)[test]'
	touch $(STAMP)

venv: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/gateway serve --data-dir $(DATA)

# import-linter walks the installed tree, so it checks a real build (the
# editable install maps gateway.codecs/gateway.storage without such a tree).
lint: $(STAMP)
	$(VENV)/bin/ruff check gateway codecs storage tests benchmarks plugins
	rm -rf build/lint
	$(PIP) install --quiet --no-deps --no-build-isolation --target build/lint .
	cd build/lint && PYTHONPATH=. ../../$(VENV)/bin/lint-imports --config ../../setup.cfg
	cd build/lint && PYTHONPATH=.:../../$(MQTT) ../../$(VENV)/bin/lint-imports --config ../../$(MQTT)/pyproject.toml

test: $(STAMP) lint
	$(PY) -m pytest -q tests $(MQTT)/tests

bench: $(STAMP)
	$(PY) benchmarks/v1_produce.py
	$(PY) benchmarks/tank_produce_consume.py

clean:
	rm -rf $(VENV) $(DATA) build *.egg-info

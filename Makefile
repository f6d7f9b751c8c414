# polygate: `make serve` and `make test` do all set-up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
DATA   ?= .data

.PHONY: serve test lint venv bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/gateway serve --data-dir $(DATA)

lint: $(STAMP)
	$(VENV)/bin/ruff check gateway codecs storage tests benchmarks
	$(VENV)/bin/lint-imports

test: $(STAMP) lint
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/v1_produce.py

clean:
	rm -rf $(VENV) $(DATA) build *.egg-info

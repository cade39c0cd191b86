# The README's contract: `make lab` and `make test` do all set-up on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: lab test bench demo system-deps clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

system-deps:
	bash scripts/install-system-deps.sh

lab: $(STAMP)
	cd notebooks && IPP_NONINTERACTIVE=1 ../$(VENV)/bin/jupyter lab --no-browser \
		--ServerApp.ip=127.0.0.1

test: $(STAMP) system-deps
	IPP_NONINTERACTIVE=1 $(PY) -m pytest

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) bench-results test-artifacts site

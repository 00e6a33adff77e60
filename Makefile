# GRPO Lens. `make run` and `make test` set up .venv on first use; nothing else to install.
VENV   ?= .venv
PY     := $(VENV)/bin/python
HOST   ?= 127.0.0.1
PORT   ?= 8000
STAMP  := $(VENV)/.installed
TRAINERS := $(VENV)/.trainers

.PHONY: run test lint bench chromium

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: the CPU wheel on this machine's disk, never a newer CUDA build
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The real trainers for the capture tests (tests/test_capture_*.py): the `trainers` extra (TRL and the
# versions it runs with), then verl and the modules it imports with --no-deps (its declared pins
# conflict with that set; the functions called here run with it). The constraints file keeps torch
# where it is: no install may move it.
$(TRAINERS): $(STAMP) requirements/constraints.txt requirements/verl.txt
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e '.[dev,trainers]'
	$(PY) -m pip install --quiet --no-deps -c requirements/constraints.txt -r requirements/verl.txt
	$(PY) -c 'import torch; assert torch.__version__.startswith("2.13.0"), torch.__version__'
	touch $(TRAINERS)

run: $(STAMP)
	$(PY) -m uvicorn app.main:app --host $(HOST) --port $(PORT)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# The numerical tests run twice: under this CPU's best kernel set (AVX2, AVX-512, ...) and under
# the portable default kernels, so a result that depends on the kernel set fails here.
test: $(STAMP) $(TRAINERS) chromium lint
	$(PY) -c 'import torch; print("CPU kernel set:", torch.backends.cpu.get_cpu_capability())'
	$(PY) -m pytest
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -m numerical -p no:cacheprovider

# The browser tests drive Debian's Chromium (Playwright never downloads a browser here).
chromium:
	@test -x /usr/bin/chromium || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

bench: $(STAMP) $(TRAINERS) chromium
	$(PY) bench/core.py
	$(PY) bench/api.py
	$(PY) bench/page.py
	$(PY) bench/capture.py

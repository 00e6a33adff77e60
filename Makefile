# GRPO Lens. `make run` and `make test` set up .venv on first use; nothing else to install.
VENV   ?= .venv
PY     := $(VENV)/bin/python
HOST   ?= 127.0.0.1
PORT   ?= 8000
STAMP  := $(VENV)/.installed

.PHONY: run test lint bench chromium

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first and pinned: the CPU wheel on this machine's disk, never a newer CUDA build
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m uvicorn app.main:app --host $(HOST) --port $(PORT)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

# The numerical tests run twice: under this CPU's best kernel set (AVX2, AVX-512, ...) and under
# the portable default kernels, so a result that depends on the kernel set fails here.
test: $(STAMP) chromium lint
	$(PY) -c 'import torch; print("CPU kernel set:", torch.backends.cpu.get_cpu_capability())'
	$(PY) -m pytest
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -m numerical -p no:cacheprovider

# The browser tests drive Debian's Chromium (Playwright never downloads a browser here).
chromium:
	@test -x /usr/bin/chromium || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

bench: $(STAMP) chromium
	$(PY) bench/core.py
	$(PY) bench/api.py
	$(PY) bench/page.py

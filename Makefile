# GRPO Lens. `make run` and `make test` set up .venv on first use; nothing else to install.
VENV   ?= .venv
PY     := $(VENV)/bin/python
HOST   ?= 127.0.0.1
PORT   ?= 8000
STAMP  := $(VENV)/.installed
TRAINERS := $(VENV)/.trainers

.PHONY: run test lint bench chromium lock docker-test

# Every dependency but torch comes from the hashed locks (the image installs the same requirements.lock).
# torch is pinned apart: its CPU build is a local wheel here and another index elsewhere (see `make lock`).
LOCK     := requirements.lock
DEV_LOCK := requirements-dev.lock
TORCH    ?= torch==2.13.0

$(STAMP): pyproject.toml $(LOCK) $(DEV_LOCK)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --require-hashes -r $(LOCK)
	# the CPU wheel on this machine's disk, never a newer CUDA build; its dependencies came from the lock
	$(PY) -m pip install --quiet --no-deps $(TORCH)
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m pip install --quiet --require-hashes -r $(DEV_LOCK)
	# verl sits beside the trainers with --no-deps (its declared pins conflict on purpose): not a lock problem
	@broken="$$($(PY) -m pip check 2>&1 | grep -v -e '^verl ' -e '^No broken requirements')"; \
	if [ -n "$$broken" ]; then echo "$$broken"; \
		echo "pyproject.toml and the locks disagree: make lock LOCK_UPGRADE= adds what is missing" >&2; exit 1; fi
	touch $(STAMP)

# Refreshes both locks to the newest releases pyproject.toml allows, for CPython 3.11 on x86-64 Linux
# (the image's platform), with every file's hash. uv resolves for that platform whatever the host is.
UV_VENV     := .venv-uv
UV_VERSION  := 0.13.8
LOCK_UPGRADE ?= --upgrade
TORCH_LINKS ?= $(firstword $(wildcard /opt/wheels) https://download.pytorch.org/whl/cpu/torch/)
UV_COMPILE   = SSL_CERT_FILE=$(firstword $(wildcard /etc/ssl/certs/ca-certificates.crt) $(SSL_CERT_FILE)) \
	$(UV_VENV)/bin/uv pip compile pyproject.toml --quiet --generate-hashes --custom-compile-command 'make lock' \
	--python-version 3.11 --python-platform x86_64-manylinux_2_28 --no-emit-package torch \
	--find-links $(TORCH_LINKS) --constraint docker/torch-cpu.txt
lock:
	test -x $(UV_VENV)/bin/uv || { python3 -m venv $(UV_VENV) && $(UV_VENV)/bin/pip install --quiet uv==$(UV_VERSION); }
	$(UV_COMPILE) $(LOCK_UPGRADE) --extra server -o $(LOCK)
	$(UV_COMPILE) $(LOCK_UPGRADE) --extra server --extra dev --constraint $(LOCK) -o $(DEV_LOCK)

# The real trainers for the capture tests (tests/test_capture_*.py): the `trainers` extra (TRL and the
# versions it runs with), then verl and the modules it imports with --no-deps (its declared pins
# conflict with that set; the functions called here run with it). The constraints file keeps torch
# where it is: no install may move it.
$(TRAINERS): $(STAMP) requirements/constraints.txt requirements/verl.txt
	$(PY) -m pip install --quiet -c requirements/constraints.txt -e '.[dev,trainers]'
	$(PY) -m pip install --quiet --no-deps -c requirements/constraints.txt -r requirements/verl.txt
	$(PY) -c 'import torch; assert torch.__version__.startswith("2.13.0"), torch.__version__'
	touch $(TRAINERS)

# ESLint and Prettier for static/js, from package-lock.json (exact versions, integrity hashes; devDependencies
# only: nothing of it reaches the app or the image). Installed again when the lock changes.
NODE_STAMP := node_modules/.installed
$(NODE_STAMP): package.json package-lock.json
	npm ci --ignore-scripts --no-audit --no-fund
	touch $(NODE_STAMP)

run: $(STAMP)
	$(PY) -m uvicorn app.main:app --host $(HOST) --port $(PORT) --http app.server:HeaderTimeoutHttpTools

lint: $(STAMP) $(NODE_STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	node_modules/.bin/eslint .
	node_modules/.bin/prettier --check static/js eslint.config.js

# The numerical tests run twice: under this CPU's best kernel set (AVX2, AVX-512, ...) and under
# the portable default kernels, so a result that depends on the kernel set fails here.
test: $(STAMP) $(TRAINERS) chromium lint
	$(PY) -c 'import torch; print("CPU kernel set:", torch.backends.cpu.get_cpu_capability())'
	$(PY) -m pytest
	# the files that mark numerical tests (collecting the other files again took seconds for none of them)
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -m numerical -p no:cacheprovider $$(grep -l numerical tests/test_*.py)

# The browser tests drive Debian's Chromium (Playwright never downloads a browser here).
chromium:
	@test -x /usr/bin/chromium || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

bench: $(STAMP) $(TRAINERS) chromium
	$(PY) bench/core.py
	$(PY) bench/api.py
	$(PY) bench/page.py
	$(PY) bench/capture.py

# Builds the image (docker if its engine answers, else podman, set up here if missing), runs it and checks it.
# Slow (a cold build downloads torch) and needs root for podman's setup: not part of `make test`.
docker-test: $(STAMP) chromium
	$(PY) docker/test.py

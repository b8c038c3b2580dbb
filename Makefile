# ckptfs: everything a fresh Debian/Ubuntu machine needs, then the job.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
APT_PACKAGES := fuse3 libfuse2 libfuse3-3 nginx-light openssl rclone attr systemd

.PHONY: help setup system-deps venv test test-quick demo bench bench-quick fuzz fuzz-c lint clean

help:
	@echo "make demo   - set up, make an example checkpoint, mount it, ls/du/memmap, unmount"
	@echo "make test   - set up and run the test suite (real FUSE mounts included)"
	@echo "make test-quick - the suite without tests marked slow (pytest -m 'not slow'): under 3 minutes"
	@echo "make bench  - benchmarks against torch.load, zipslicer, safetensors, ratarmount -> docs/benchmarks.md"
	@echo "make fuzz   - a long fuzzing run over mutated checkpoints"
	@echo "make fuzz-c - the C scanner (ckptfs/model/_tablescan.c) under ASan/UBSan, on a million mutated pickles"
	@echo "make lint   - ruff, mypy and the import-linter layer contracts (docs/architecture.md)"

# System packages: FUSE 3 (and 2, for peers that need it); nginx and openssl for the remote tests (HTTP, HTTPS);
# rclone for the remote benchmarks; attr (getfattr, shown in the README). Skipped when already present.
system-deps:
	@if ! command -v fusermount3 >/dev/null 2>&1 || ! ldconfig -p | grep -q 'libfuse3.so.3' || ! ldconfig -p | grep -q 'libfuse.so.2' \
		|| ! { command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx; } || ! command -v openssl >/dev/null 2>&1 \
		|| ! command -v rclone >/dev/null 2>&1 || ! command -v getfattr >/dev/null 2>&1 \
		|| ! command -v systemd-analyze >/dev/null 2>&1; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(APT_PACKAGES); \
	fi

# (setup.py and the C source too: pip install builds the C scanner, ckptfs/model/_tablescan.c)
$(VENV)/.installed: setup.cfg pyproject.toml setup.py ckptfs/model/_tablescan.c
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test,bench]'
	$(PY) -m compileall -q ckptfs  # as a regular install would: PYTHONDONTWRITEBYTECODE=1 must not cost every start
	touch $@

venv: $(VENV)/.installed

setup: system-deps venv

test: setup
	$(PY) -m pytest -q

test-quick: setup
	$(PY) -m pytest -q -m "not slow"

demo: setup
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" ./scripts/demo.sh

bench: setup
	$(PY) -m benchmarks $(BENCH_ARGS)

bench-quick: setup
	$(PY) -m benchmarks --quick --output /tmp/ckptfs-bench-quick.md $(BENCH_ARGS)

fuzz: setup
	CKPTFS_FUZZ_EXAMPLES=$${CKPTFS_FUZZ_EXAMPLES:-20000} $(PY) -m pytest -q tests/test_fuzz.py -p no:cacheprovider

fuzz-c: setup
	$(PY) scripts/fuzz_tablescan.py --n $${CKPTFS_FUZZ_EXAMPLES:-1000000}

lint: setup
	$(VENV)/bin/ruff check ckptfs
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis ckptfs/model/_tablescan*.so

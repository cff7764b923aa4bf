# singpy: `make demo` and `make test` set everything up on a fresh Debian 12 machine.
# As root, missing system packages are installed with apt-get; otherwise they are named.

PYTHON ?= /usr/bin/python3
VENV := .venv
BIN := $(VENV)/bin
# Debian packages: Python venv + headers and libcap for python-prctl; the real image tools;
# busybox-static for test images; bubblewrap and charliecloud for the benchmark; a real registry
# (docker-registry), skopeo and umoci for the pull tests and benchmark, htpasswd (apache2-utils) and
# openssl for their Basic-auth and TLS variants.
APT_PACKAGES := python3-venv python3-dev gcc libc6-dev libcap-dev busybox-static squashfs-tools \
	squashfuse fuse3 fuse-overlayfs siftool uidmap iproute2 util-linux bubblewrap charliecloud-runtime \
	docker-registry skopeo umoci apache2-utils openssl ca-certificates

.PHONY: all setup system-packages demo test lint bench clean

all: test

system-packages:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
		| grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "Installing system packages:" $$missing; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
		else \
			echo "Missing system packages:" $$missing >&2; \
			echo "Install them as root (apt-get install" $$missing"), then run make again." >&2; \
			exit 1; \
		fi; \
	fi

$(BIN)/.installed: pyproject.toml | system-packages
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# compat mode: a plain path entry, not an import hook that every Python start would load.
	$(BIN)/pip install -q -e '.[test]' --config-settings editable_mode=compat >$(VENV)/pip.log 2>&1 \
		|| { cat $(VENV)/pip.log; exit 1; }
	touch $@

setup: system-packages $(BIN)/.installed
	@# Byte-compile once: `singpy exec` should never compile its own modules.
	$(BIN)/python -m compileall -q singpy

demo: setup
	$(BIN)/python -m tests.support.images build/demo-sandbox
	@echo "--- singpy run build/demo-sandbox"
	$(BIN)/singpy run build/demo-sandbox
	@echo "--- the same image as a SIF file"
	rm -f build/demo.sif
	$(BIN)/singpy build build/demo.sif build/demo-sandbox
	$(BIN)/singpy run --contain --hostname demo build/demo.sif from a SIF

lint: setup
	$(BIN)/ruff check singpy tests $(wildcard benchmarks)
	$(BIN)/mypy singpy tests benchmarks

test: lint
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

bench: setup
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/pull.py

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache

# singpy: `make demo` and `make test` set everything up on a fresh Debian 12 machine.
# As root, missing system packages are installed with apt-get; otherwise they are named.

PYTHON ?= /usr/bin/python3
VENV := .venv
BIN := $(VENV)/bin
# Debian packages, by what needs them. The demo: Python venv + headers and libcap for python-prctl,
# busybox-static for its image, squashfs-tools, squashfuse and fuse3 for SIF files, uidmap and
# util-linux. The tests add fuse-overlayfs, e2fsprogs and fuse2fs (overlays), pipx (an install test),
# siftool, iproute2 (network namespaces), a real registry (docker-registry), skopeo and umoci, htpasswd
# (apache2-utils) and openssl for its Basic-auth and TLS variants, a real Slurm (slurm-wlm: slurmctld,
# slurmd, srun) with munge, and Open MPI (openmpi-bin, libopenmpi-dev: mpirun, mpicc) for the job tests.
# The CWL conformance comparison adds mmdebstrap (its images) and rootless podman with runc (crun refuses
# hybrid cgroup hosts).
# The benchmark adds the tools it compares with: bubblewrap and Charliecloud.
DEMO_PACKAGES := python3-venv python3-dev gcc libc6-dev libcap-dev libssl-dev busybox-static squashfs-tools \
	squashfs-tools-ng squashfuse fuse3 uidmap util-linux gpgv
TEST_PACKAGES := $(DEMO_PACKAGES) fuse-overlayfs e2fsprogs fuse2fs pipx siftool iproute2 docker-registry skopeo python3-seccomp \
	umoci apache2-utils openssl ca-certificates slurm-wlm munge openmpi-bin libopenmpi-dev \
	mmdebstrap podman runc debootstrap gnupg gocryptfs cryptsetup-bin
BENCH_PACKAGES := $(TEST_PACKAGES) bubblewrap charliecloud-runtime
# Where `make install` puts the `singpy` command: /usr/local/bin as root, ~/.local/bin otherwise.
PREFIX ?= $(if $(filter 0,$(shell id -u)),/usr/local,$(HOME)/.local)

.PHONY: all setup demo-packages test-packages bench-packages demo test lint bench install clean

all: test

# $(call packages,LIST): install what is missing of LIST with apt-get as root; otherwise name it and stop.
define packages
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null \
		| grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			echo "Installing system packages:" $$missing; \
			apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive \
				apt-get -o DPkg::Lock::Timeout=600 install -y -qq $$missing >/dev/null; \
		else \
			echo "Missing system packages:" $$missing >&2; \
			echo "Install them as root (apt-get install" $$missing"), then run make again." >&2; \
			exit 1; \
		fi; \
	fi
endef

demo-packages:
	$(call packages,$(DEMO_PACKAGES))

test-packages:
	$(call packages,$(TEST_PACKAGES))

bench-packages:
	$(call packages,$(BENCH_PACKAGES))

$(BIN)/.installed: pyproject.toml | demo-packages
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@# compat mode: a plain path entry, not an import hook that every Python start would load.
	$(BIN)/pip install -q -e '.[test]' --config-settings editable_mode=compat >$(VENV)/pip.log 2>&1 \
		|| { cat $(VENV)/pip.log; exit 1; }
	touch $@

setup: demo-packages $(BIN)/.installed
	@# The launch path's system calls in C (singpy/kernel/_native.c), built in place; pip's editable install
	@# builds it too, this keeps an older venv's tree up to date (a no-op when it is).
	$(BIN)/python setup.py -q build_ext --inplace 2>&1 | grep -v -e _BetaConfiguration -e 'warnings.warn(msg' || true
	@# Byte-compile once: `singpy exec` should never compile its own modules.
	$(BIN)/python -m compileall -q singpy
	@# The console script started with `python -S` (singpy.cli.launcher): ~4 ms of site and .pth files off each launch
	$(BIN)/python -m singpy.cli.launcher $(BIN)/singpy

demo: setup
	$(BIN)/python -m tests.support.images build/demo-sandbox
	@echo "--- singpy run build/demo-sandbox"
	$(BIN)/singpy run build/demo-sandbox
	@echo "--- the same image as a SIF file"
	rm -f build/demo.sif
	$(BIN)/singpy build build/demo.sif build/demo-sandbox
	$(BIN)/singpy run --contain --hostname demo build/demo.sif from a SIF

lint: test-packages setup
	$(BIN)/ruff check singpy tests $(wildcard benchmarks)
	$(BIN)/mypy singpy tests benchmarks

# Through tests/support/reachable.py: from a clone the test user can't reach (root's 0700 home), the suite
# runs from a copy in /tmp that it can. In TEST_WORKERS pytest-xdist workers (0: one process), a test file
# per worker at a time (its module fixtures are shared by its tests): most of the suite waits on programs,
# servers and the kernel, so two workers halve it even on two cores (tests/conftest.py: their directories,
# and the slowest files started first).
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m tests.support.reachable -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

bench: bench-packages setup
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/pull.py
	$(BIN)/python benchmarks/pull_big.py
	$(BIN)/python benchmarks/pull_oras.py
	$(BIN)/python benchmarks/build.py
	$(BIN)/python benchmarks/hpc.py
	$(BIN)/python benchmarks/burst.py

# A link to the venv's command: it keeps working as long as this clone and its .venv stay where they are.
# DROP_IN=yes also installs it as `apptainer` and `singularity` (what workflow engines call), never over a
# command of those names that is not already such a link (singpy/cli/dropin.py, which pip/pipx users run too).
DROP_IN ?= no
install: setup
	mkdir -p $(PREFIX)/bin
	ln -sfn $(CURDIR)/$(BIN)/singpy $(PREFIX)/bin/singpy
	@echo "installed $(PREFIX)/bin/singpy -> $(CURDIR)/$(BIN)/singpy"
	@# bash-completion loads completions/NAME on first use from each XDG data dir (/usr/local/share as root,
	@# ~/.local/share otherwise): written, not linked, so a new flag needs `make install` again, as the link does
	mkdir -p $(PREFIX)/share/bash-completion/completions
	$(BIN)/singpy completion bash > $(PREFIX)/share/bash-completion/completions/singpy
	@if [ "$(DROP_IN)" = yes ]; then $(CURDIR)/$(BIN)/python -m singpy.cli.dropin $(PREFIX)/bin; fi
	@case ":$$PATH:" in *":$(PREFIX)/bin:"*) ;; *) echo "add $(PREFIX)/bin to your PATH";; esac

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache

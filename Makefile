# ualinkd: two commands do everything on a fresh Debian machine.
#   make demo   install what is missing, start a local pod, run the example clients
#   make test   install what is missing, ruff, the whole test suite
# Also: make bench, make bench-pod (benchmarks/), make c (the C library and programs), make clean.
#   make bench-pod sizes: BENCH_POD_EXPORTS=1000000 BENCH_POD_SHAPES=256x1,128x2,64x4,32x8
#   BENCH_POD_REVOKE_BOS=2000 BENCH_POD_REVOKE_IMPORTERS=8 BENCH_POD_SIZES=2,8,32 (0 or empty
#   skips that part); the figures also go to benchmarks/results/pod_scale.json.

# The venv's interpreter: Debian's own python3 where it is (the one the container image runs;
# a PGO and LTO build: a loop of Python calls here 1.58 -> 1.19 s against a pyenv build of
# 3.11 without them, make bench's daemon CPU per export ioctl 24.5 -> 20.8 us), else the
# python3 on PATH (PYTHON=... to choose). An existing .venv is kept: remove it to change.
PYTHON  ?= $(firstword $(wildcard /usr/bin/python3) python3)
VENV    := .venv
VPY     := $(VENV)/bin/python
# libhsakmt-dev, rocminfo: Debian's libhsakmt and ROCr 5.2.3, run unmodified by test_hsakmt.py.
# python3-venv and python3-dev: Debian's python3 needs them for the venv and for the cffi
# FUSE binding (a pyenv or source-built python brings its own). libhsakmt-dev and rocminfo:
# Debian's libhsakmt and ROCr, for the KFD tests (tests/integration/test_hsakmt.py). tshark (and its dumpcap): the
# fabric dissector's test (tests/integration/test_wireshark.py); its debconf question is
# answered by DEBIAN_FRONTEND=noninteractive below. python3-seccomp: the systemd unit's
# syscall filter applied to a node (tests/integration/test_service_caps.py). libamdhip64-dev:
# Debian's HIP 5.2.3, run unmodified by tests/integration/test_rocr.py (tests/c/rocr_hip.c).
APT_PKGS := fuse3 libfuse3-dev libdrm-dev libdrm-tests libhsakmt-dev libhsa-runtime-dev rocminfo iproute2 pkg-config gcc make python3-venv python3-dev \
            tshark python3-seccomp libamdhip64-dev
SUDO    := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=
BENCH_ARGS ?=  # e.g. make bench BENCH_ARGS="--reps 3 --profile"

.PHONY: all setup apt venv c demo test lint bench bench-pod clean wheelhouse image test-containers

all: setup

setup: apt venv c

# System packages: only what is missing, so a second run costs one dpkg query.
apt:
	@missing=""; for p in $(APT_PKGS); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py ualinkd/fuse/_build.py ualinkd/fuse/dataplane.c ualinkd/fuse/doorbells.c | apt
	test -x $(VPY) || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

c: apt
	$(MAKE) -s -C libualink_c

demo: setup
	bash libualink_c/examples/demo.sh

# ruff, then mypy (its configuration, strict on the sans-IO layers, is in pyproject.toml).
lint: venv
	$(VENV)/bin/ruff check ualinkd tests benchmarks
	$(VENV)/bin/mypy

test: setup lint
	$(VPY) -m pytest -q -rs $(PYTEST_ARGS)

bench: setup
	$(VPY) benchmarks/run.py $(BENCH_ARGS)

bench-pod: setup
	$(MAKE) -C benchmarks
	$(VPY) benchmarks/pod_scale.py

# The container tier (issue 11): the image is built from a wheelhouse made here, on a base
# made without any registry (debootstrap + podman import); tests/containers runs pods of it.
IMAGE   ?= ualinkd:0.1.0
WHEELHOUSE := build/wheelhouse

wheelhouse: venv
	rm -rf $(WHEELHOUSE)
	$(VPY) -m pip wheel -q --disable-pip-version-check -w $(WHEELHOUSE) .

image: wheelhouse
	packaging/build-image.sh $(IMAGE)

CONTAINER_PKGS := podman runc debootstrap

test-containers: setup wheelhouse
	@$(MAKE) -s apt APT_PKGS="$(CONTAINER_PKGS)"
	$(VPY) -m pip install -q --disable-pip-version-check podman-compose
	UALINK_CONTAINER_TESTS=1 $(VPY) -m pytest -q -p no:cacheprovider tests/containers $(PYTEST_ARGS)

clean:
	$(MAKE) -s -C libualink_c clean
	$(MAKE) -s -C benchmarks clean
	rm -rf build *.egg-info ualinkd/fuse/_fuse_ll*.so ualinkd/fuse/_fuse_ll.c ualinkd/fuse/_fuse_ll.o

# minirt: `make demo` and `make test` set everything up on a fresh machine
# (Python 3.10+, a C compiler, access to the package registry).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Touched after a successful install; re-install whenever pyproject.toml changes.
STAMP := $(VENV)/.minirt-installed
# `make demo` needs only the builder and onnxruntime (the demo extra); an up-to-date dev install has both.
DEMO_STAMP := $(VENV)/.minirt-demo-installed

.PHONY: all demo test clean distclean bench native test-arm64 arm64-shell fuzz wheels test-arm32

all: test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[dev]'
	touch $@

$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[demo]'
	touch $@

demo: $(if $(wildcard $(STAMP)),$(STAMP),$(DEMO_STAMP))
	$(BIN)/minirt demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# minirt vs onnxruntime on the real-world benchmark set (benchmarks/realworld.py;
# benchmarks/results.md, results.png).  The models are exported with torch into
# benchmarks/.cache/ on the first run.  ARGS="--set synthetic" runs the synthetic
# micro-benchmarks instead; ARGS="--models resnet18,bert_mini --threads 1" a subset.
bench: $(STAMP)
	$(BIN)/pip install -e '.[dev,bench,bench-models]'
	$(BIN)/python benchmarks/run.py $(ARGS)

# Recompile the native kernels in place after editing minirt/native/*.c|h.
native: $(STAMP)
	$(BIN)/python minirt/native/build_native.py

# Long fuzz run over mutated artifacts (the test suite runs a bounded one).
# SEED=N picks another sequence; ITERATIONS=N the count; findings go to /tmp/minirt-fuzz-findings/.
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz.fuzz_artifacts --iterations $${ITERATIONS:-200000} --seed $${SEED:-0} \
		--corpus-model examples/digits/digits_cnn.onnx

# The runtime on an emulated Raspberry Pi: Debian bookworm arm64 (Debian's
# python3-numpy 1.24) through qemu-user-static + chroot, the runtime wheel built
# inside with Debian's gcc and pip-installed.  Needs root.  The root filesystems
# are cached outside the repo in $${MINIRT_ARM64_CACHE:-/var/cache/minirt-arm64}
# (~6 min to build the first time, ~5-6 min per run after that, 2 min with
# MINIRT_ARM64_WHEEL=dist/minirt-...-linux_aarch64.whl from `make wheels`).
test-arm64: $(STAMP)
	PYTHON=$(abspath $(BIN)/python) bash scripts/arm64/run-tests.sh

# A shell inside that emulated Pi (or: make arm64-shell CMD="python3 -m minirt info").
arm64-shell:
	bash scripts/arm64/shell.sh $(CMD)

# The same on an emulated 32-bit Raspberry Pi OS: Debian bookworm armhf (ARMv7, Debian's numpy 1.24),
# cache $${MINIRT_ARM32_CACHE:-/var/cache/minirt-arm32}.  Both runs install the runtime wheel built
# inside the root, check the kernels on several emulated CPUs, and install `minirt package`s on a
# second root without a compiler (scripts/emulated/README.md).  Needs root.
test-arm32: $(STAMP)
	PYTHON=$(abspath $(BIN)/python) bash scripts/arm32/run-tests.sh

# The runtime wheels (numpy-only: no builder, no C sources, stripped) into dist/: x86-64 built here and
# tagged manylinux by auditwheel, aarch64 and armv7l built inside the emulated Debian bookworm roots
# (needs root).  WHEEL_ARCHS="x86_64 arm64 arm32" picks some.  docs/packaging.md.
wheels: $(STAMP)
	PYTHON=$(abspath $(BIN)/python) bash scripts/emulated/wheels.sh dist $(WHEEL_ARCHS)

# Build outputs and caches; the virtualenv stays (`make distclean` removes it too).
clean:
	rm -rf build dist .pytest_cache out *.egg-info
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name '*.egg-info' \) -type d -print -exec rm -rf {} +
	find . -path ./$(VENV) -prune -o -path ./examples -prune -o -name '*.mrt' -type f -print -exec rm -f {} +

distclean: clean
	rm -rf $(VENV)

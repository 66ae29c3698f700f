# Makefile - the two front doors: `make demo` and `make test` (see README.md).
# Both install missing Debian packages first (scripts/install-deps: `--demo` only what the
# demo builds and runs with, else everything the tests need too) and build with meson.
# As root, or as a user with `sudo make ...`.

BUILD      ?= build
BUILD_ASAN ?= build-asan
BUILD_FUZZ ?= build-fuzz
PY         := /usr/bin/python3
# What the demo needs built: runcell, runcell-full (its other commands), its helper and the
# template's module (named by Python).
EXT_SUFFIX := $(shell $(PY) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
PROGRAMS   := src/runcell src/runcell-full src/runcell-sandbox src/kernel/_runcell_template$(EXT_SUFFIX)

.PHONY: all deps deps-demo test-deps check-format build programs asan fuzz test test-unit test-asan \
        test-integration test-vm test-loaded demo bench format clean image test-image

all: build

deps:
	@scripts/install-deps

deps-demo:
	@scripts/install-deps --demo

# What only testing needs (clang and libFuzzer for `make fuzz`); `make demo` never asks for it.
test-deps:
	@scripts/install-test-deps

$(BUILD)/build.ninja:
	meson setup $(BUILD) --buildtype=debugoptimized

# Everything, the test programs included.
build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

# Only the programs (no unit tests, fuzz or attack binaries).
programs: deps-demo $(BUILD)/build.ninja
	ninja -C $(BUILD) $(PROGRAMS)

$(BUILD_ASAN)/build.ninja:
	meson setup $(BUILD_ASAN) --buildtype=debug -Db_sanitize=address,undefined -Db_lundef=false

# ASan+UBSan build of everything, one command away.
asan: deps $(BUILD_ASAN)/build.ninja
	ninja -C $(BUILD_ASAN)

$(BUILD_FUZZ)/build.ninja:
	CC=clang meson setup $(BUILD_FUZZ) --buildtype=debug -Dfuzz=true \
	    -Db_sanitize=address,undefined -Db_lundef=false

# The fuzz targets (tests/fuzz) with libFuzzer: replays every corpus, then fuzzes each target
# for FUZZ_TIME seconds (default 30); a crash, leak, hang or blow-up fails it.
fuzz: deps test-deps $(BUILD_FUZZ)/build.ninja
	ninja -C $(BUILD_FUZZ) fuzz
	tests/fuzz/run all $(BUILD_FUZZ)

test-unit: build
	meson test -C $(BUILD) --print-errorlogs

test-asan: asan
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	    meson test -C $(BUILD_ASAN) --print-errorlogs
	RUNCELL_BIN=$(CURDIR)/$(BUILD_ASAN)/src/runcell $(PY) tests/run.py --quick

test-integration: build
	RUNCELL_BIN=$(CURDIR)/$(BUILD)/src/runcell $(PY) tests/run.py

# The VM stage (tests/vm/run): Debian 12's own kernel in QEMU, pure cgroup v2, as root;
# about 25 minutes under TCG (docs/OPERATING.md, "The VM test stage").
test-vm: build
	$(PY) tests/vm/run --build $(BUILD)

# The container image (deploy/image): Debian packages only (mmdebstrap, podman, buildah), no
# base image from a registry; the root file system is cached under ~/.cache/runcell-image.
image: deps programs
	deploy/image/build

# The demo and a `serve` smoke test inside the image, under podman, privileged as the pod is.
test-image: image
	deploy/image/test

# The whole suite: the stages listed in tests/stages (unit, integration and security, the
# sanitizer build), each run whatever the others did; a summary of all of them at the end,
# and a failure if any failed.
test: build
	@MAKE='$(MAKE)' scripts/test-stages tests/stages

# The same with two busy loops beside it: the suite must pass on a busy machine.
test-loaded: build
	@scripts/with-load 2 $(MAKE) --no-print-directory test

demo: programs
	@examples/sales/run.sh $(BUILD)/src/runcell

bench: build
	bench/run $(BUILD)/src/runcell
	bench/mcp $(BUILD)/src/runcell
	bench/state.py $(BUILD)/src/runcell
	bench/fleet.py $(BUILD)/src/runcell
	bench/leaderboard.py $(BUILD)/src/runcell
	bench/fleet_scale.py $(BUILD)/src/runcell

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

# What `make format` would change, and what pyflakes finds in the Python: a stage of make test.
check-format: test-deps
	@scripts/check-format

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)

# Makefile - the two front doors: `make demo` and `make test` (see README.md).
# Both install missing Debian packages first (scripts/install-deps) and build with meson.

BUILD      ?= build
BUILD_ASAN ?= build-asan
PY         := /usr/bin/python3

.PHONY: all deps build asan test test-unit test-asan test-integration test-vm demo bench format clean

all: build

deps:
	@scripts/install-deps

$(BUILD)/build.ninja:
	meson setup $(BUILD) --buildtype=debugoptimized

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

$(BUILD_ASAN)/build.ninja:
	meson setup $(BUILD_ASAN) --buildtype=debug -Db_sanitize=address,undefined -Db_lundef=false

# ASan+UBSan build of everything, one command away.
asan: deps $(BUILD_ASAN)/build.ninja
	ninja -C $(BUILD_ASAN)

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

# The whole suite: unit, integration and security tests, then the sanitizer build.
test: test-unit test-integration test-asan

demo: build
	@examples/sales/run.sh $(BUILD)/src/runcell

bench: build
	bench/run $(BUILD)/src/runcell
	bench/mcp $(BUILD)/src/runcell

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD) $(BUILD_ASAN)

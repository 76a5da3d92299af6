# Thin wrapper over CMake for the two README commands:
#   make demo   — set up, build, run the main job
#   make test   — set up, build, run the test suite (plain build, then ASan + UBSan)
JOBS ?= $(shell nproc)

.PHONY: all setup build build-asan demo test test-fast test-asan bench clean

all: build

setup:
	@bash scripts/setup.sh

build: setup
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build -j $(JOBS)

build-asan: setup
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DPS_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)

demo: build
	@bash scripts/demo.sh

test-fast: build
	@cd build && ctest --output-on-failure -j 2

test-asan: build-asan
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
		ctest --output-on-failure -j 2

test: test-fast test-asan

bench: build
	@./build/bench/bench_forward
	@./build/bench/bench_train
	@./build/bench/bench_knockout

clean:
	rm -rf build build-asan

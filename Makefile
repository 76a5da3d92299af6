# Thin wrapper over CMake for the two README commands:
#   make demo   — set up, build, run the main job
#   make test   — set up, build, run the test suite (plain build, then ASan + UBSan; ctest -j JOBS), then the
#                 fuzzers (JOBS at a time)
#   make python — build libphasescope.so for the Python package: then, from the repository root,
#                 PYTHONPATH=python python3 -c "import phasescope" (docs/python.md)
JOBS ?= $(shell nproc)

FUZZ_SECONDS ?= 15
FUZZ_TARGETS = safetensors config train_config render index tokenizer v4_config

.PHONY: all setup build build-asan build-fuzz demo retrain test test-fast test-asan fuzz bench bench-decode bench-select clean python

all: build

setup:
	@bash scripts/setup.sh

build: setup
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build -j $(JOBS)

build-asan: setup
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DPS_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j $(JOBS)

# the shared library the Python package binds to (python/phasescope finds build/libphasescope.so), checked
# by importing the package with Debian's interpreter (PYTHON; python3-numpy)
PYTHON ?= /usr/bin/python3
python: setup
	@cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build build -j $(JOBS) --target ps_shared
	@PYTHONPATH=python $(PYTHON) -c 'import phasescope as ps; print("phasescope", ps.__version__, "for Python:", ps.library_path)'

demo: build
	@bash scripts/demo.sh

retrain: build
	@bash scripts/retrain_demo.sh
	@bash scripts/retrain_deep.sh
	@bash scripts/retrain_phasefix.sh all
	@bash scripts/retrain_text.sh

test-fast: build
	@cd build && ctest --output-on-failure -j $(JOBS)

test-asan: build-asan
	@cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0 \
		ctest --output-on-failure -j $(JOBS)

build-fuzz: setup
	@CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DPS_SANITIZE=ON -DPS_FUZZ=ON >/dev/null
	@cmake --build build-fuzz -j $(JOBS) -- --no-print-directory -s

# Each target runs for FUZZ_SECONDS on the sanitizer build, JOBS targets at a time (scripts/fuzz.sh); new
# inputs go to a scratch corpus, a crash fails (keep its input under tests/fuzz/regressions/TARGET/ once fixed).
fuzz: build-fuzz
	@bash scripts/fuzz.sh $(FUZZ_SECONDS) $(JOBS) $(FUZZ_TARGETS)

test: test-fast test-asan fuzz

# bench: phasescope's benches, then the PyTorch peer of bench_train on the same shapes, with the
# phasescope/PyTorch ratios side by side (bench/torch_peer.py; PyTorch is a bench-only dependency, Debian's
# python3-torch for PEER_PYTHON; skipped with a message when missing). BENCH_SECONDS: minimum seconds per row.
# Then the Python path against the CLI (bench/bench_python.py) and run_with_cache against PyTorch forward
# hooks on deep_w8s8 and a Qwen3-0.6B-shaped model (bench/bench_python_torch.py; skipped without torch), and the
# knockout grid on a prompt set against a run_with_hooks loop and the CLI (bench/bench_promptset.py).
PEER_PYTHON ?= /usr/bin/python3
BENCH_SECONDS ?= 2
bench: build
	@./build/bench/bench_forward
	@./build/bench/bench_train $(BENCH_SECONDS) > build/bench_train.out; rc=$$?; cat build/bench_train.out; exit $$rc
	@if $(PEER_PYTHON) -c 'import torch' >/dev/null 2>&1; then \
		$(PEER_PYTHON) bench/torch_peer.py --min-s $(BENCH_SECONDS) --phasescope build/bench_train.out; \
	else \
		echo "bench: PyTorch peer skipped: $(PEER_PYTHON) cannot import torch (Debian: apt-get install python3-torch;" \
			"only the bench needs it)"; \
	fi
	@./build/bench/bench_knockout
	@PYTHONPATH=python $(PEER_PYTHON) bench/bench_python.py --build build
	@PYTHONPATH=python $(PEER_PYTHON) bench/bench_promptset.py --build build
	@$(PEER_PYTHON) bench/bench_python_torch.py --build build
	@bash bench/bench_contention.sh build .
	@bash bench/bench_mpi.sh build .

# bench-decode: bench_decode (KV cache decode, time to first token, the bandwidth bound; the Qwen3-0.6B shape
# at 1K) and its PyTorch peer with a KV cache on the same rows (bench/torch_decode_peer.py), one run.
bench-decode: build
	@./build/bench/bench_decode --contexts 1024,8192,32768 --no-full > build/bench_decode.out; rc=$$?; cat build/bench_decode.out; [ $$rc -eq 0 ] || exit $$rc
	@./build/bench/bench_decode --contexts 1024,8192 --full-only --qwen | grep -v '^BLAS\|^decode\|^$$\|^| model\|^|---' >> build/bench_decode.out; grep '^|' build/bench_decode.out | tail -n 3
	@if $(PEER_PYTHON) -c 'import torch' >/dev/null 2>&1; then \
		$(PEER_PYTHON) bench/torch_decode_peer.py --check build/phasescope && \
		$(PEER_PYTHON) bench/torch_decode_peer.py --phasescope build/bench_decode.out; \
	else \
		echo "bench-decode: PyTorch peer skipped: $(PEER_PYTHON) cannot import torch"; \
	fi

# bench-select: InfLLM-v2 block-sparse selection against dense attention on the same random MiniCPM4-shaped
# checkpoint (bench/bench_select_decode.py writes it; build/bench/bench_select_decode times it): decode per token
# at 16K and 32K on 1 and 2 threads, the prefill, the cache's memory against `phasescope info`. About 10 minutes
# on 2 busy cores; the raw results go to bench/results/select_decode.json (docs/minicpm.md "Speed").
bench-select: build
	@$(PYTHON) bench/bench_select_decode.py --build build --out bench/results/select_decode.json

clean:
	rm -rf build build-asan build-fuzz

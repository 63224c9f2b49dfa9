# The README's two commands, and the rest of what CI runs. Every target
# installs what it is missing first (scripts/bootstrap.sh, idempotent).
#
#   make demo            build (sim backend) and run the example engine on the seed's workload
#   make python-demo     build and run the Python example engine loop (examples/python)
#   make test            build and run the whole test suite through CTest
#   make test-asan       the suite under AddressSanitizer + UBSan
#   make test-tsan       the suite under ThreadSanitizer
#   make test-sanitize   both
#   make check-backends  compile the hip and cuda backends and link them into the C++ API, probe and demo
#   make bench           run the benchmarks (sim backend)
#   make gpu-pack        cuda build + the shared libraries it needs, for the GPU machine
#   make fuzz            the protocol decoder and the chunk-description reader under libFuzzer (clang-14), FUZZ_SECONDS each
#   make mutants         break the code on purpose (scripts/mutants.py): every named mutant must be caught

SHELL := /bin/bash
JOBS ?= $(shell nproc)
TEST_JOBS ?= $(shell echo $$(( $$(nproc) * 2 )))
GPU ?= sim
CONFIGURE = cmake -S . -G Ninja -Wno-dev
# The test builds compile four .cpp files of a target as one (a unity
# build): Asio's and Beast's headers are parsed a quarter as often, which
# cut the plain build of kvstrand-tests from 5:50 to 4:09 here
# (docs/PERFORMANCE.md, "CI"); and what most files parse first is
# precompiled once a build (KVSTRAND_PCH). Not for the GPU pack or the
# mutants, where one edited file should rebuild alone, nor for `make build`,
# where a file that forgets an include must still fail.
UNITY = -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=4 -DKVSTRAND_PCH=ON
SAN_BUILD_OPTS = -DKVSTRAND_BENCH=OFF
# The sanitizer suites run twice the cores' tests at once, as the plain
# suite: most of their tests wait on processes and sockets (at one more than
# the cores, two cores here were busy 1.4 of the TSan suite's 118 s and the
# ASan suite's 92; at twice the cores 101 s and 74, docs/PERFORMANCE.md "CI").
SAN_TEST_JOBS ?= $(shell echo $$(( $$(nproc) * 2 )))
CTEST = ctest --output-on-failure -j $(SAN_TEST_JOBS) --test-dir

export ASAN_OPTIONS ?= detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
# tests/tsan.supp: the reports TSan makes inside Debian's uninstrumented
# libzmq (the file says why they are not races).
export TSAN_OPTIONS ?= halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp

FUZZ_SECONDS ?= 60

.PHONY: all bootstrap build demo python-demo test test-asan test-tsan test-sanitize check-backends bench gpu-pack fuzz mutants mutants-diff clean

all: build

bootstrap:
	@scripts/bootstrap.sh

build: bootstrap
	$(CONFIGURE) -B build -DKVSTRAND_GPU=$(GPU)
	cmake --build build -j $(JOBS)

# Builds what it runs: the demo and the server it starts (no test, no benchmark).
# DEMO_ARGS: e.g. --full (the seed's 180 s per arm), --server /tmp/kvstrand.sock; DEMO_OUT, or --out in
# DEMO_ARGS: where the results go
DEMO_OUT ?= build/demo-results
demo: bootstrap
	$(CONFIGURE) -B build -DKVSTRAND_GPU=$(GPU)
	cmake --build build -j $(JOBS) --target kvstrand-engine-demo kvstrand-server
	./build/examples/engine/kvstrand-engine-demo $(if $(findstring --out,$(DEMO_ARGS)),,--out $(DEMO_OUT)) $(DEMO_ARGS)

# PYTHON_DEMO_ARGS: e.g. --server /tmp/kvstrand.sock --requests 500
python-demo: bootstrap
	$(CONFIGURE) -B build -DKVSTRAND_GPU=$(GPU)
	cmake --build build -j $(JOBS) --target kvstrand_python
	PYTHONPATH=build/python /usr/bin/python3 examples/python/engine_loop.py $(PYTHON_DEMO_ARGS)

# Builds what the tests need (every test, the server, the demo, the Python
# module; no benchmark): `make bench` and `make gpu-pack` build those.
# The plain suite runs TEST_JOBS tests at once: most of them wait on
# processes and sockets, so twice the cores keeps both busy.
test: bootstrap
	@scripts/bootstrap.sh --test
	$(CONFIGURE) -B build -DKVSTRAND_GPU=$(GPU) $(UNITY)
	cmake --build build -j $(JOBS) --target kvstrand-tests
	ctest --output-on-failure -j $(TEST_JOBS) --test-dir build

test-asan: bootstrap
	@scripts/bootstrap.sh --test
	$(CONFIGURE) -B build-asan -DKVSTRAND_GPU=sim -DKVSTRAND_SANITIZE=address $(SAN_BUILD_OPTS) $(UNITY)
	cmake --build build-asan -j $(JOBS) --target kvstrand-tests
	$(CTEST) build-asan

test-tsan: bootstrap
	@scripts/bootstrap.sh --test
	$(CONFIGURE) -B build-tsan -DKVSTRAND_GPU=sim -DKVSTRAND_SANITIZE=thread $(SAN_BUILD_OPTS) $(UNITY)
	cmake --build build-tsan -j $(JOBS) --target kvstrand-tests
	$(CTEST) build-tsan

test-sanitize: test-asan test-tsan

# Only src/device/backend_gpu.cpp (and the cuda kernel) differ between
# backends: every other file compiles the same for sim, hip and cuda. So the
# check compiles that file for hip and for cuda in the sim build `make test`
# builds, and links each into the installable library and two programs
# against this build's other libraries (cmake/backend_check.cmake says how):
# the device-runtime probe (every backend call, statically) and the
# public-API test (the shared library, so none of its symbols is left
# undefined). A compile and link check, never run here.
check-backends:
	@scripts/bootstrap.sh --hip
	$(CONFIGURE) -B build -DKVSTRAND_GPU=sim $(UNITY) -DKVSTRAND_CHECK_BACKENDS=ON
	cmake --build build -j $(JOBS) --target kvstrand-backend-checks
	@# Each library exports the public API and nothing of its inside, as the sim build's (CTest "abi: ...").
	for b in hip cuda; do cmake -DLIBRARY=build/tests/libkvstrand_check_$$b.so -P tests/api/exported_symbols.cmake || exit 1; done
	@echo "check-backends: hip and cuda backends compiled and linked"

bench: build
	./build/bench/bench_poller
	./build/bench/bench_chunk_keys
	./build/bench/bench_deadlines
	./build/bench/bench_step
	./build/bench/bench_transfer
	./build/bench/bench_index
	./build/bench/bench_descriptions
	./build/bench/bench_node --start-tier 4G --scaling-tier 2G
	./build/bench/bench_l2
	./build/bench/bench_disk --gib 2
	PYTHONPATH=build/python /usr/bin/python3 bench/bench_python.py

# Not in CI (about a minute a mutant on 2 cores). MUTANTS="F14-timer F4-no-fence" runs some.
mutants: bootstrap
	@scripts/bootstrap.sh --test
	scripts/mutants.py $(MUTANTS)

# Everything, for the GPU machine (gpu-run.sh runs every test binary there).
gpu-pack: bootstrap
	$(CONFIGURE) -B build-cuda -DKVSTRAND_GPU=cuda -DCMAKE_BUILD_TYPE=Release -DKVSTRAND_PYTHON=OFF
	cmake --build build-cuda -j $(JOBS)
	scripts/gpu-pack.sh build-cuda

fuzz:
	@scripts/bootstrap.sh --fuzz
	$(CONFIGURE) -B build-fuzz -DCMAKE_CXX_COMPILER=clang++-14 -DKVSTRAND_FUZZ=ON -DKVSTRAND_SANITIZE=address
	cmake --build build-fuzz -j $(JOBS) --target fuzz_frame_decoder fuzz_chunk_description fuzz_seed_corpus
	./build-fuzz/fuzz_seed_corpus build-fuzz/corpus build-fuzz/descriptions
	@# Both fuzzers at once (libFuzzer runs one thread): each its FUZZ_SECONDS, in the wall time of one.
	@# Each writes its own log: its final figures are printed, the whole log where the fuzzer failed.
	@echo "fuzz: fuzz_frame_decoder and fuzz_chunk_description, $(FUZZ_SECONDS) s each, at once (build-fuzz/*.log)"
	@./build-fuzz/fuzz_frame_decoder -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -print_final_stats=1 \
	    -artifact_prefix=build-fuzz/ build-fuzz/corpus > build-fuzz/frame_decoder.log 2>&1 & frame=$$!; \
	  ./build-fuzz/fuzz_chunk_description -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -print_final_stats=1 \
	    -artifact_prefix=build-fuzz/ build-fuzz/descriptions > build-fuzz/chunk_description.log 2>&1 & chunk=$$!; \
	  wait $$frame; frame_rc=$$?; wait $$chunk; chunk_rc=$$?; \
	  for f in frame_decoder:$$frame_rc chunk_description:$$chunk_rc; do \
	    echo "== build-fuzz/$${f%:*}.log"; \
	    if [ "$${f#*:}" = 0 ]; then grep -v '^"' build-fuzz/$${f%:*}.log | tail -n 8; else cat build-fuzz/$${f%:*}.log; fi; \
	  done; \
	  echo "fuzz: fuzz_frame_decoder exit $$frame_rc, fuzz_chunk_description exit $$chunk_rc"; \
	  test $$frame_rc -eq 0 -a $$chunk_rc -eq 0

# Mutants made by rule on the lines changed since BASE (scripts/diff_mutants.py):
# make mutants-diff BASE=b4cfd90 [MUTANTS_DIFF_ARGS="--max 40 --budget 2400"]
mutants-diff:
	@test -n "$(BASE)" || { echo "mutants-diff: give BASE=<commit>, e.g. make mutants-diff BASE=HEAD~5"; exit 2; }
	scripts/diff_mutants.py --base $(BASE) $(MUTANTS_DIFF_ARGS)

clean:
	rm -rf build build-asan build-tsan build-cuda build-fuzz

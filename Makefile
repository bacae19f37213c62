# The two commands a newcomer needs (see README.md):
#   make demo   build and run the main job (simulated GPU when there is no real one)
#   make test   install what is missing, build, run every test
BUILD ?= build
JOBS ?= $(shell nproc)

.PHONY: all deps configure build test demo format clean

all: build

deps:
	@scripts/install-deps.sh

configure:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Tests build with warnings as errors (SPILLWAY_WERROR); a user's build and
# the demo do not.
test: deps
	$(MAKE) build CMAKE_ARGS="-DSPILLWAY_WERROR=ON $(CMAKE_ARGS)"
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# Builds what the demo runs (the replayer, the shim, the simulated driver and
# CUPTI), then harness/demo.py: gpt_varlen on a simulated device too small for
# its longest batch, the plain allocator vs spillway vs the anchors.
DEMO_TARGETS = spillway-replay spillway simcuda simcupti

demo: deps
	$(MAKE) configure
	cmake --build $(BUILD) -j $(JOBS) --target $(DEMO_TARGETS)
	/usr/bin/python3 harness/demo.py --build $(BUILD) $(DEMO_ARGS)

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h' '*.hpp')

clean:
	rm -rf $(BUILD)

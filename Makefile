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

test: deps
	$(MAKE) build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

demo:
	@echo "make demo arrives with the replay harness (issue 5); until then: make test"
	@exit 1

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h' '*.hpp')

clean:
	rm -rf $(BUILD)

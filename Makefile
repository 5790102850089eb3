# barellm build. `make` builds build/barellm; `make test` builds and runs every test.
# Files named *_avx2.cpp hold the SIMD code paths and are compiled with AVX2/FMA/F16C;
# the rest of the program runs on any x86-64 CPU and picks a path at start-up.

CXX      ?= g++
BUILD    := build
CXXFLAGS := -std=c++17 -O2 -g -Wall -Wextra -fopenmp -Isrc -MMD -MP
SIMD_FLAGS := -mavx2 -mfma -mf16c
LDFLAGS  := -fopenmp
PYTHON   ?= python3

LIB_SRCS  := $(filter-out src/main.cpp,$(wildcard src/*.cpp))
LIB_OBJS  := $(LIB_SRCS:src/%.cpp=$(BUILD)/src/%.o)
TEST_SRCS := $(wildcard tests/*.cpp)
TEST_OBJS := $(TEST_SRCS:tests/%.cpp=$(BUILD)/tests/%.o)
TOOL_SRCS := $(wildcard tests/tools/*.cpp)
TOOLS     := $(TOOL_SRCS:tests/tools/%.cpp=$(BUILD)/%)

.PHONY: all test clean
all: $(BUILD)/barellm $(BUILD)/unit_tests $(TOOLS)

$(BUILD)/src/%_avx2.o: src/%_avx2.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(SIMD_FLAGS) -c $< -o $@

$(BUILD)/src/%.o: src/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/tests/%.o: tests/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -Itests -c $< -o $@

$(BUILD)/tools/%.o: tests/tools/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/barellm: $(BUILD)/src/main.o $(LIB_OBJS)
	$(CXX) $^ $(LDFLAGS) -o $@

$(BUILD)/unit_tests: $(TEST_OBJS) $(LIB_OBJS)
	$(CXX) $^ $(LDFLAGS) -o $@

$(BUILD)/%: $(BUILD)/tools/%.o $(LIB_OBJS)
	$(CXX) $^ $(LDFLAGS) -o $@

test: all
	$(BUILD)/unit_tests
	$(PYTHON) -m pytest -q tests

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

# barellm build. `make` builds build/barellm; `make test` builds and runs every test.
# The CPU kernels of one instruction set are in src/cpu/avx2/ and src/cpu/avx512/, their
# names saying what they are compiled with: *_avx2.cpp with AVX2/FMA/F16C; *_avxvnni.cpp
# with AVX-VNNI too; *_avx512.cpp are compiled with AVX-512 F/BW/VL/DQ too,
# *_avx512vnni.cpp with AVX512_VNNI as well and *_avx512bf16.cpp with AVX512_BF16 as well
# (headers named *_avx2.h / *_avx512.h hold their inline helpers and are included by them
# only); the rest of the program runs on any x86-64 CPU and picks a path at start-up. The
# unit tests also build the AVX-512 and AVX-VNNI files on SIMDe (build/simde/), which runs
# them on CPUs without those features.
#
# The CUDA backend (kernels/*.cu) is built too when nvcc is found; variables:
#   CUDA=0             build for the CPU only, even where nvcc exists
#   NVCC=PATH          the nvcc to use (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc)
#   CUDA_ARCHS="..."   GPU architectures compiled to machine code (default 75 80 90a;
#                      90a: the H100/H200 code with the warpgroup GEMM). The kernels branch
#                      at sm_80 and sm_90 only, and sm_80's machine code runs on every 8.x
#                      GPU (8.6, 8.9: RTX 30 and 40, A10, L4, L40); each architecture more
#                      costs nvcc about 3.5 minutes of CPU (add 86 89 for their own builds)
#   CUDA_PTX_ARCH=N    the architecture also embedded as PTX, which the driver compiles for
#                      GPUs newer than CUDA_ARCHS (default 90)
#   CUDA_LIBDIR=DIR    where libcudart_static.a is (default: next to nvcc)
# The CUDA runtime is linked statically: build/barellm runs on machines without a GPU
# driver (and says so in one line when asked for --device cuda).
# CPPFLAGS is passed to every compilation (e.g. CPPFLAGS=-I/path/to/nlohmann/include), and
# LINKFLAGS to every link (e.g. LINKFLAGS="-L/path/to/lib -Wl,-rpath,/path/to/lib" for a
# cpp-httplib outside the system's library paths).
#
#   SAN=1              build with AddressSanitizer and UndefinedBehaviorSanitizer (CPU only);
#                      `make test SAN=1` runs the unit tests and the Python tests marked
#                      `sanitize` on that build
#   make bench         the standard benchmark set on this machine (scripts/bench.sh)
#   make fuzz          builds the libFuzzer targets (tests/fuzz/) with clang++ and runs them
#                      side by side, each for FUZZ_SECONDS (default 60) from the seed corpus

# Every target builds (and `make test` runs its tests) on all the cores, unless -j says
# otherwise.
NPROC := $(shell nproc 2>/dev/null || echo 1)
MAKEFLAGS += -j$(NPROC)

CXX      ?= g++
SAN      ?= 0
BUILD    := $(if $(filter 1,$(SAN)),build/san,build)
CXXFLAGS := -std=c++17 -O2 -g -Wall -Wextra -fopenmp -Isrc -MMD -MP $(CPPFLAGS)
SIMD_FLAGS := -mavx2 -mfma -mf16c
AVXVNNI_FLAGS := $(SIMD_FLAGS) -mavxvnni
AVX512_FLAGS := $(SIMD_FLAGS) -mavx512f -mavx512bw -mavx512vl -mavx512dq
VNNI_FLAGS   := $(AVX512_FLAGS) -mavx512vnni
BF16_FLAGS   := $(AVX512_FLAGS) -mavx512bf16
LDFLAGS  := -fopenmp $(LINKFLAGS)
# cpp-httplib (`barellm serve`): Debian's libcpp-httplib-dev, a header and a shared library
# built with OpenSSL, zlib and brotli, whose defines the header must see the same way.
HTTPLIB_CFLAGS := $(shell pkg-config --cflags cpp-httplib 2>/dev/null || \
                    echo -DCPPHTTPLIB_OPENSSL_SUPPORT -DCPPHTTPLIB_ZLIB_SUPPORT \
                         -DCPPHTTPLIB_BROTLI_SUPPORT)
HTTPLIB_LIBS := $(shell pkg-config --libs cpp-httplib 2>/dev/null || echo -lcpp-httplib)
LDLIBS   := $(HTTPLIB_LIBS)
PYTHON   ?= python3

LIB_SRCS  := $(filter-out src/commands/main.cpp,$(wildcard src/*.cpp src/*/*.cpp src/*/*/*.cpp))
LIB_OBJS  := $(LIB_SRCS:src/%.cpp=$(BUILD)/src/%.o)
# The AVX-512 and AVX-VNNI kernels again, on SIMDe's portable intrinsics, for the unit tests:
# they run those kernels on CPUs without the features. Where this CPU has every AVX-512
# feature the kernels use, `make test` runs the AVX-512 ones natively only and leaves their
# SIMDe build to `make test SAN=1`, which builds it on every CPU (SIMDE_AVX512=1 asks for
# it anyway).
AVX512_FEATURES := avx512f avx512bw avx512vl avx512dq avx512_vnni avx512_bf16
CPU_FLAGS       := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
SIMDE_AVX512    := $(if $(filter 1,$(SAN))$(filter-out $(CPU_FLAGS),$(AVX512_FEATURES)),1,0)
SIMDE_SRCS := $(if $(filter 1,$(SIMDE_AVX512)),$(wildcard src/cpu/avx512/*_avx512*.cpp)) \
              $(wildcard src/cpu/avx2/*_avxvnni.cpp)
SIMDE_OBJS := $(SIMDE_SRCS:src/cpu/%.cpp=$(BUILD)/simde/%.o)
# -Wno-psabi: SIMDe's 256-bit vector types are returned by value, which GCC notes would be
# passed differently in code built with -mavx (none is: these objects call only each other).
# -Davx512=avx512_simde -Davxvnni=avxvnni_simde: the SIMDe objects define their kernels in
# namespaces avx512_simde and avxvnni_simde, beside the native ones.
# -DSIMDE_NO_INLINE -O1 -g1: SIMDe's intrinsics are always-inline loops; inlined into every
# kernel for 1..8 tokens, GCC took 21 minutes on the largest file (AMD EPYC Zen 3). Called
# instead, each intrinsic is compiled once per file: 20 s, with line tables only. These
# objects check results, not speed.
SIMDE_FLAGS := -DBARELLM_SIMDE -Davx512=avx512_simde -Davxvnni=avxvnni_simde -Itests/simde \
               -DSIMDE_ENABLE_NATIVE_ALIASES -DSIMDE_NO_INLINE -Wno-psabi -O1 -g1
TEST_SRCS := $(wildcard tests/*.cpp) tests/fuzz/targets.cpp
# The CUDA emulation (tests/emulation/: CUDA's execution model on the CPU) and the tests that
# run device code of kernels/ on it, compiled by $(CXX) with BARELLM_CUDA_EMULATION: they
# need no CUDA toolkit and run under SAN=1 too. -Wno-unknown-pragmas: #pragma unroll;
# -Wno-psabi: the warpgroup GEMM takes its tensor maps (64-byte aligned) by value, whose
# passing GCC notes changed in GCC 4.6 (nothing built by another compiler calls it).
EMULATION_SRCS := $(wildcard tests/emulation/*.cpp) tests/test_cuda_emulation.cpp \
                  tests/test_hopper_emulation.cpp \
                  $(wildcard tests/test_emulated_*.cpp)
EMULATION_FLAGS := -DBARELLM_CUDA_EMULATION -Itests/emulation -Ikernels -Wno-unknown-pragmas \
                   -Wno-psabi
TEST_SRCS += $(wildcard tests/emulation/*.cpp)
TEST_OBJS := $(TEST_SRCS:tests/%.cpp=$(BUILD)/tests/%.o)
TOOL_SRCS := $(wildcard tests/tools/*.cpp)
TOOLS     := $(TOOL_SRCS:tests/tools/%.cpp=$(BUILD)/%)

# -O1 -g1 under the sanitizers: their usual level, with line tables for their reports; the
# build takes half the time of -O2 -g.
ifeq ($(SAN),1)
SANITIZE  := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
CXXFLAGS  += $(SANITIZE) -O1 -g1
LDFLAGS   += $(SANITIZE)
override CUDA := 0
endif

CUDA          ?= 1
CUDA_ARCHS    ?= 75 80 90a
CUDA_PTX_ARCH ?= 90
ifeq ($(CUDA),0)
override NVCC :=
else ifndef NVCC
NVCC := $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
endif
ifneq ($(NVCC),)
CUDA_HOME   := $(patsubst %/bin/nvcc,%,$(realpath $(NVCC)))
CUDA_LIBDIR ?= $(firstword $(dir $(wildcard $(CUDA_HOME)/lib64/libcudart_static.a \
                   $(CUDA_HOME)/lib/libcudart_static.a \
                   $(CUDA_HOME)/targets/x86_64-linux/lib/libcudart_static.a)) $(CUDA_HOME)/lib64)
NVCC_GENCODE := $(foreach arch,$(CUDA_ARCHS),-gencode arch=compute_$(arch),code=sm_$(arch)) \
                -gencode arch=compute_$(CUDA_PTX_ARCH),code=compute_$(CUDA_PTX_ARCH)
NVCCFLAGS := -std=c++17 -O3 -lineinfo -Isrc -Ikernels -DBARELLM_CUDA $(CPPFLAGS) $(NVCC_GENCODE) \
             -Xcompiler -Wall,-Wextra -MMD -MP
# The warpgroup GEMM (kernels/gemm_warpgroup.cuh) has a body only in an sm_90a image.
ifneq ($(filter 90a,$(CUDA_ARCHS)),)
NVCCFLAGS += -DBARELLM_CUDA_SM90A_IMAGE
endif
CXXFLAGS  += -DBARELLM_CUDA
LDLIBS    += -L$(CUDA_LIBDIR) -lcudart_static -ldl -lrt -lpthread
CUDA_OBJS := $(patsubst kernels/%.cu,$(BUILD)/kernels/%.o,$(wildcard kernels/*.cu))
TOOLS     += $(patsubst tests/tools/%.cu,$(BUILD)/%,$(wildcard tests/tools/*.cu))
CUDA_TOOL_OBJS := $(patsubst tests/tools/%.cu,$(BUILD)/tools/%.o,$(wildcard tests/tools/*.cu))
endif

# The emulated backend (`make emulated`): the CUDA backend whole (kernels/*.cu, the launch
# functions and forward passes with them) compiled by $(CXX) on the CUDA emulation and its
# emulated runtime (tests/emulation/cuda_runtime_emulation.h), into build/emulated/barellm,
# dump_logits and step_logits, whose --device cuda runs every kernel on the CPU. The sources
# that say whether the build has CUDA are compiled again with BARELLM_CUDA; the rest of the
# library is the CPU build's. No CUDA toolkit needed; tests/test_cuda_emulated.py runs them.
EMULATED         := $(BUILD)/emulated
EMULATED_FLAGS   := $(EMULATION_FLAGS) -DBARELLM_EMULATED_BACKEND -DBARELLM_CUDA \
                    -DBARELLM_CUDA_SM90A_IMAGE
EMULATED_AGAIN   := src/backend.cpp src/commands/ladder.cpp
EMULATED_KERNELS := $(patsubst kernels/%.cu,$(EMULATED)/kernels/%.o,$(wildcard kernels/*.cu))
EMULATED_LIB     := $(filter-out $(EMULATED_AGAIN:src/%.cpp=$(BUILD)/src/%.o),$(LIB_OBJS)) \
                    $(EMULATED_AGAIN:src/%.cpp=$(EMULATED)/src/%.o) $(EMULATED_KERNELS) \
                    $(patsubst tests/%.cpp,$(BUILD)/tests/%.o,$(wildcard tests/emulation/*.cpp))
EMULATED_TOOLS   := $(EMULATED)/barellm $(EMULATED)/dump_logits $(EMULATED)/step_logits

# The flags every object was built with: when they change (CUDA on or off, other archs),
# everything is rebuilt rather than linked from objects of another configuration.
CONFIG      := $(BUILD)/config.txt
CONFIG_TEXT := $(CXX) $(CXXFLAGS) $(VNNI_FLAGS) $(BF16_FLAGS) $(AVXVNNI_FLAGS) | $(NVCC) $(NVCCFLAGS) \
               | SIMDE_AVX512=$(SIMDE_AVX512) $(SIMDE_FLAGS)
$(shell mkdir -p $(BUILD) && (echo '$(CONFIG_TEXT)' | cmp -s - $(CONFIG) || \
    echo '$(CONFIG_TEXT)' > $(CONFIG)))

# `make clean all -jN` must not build while clean deletes.
ifneq ($(filter clean,$(MAKECMDGOALS)),)
.NOTPARALLEL:
endif

.PHONY: all test clean fuzz bench emulated
.PRECIOUS: $(BUILD)/tools/%.o
# The longest compilations (nvcc's, one image per GPU architecture, and the SIMDe objects) are
# named first, so that with -j they start first instead of running alone at the end.
all: $(CUDA_OBJS) $(CUDA_TOOL_OBJS) $(SIMDE_OBJS) $(EMULATED_KERNELS) $(BUILD)/barellm \
     $(BUILD)/unit_tests $(TOOLS) $(EMULATED_TOOLS)

$(CONFIG):
	@mkdir -p $(dir $@)
	@echo '$(CONFIG_TEXT)' > $@

$(BUILD)/src/%_avx2.o: src/%_avx2.cpp $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(SIMD_FLAGS) -c $< -o $@

$(BUILD)/src/%_avxvnni.o: src/%_avxvnni.cpp $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(AVXVNNI_FLAGS) -c $< -o $@

$(BUILD)/src/%_avx512.o: src/%_avx512.cpp $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(AVX512_FLAGS) -c $< -o $@

$(BUILD)/src/%_avx512vnni.o: src/%_avx512vnni.cpp $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(VNNI_FLAGS) -c $< -o $@

$(BUILD)/src/%_avx512bf16.o: src/%_avx512bf16.cpp $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(BF16_FLAGS) -c $< -o $@

# SIMDe's AVX-512 is built from plain C++ here (no -m flags): it runs on any x86-64 CPU.
$(BUILD)/simde/%.o: src/cpu/%.cpp $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) $(SIMDE_FLAGS) -c $< -o $@

# The AVX-VNNI files share the AVX2 headers' inline helpers (namespace avx2): their SIMDe
# objects compile those on SIMDe's intrinsics, as avx2_simde, apart from the native ones.
$(BUILD)/simde/avx2/%_avxvnni.o: SIMDE_FLAGS += -Davx2=avx2_simde

$(BUILD)/src/%.o: src/%.cpp $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/src/serve/http_server.o: CXXFLAGS += $(HTTPLIB_CFLAGS)

# Catch2's main pulls in std::regex, where GCC 12 with the sanitizers reports a false
# -Wmaybe-uninitialized inside the standard library's headers.
$(BUILD)/tests/catch_main.o: CXXFLAGS += -Wno-maybe-uninitialized

$(EMULATION_SRCS:tests/%.cpp=$(BUILD)/tests/%.o): CXXFLAGS += $(EMULATION_FLAGS)

# The test files (Catch2's macros, the references, the emulated kernels they instantiate) at
# -O1 with line tables: half the compile time of -O2 -g, in both passes. The library and the
# emulation's runtime (tests/emulation/) keep -O2 -g.
$(BUILD)/tests/test_%.o $(BUILD)/tests/catch_main.o: CXXFLAGS += -O1 -g1

$(BUILD)/tests/%.o: tests/%.cpp $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -Itests -DBARELLM_SIMDE_AVX512=$(SIMDE_AVX512) -c $< -o $@

$(BUILD)/tools/%.o: tests/tools/%.cpp $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -c $< -o $@

$(BUILD)/kernels/%.o: kernels/%.cu $(CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/tools/%.o: tests/tools/%.cu $(CONFIG)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/barellm: $(BUILD)/src/commands/main.o $(LIB_OBJS) $(CUDA_OBJS)
	$(CXX) $^ $(LDFLAGS) $(LDLIBS) -o $@

$(BUILD)/unit_tests: $(TEST_OBJS) $(SIMDE_OBJS) $(LIB_OBJS) $(CUDA_OBJS)
	$(CXX) $^ $(LDFLAGS) $(LDLIBS) -o $@

$(BUILD)/%: $(BUILD)/tools/%.o $(LIB_OBJS) $(CUDA_OBJS)
	$(CXX) $^ $(LDFLAGS) $(LDLIBS) -o $@

emulated: $(EMULATED_TOOLS)

$(EMULATED)/kernels/%.o: kernels/%.cu $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) -x c++ $(CXXFLAGS) $(EMULATED_FLAGS) -c $< -o $@

$(EMULATED)/src/%.o: src/%.cpp $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -DBARELLM_CUDA -c $< -o $@

$(EMULATED)/tools/%.o: tests/tools/%.cpp $(CONFIG)
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -DBARELLM_CUDA -c $< -o $@

$(EMULATED)/barellm: $(EMULATED)/src/commands/main.o $(EMULATED_LIB)
	$(CXX) $^ $(LDFLAGS) $(HTTPLIB_LIBS) -o $@

$(EMULATED)/%: $(EMULATED)/tools/%.o $(EMULATED_LIB)
	$(CXX) $^ $(LDFLAGS) $(HTTPLIB_LIBS) -o $@

# The C++ unit tests, then pytest on every core (pytest-xdist's workers take the tests one at
# a time, so that no file's minutes end the run on one worker; one worker where xdist is not
# installed). SAN=1 runs the unit tests and the Python tests marked `sanitize`
# (tests/conftest.py says which and why).
PYTEST_WORKERS ?= $(NPROC)
PYTEST_PARALLEL = $(shell $(PYTHON) -c 'import xdist' 2>/dev/null && \
                    printf -- '-n %s --dist load' $(PYTEST_WORKERS))
PYTEST_SELECT   := $(if $(filter 1,$(SAN)),-m sanitize)
test: all
	$(BUILD)/unit_tests
	BARELLM_BUILD=$(BUILD) $(PYTHON) -m pytest -q -rs $(PYTEST_PARALLEL) $(PYTEST_SELECT) tests

# The standard benchmark set (scripts/bench.sh): model speed and tokenizer speed.
bench: $(BUILD)/barellm $(BUILD)/tokenize_json
	scripts/bench.sh

# libFuzzer targets: the code that reads untrusted input (files, text, ids, argv), and the CPU
# backend that runs the weight files the loader takes. The sources they share (the library
# but the HTTP server) are compiled once (with -fsanitize=fuzzer-no-link: coverage without a
# main), each kernel file with its instruction set's flags, and linked into each target; the
# targets run side by side, one per core (make -j).
FUZZ_CXX     ?= clang++
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := model_file tokenizer_encode tokenizer_decode command_line regex chat_request
FUZZ_SRCS    := $(filter-out src/serve/http_server.cpp,$(LIB_SRCS)) tests/fuzz/targets.cpp
FUZZ_OBJS    := $(FUZZ_SRCS:%.cpp=$(BUILD)/fuzz/obj/%.o)
FUZZ_FLAGS   := -std=c++17 -O1 -g -fopenmp -Isrc -Itests $(CPPFLAGS) \
                -fsanitize=address,undefined -fno-sanitize-recover=undefined

.SECONDARY: $(FUZZ_OBJS)
$(BUILD)/fuzz/obj/%_avx2.o: FUZZ_FLAGS += $(SIMD_FLAGS)
$(BUILD)/fuzz/obj/%_avxvnni.o: FUZZ_FLAGS += $(AVXVNNI_FLAGS)
$(BUILD)/fuzz/obj/%_avx512.o: FUZZ_FLAGS += $(AVX512_FLAGS)
$(BUILD)/fuzz/obj/%_avx512vnni.o: FUZZ_FLAGS += $(VNNI_FLAGS)
$(BUILD)/fuzz/obj/%_avx512bf16.o: FUZZ_FLAGS += $(BF16_FLAGS)
# The SIMD kernels at -O0, with both sanitizers still: at -O1 clang took 100 to 270 s on each
# of the five tile kernels (gemm_blocks_avx2.cpp: 7 s at -O0, 18 s at -O1 with
# AddressSanitizer alone, which would miss the undefined behaviour fuzzing has found in the
# kernels). model_file then runs about half as many inputs in its 30 s.
$(BUILD)/fuzz/obj/src/cpu/avx2/%.o $(BUILD)/fuzz/obj/src/cpu/avx512/%.o: FUZZ_FLAGS += -O0
$(BUILD)/fuzz/obj/%.o: %.cpp $(CONFIG)
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

$(BUILD)/fuzz/fuzz_%: tests/fuzz/fuzz_%.cpp $(FUZZ_OBJS) tests/fuzz/targets.h
	@mkdir -p $(dir $@)
	$(FUZZ_CXX) $(FUZZ_FLAGS) -fsanitize=fuzzer $< $(FUZZ_OBJS) -o $@

# Each target runs on a working copy of its seed corpus; a crash stops `make fuzz` and
# leaves the input in $(BUILD)/fuzz/<target>-crash-*: fix it, then keep the input in
# tests/fuzz/regressions/<target>/ (the unit tests replay that folder).
.PHONY: $(FUZZ_TARGETS:%=fuzz-%)
$(FUZZ_TARGETS:%=fuzz-%): fuzz-%: $(BUILD)/fuzz/fuzz_%
	@mkdir -p $(BUILD)/fuzz/corpus/$*
	@cp -n tests/fuzz/corpus/$*/* $(BUILD)/fuzz/corpus/$*/
	@echo "fuzzing $* for $(FUZZ_SECONDS) s"
	@$(BUILD)/fuzz/fuzz_$* -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	    -artifact_prefix=$(BUILD)/fuzz/$*- $(BUILD)/fuzz/corpus/$* \
	    2>$(BUILD)/fuzz/$*.log || { tail -40 $(BUILD)/fuzz/$*.log; exit 1; }
	@echo "$*: $$(grep -E 'stat::number_of_executed_units' $(BUILD)/fuzz/$*.log | tail -1)"

fuzz: $(FUZZ_TARGETS:%=fuzz-%)

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)

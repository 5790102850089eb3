#!/usr/bin/env bash
# Builds llama.cpp's llama-bench, llama-perplexity, llama-simple (greedy completion),
# llama-quantize (writes the Q4_K_M, Q5_K_M, Q6_K, ... GGUFs people download),
# llama-tokenize (token ids, for tests/test_gemma_tokenizer.py) and llama-server (the HTTP
# server scripts/load_test.py measures `barellm serve` against) for CPU, or
# with --cuda for NVIDIA GPUs too, to compare barellm with on the same weights
# (scripts/compare_llamacpp.sh; dev/gpu/check.sh --stage builds the CUDA one it carries).
#
#   scripts/build_llamacpp.sh DIR [--version V] [--sdist FILE] [--cuda ARCHS] [-j N]
#
# llama.cpp's sources come from the PyPI source distribution of llama-cpp-python, which
# vendors them (vendor/llama.cpp): `pip download --no-binary :all: --no-deps` fetches it
# into a temporary directory, so only PyPI needs to be reachable. Nothing of llama.cpp
# enters this repository: the sources are extracted into DIR, built in
# DIR/llama_cpp_python-V/vendor/llama.cpp/build, and DIR/bin gets links to the binaries
# (DIR must be outside the repository; a path inside it is refused). DIR/models links to
# llama.cpp's models/ folder: its vocabulary-only GGUF files (ggml-vocab-llama-spm.gguf is
# the Llama 2 tokenizer) give convert/synth.py a tokenizer without a model hub. Running
# it again reuses the tree and rebuilds only what changed.
#
#   --version V   llama-cpp-python version (default 0.3.36, the one checked here);
#                 "latest" takes whatever pip finds
#   --sdist FILE  use an already downloaded llama_cpp_python-*.tar.gz instead
#   --no-amx      leave out llama.cpp's AMX kernels (Intel Sapphire Rapids and later):
#                 with Linux granting AMX tile data one thread at a time, the Q8_0/Q4_0
#                 kernels of this llama.cpp die of an illegal instruction (exit status 132)
#                 in its worker threads; barellm has no AMX kernels either
#   --no-avx512   leave out every AVX-512 kernel (-mno-avx512f takes its extensions with
#                 it): on a CPU with AVX-512 and AVX-VNNI, a build like that of an Intel
#                 client CPU (Alder Lake and later: AVX2, AVX-VNNI), to compare with
#                 `barellm --simd avx2`
#   --cuda ARCHS  also build llama.cpp's CUDA backend for these GPU architectures
#                 (CMake's CUDA_ARCHITECTURES, e.g. 90 or "80 90"); needs nvcc on PATH or in
#                 /usr/local/cuda/bin. cuBLAS is linked from the toolkit (a machine that
#                 runs the binaries needs the same major CUDA version); NCCL is left out
#   --portable    tune for no particular CPU (AVX2/FMA/F16C, nothing newer) instead of
#                 this one: binaries to carry to another x86-64 machine (dev/gpu/check.sh
#                 --stage builds llama.cpp here for the GPU machine, which cannot spend its
#                 minutes on it)
#   -j N          parallel jobs (default: the number of cores)
#
# Needs: python3 with pip, cmake >= 3.14, a C/C++17 compiler. The build is
# -DGGML_NATIVE=ON unless --portable (tuned to this machine, like barellm's runtime
# dispatch picks its best kernels), Release, no curl.
set -euo pipefail

usage() { sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

[ $# -ge 1 ] || usage
case "$1" in -h|--help) usage 0 ;; esac
dest=$1; shift
version=0.3.36
sdist=""
cpu_flags=""
native=(-DGGML_NATIVE=ON)
cuda_options=()
targets=(llama-bench llama-perplexity llama-simple llama-quantize llama-tokenize llama-server)
jobs=$(nproc 2>/dev/null || echo 2)
while [ $# -gt 0 ]; do
    case "$1" in
        --version) version=$2; shift 2 ;;
        --sdist) sdist=$(realpath "$2"); shift 2 ;;
        --no-amx) cpu_flags+=" -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"; shift ;;
        --no-avx512) cpu_flags+=" -mno-avx512f"; shift ;;
        # --allow-shlib-undefined: the tools link without the driver's libcuda.so.1, which a
        # machine without a GPU lacks; they find it where they run.
        --cuda) cuda_options=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${2// /;}"
                              -DGGML_CUDA_NCCL=OFF
                              "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined"); shift 2 ;;
        --portable) native=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
                            -DGGML_F16C=ON -DGGML_BMI2=ON); shift ;;
        -j) jobs=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        *) echo "build_llamacpp: unknown option $1" >&2; usage ;;
    esac
done

for tool in python3 cmake c++; do
    command -v "$tool" >/dev/null || { echo "build_llamacpp: $tool not found" >&2; exit 1; }
done
if [ ${#cuda_options[@]} -gt 0 ] && ! command -v nvcc >/dev/null; then
    [ -x /usr/local/cuda/bin/nvcc ] || { echo "build_llamacpp: --cuda: nvcc not found" >&2; exit 1; }
    export PATH=/usr/local/cuda/bin:$PATH
fi

repo=$(cd "$(dirname "$0")/.." && pwd -P)
dest=$(realpath -m "$dest")
case "$dest/" in
    "$repo"/*) echo "build_llamacpp: $dest is inside the repository; build elsewhere" >&2
               exit 1 ;;
esac
mkdir -p "$dest"

if [ -z "$sdist" ]; then
    download=$(mktemp -d)
    trap 'rm -rf "$download"' EXIT
    spec=llama-cpp-python
    [ "$version" = latest ] || spec="llama-cpp-python==$version"
    echo "build_llamacpp: downloading the $spec source distribution from PyPI"
    python3 -m pip download -q --no-binary :all: --no-deps \
        -d "$download" "$spec"
    found=("$download"/llama_cpp_python-*.tar.gz)
    sdist=${found[0]}
fi
[ -f "$sdist" ] || { echo "build_llamacpp: no source distribution found" >&2; exit 1; }

name=$(basename "$sdist" .tar.gz)
if [ ! -d "$dest/$name" ]; then
    echo "build_llamacpp: extracting $(basename "$sdist") into $dest"
    tar -xzf "$sdist" -C "$dest"
fi
tree="$dest/$name/vendor/llama.cpp"
[ -f "$tree/CMakeLists.txt" ] || { echo "build_llamacpp: $tree has no llama.cpp" >&2; exit 1; }

echo "build_llamacpp: configuring $tree"
# An explicit -mno-* outlasts -march=native whatever their order (GCC and Clang).
cmake -S "$tree" -B "$tree/build" -DCMAKE_BUILD_TYPE=Release "${native[@]}" \
    -DCMAKE_C_FLAGS="$cpu_flags" -DCMAKE_CXX_FLAGS="$cpu_flags" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF "${cuda_options[@]}" >/dev/null
echo "build_llamacpp: building ${targets[*]} with $jobs jobs (several minutes)"
cmake --build "$tree/build" --target "${targets[@]}" -j "$jobs"

# The binaries load libllama/libggml from their own directory: link, do not copy.
mkdir -p "$dest/bin"
for target in "${targets[@]}"; do
    ln -sf "$tree/build/bin/$target" "$dest/bin/$target"
done
ln -sfn "$tree/models" "$dest/models"
version_line=$("$dest/bin/llama-bench" --version 2>&1 | grep -m1 '^version' || true)
echo "build_llamacpp: done ($name, llama.cpp ${version_line#version: }):"
for target in "${targets[@]}"; do echo "  $dest/bin/$target"; done
echo "  $dest/models/ggml-vocab-llama-spm.gguf (the Llama 2 tokenizer, for convert/synth.py)"

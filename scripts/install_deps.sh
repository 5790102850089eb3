#!/usr/bin/env bash
# Installs everything barellm needs to build and test on Debian/Ubuntu:
# a C++17 compiler with OpenMP, clang with its OpenMP and sanitizer runtimes (`make fuzz`),
# nlohmann/json, Catch2, cpp-httplib (`barellm serve`), SIMDe (the unit tests run the AVX-512
# kernels on it where the CPU has no AVX-512), the Python packages, and GNU time
# (the peak memory in scripts/compare_llamacpp.sh).
# nvcc (the CUDA toolkit) is optional: without it the CPU-only build is made.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq g++ clang libclang-rt-dev libomp-dev make nlohmann-json3-dev catch2 libcpp-httplib-dev pkg-config libsimde-dev python3 python3-pip time >/dev/null
requirements="-r convert/requirements.txt -r tests/requirements.txt"
# Debian's own python3 refuses pip installs outside a venv (PEP 668) unless told.
python3 -m pip install -q $requirements 2>/dev/null ||
    python3 -m pip install -q --break-system-packages $requirements

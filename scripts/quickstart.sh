#!/usr/bin/env bash
# From a fresh clone: install dependencies, build, convert the default model and
# complete a prompt. The default model is stories260K from ../shared when present.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install_deps.sh
make -j"$(nproc)" build/barellm

SOURCE=../shared/models/stories260K
MODEL=models/stories260K-f32.bin
if [ ! -f "$MODEL" ]; then
    if [ ! -d "$SOURCE" ]; then
        cat >&2 <<'MSG'
quickstart: no default model: ../shared/models/stories260K is absent.
Download a Hugging Face Llama checkpoint (config.json, *.safetensors, tokenizer.json or
tokenizer.model), for example stories260K or TinyLlama-1.1B, then convert and run it:
    python3 convert/convert.py HF_DIR -o models/model.bin --dtype f16
    build/barellm run models/model.bin -p "Once upon a time"
MSG
        exit 1
    fi
    mkdir -p models
    python3 convert/convert.py "$SOURCE" -o "$MODEL" --dtype f32
fi
build/barellm run "$MODEL" -p "${1:-Once upon a time}" --temp 0 -n 200

#!/usr/bin/env bash
# The standard benchmark set on this machine (`make bench`): barellm bench on stories260K
# and on a TinyLlama-1.1B-shaped synthetic checkpoint in f16, bf16 and q8, then the
# tokenizer against pip tokenizers. Models are made once under models/bench/.
#   THREADS (default: the physical cores, as barellm's own default), REPS (default 5), PROMPT (default 512), GEN (default 64)
set -euo pipefail
cd "$(dirname "$0")/.."

THREADS=${THREADS:-$(lscpu -p=Core,Socket | grep -v '^#' | sort -u | wc -l)}
REPS=${REPS:-5}
PROMPT=${PROMPT:-512}
GEN=${GEN:-64}
DIR=models/bench
BARELLM=build/barellm
mkdir -p "$DIR"

if [ -d ../shared/models/stories260K ] && [ ! -f "$DIR/stories260K-f32.bin" ]; then
    python3 convert/convert.py ../shared/models/stories260K -o "$DIR/stories260K-f32.bin" --dtype f32
fi
if [ ! -d "$DIR/tinyllama-hf" ]; then
    python3 convert/synth.py --preset tinyllama-1.1b -o "$DIR/tinyllama-hf" --dtype f16 --seed 1
fi
for dtype in f16 bf16 q8; do
    if [ ! -f "$DIR/tinyllama-$dtype.bin" ]; then
        python3 convert/convert.py "$DIR/tinyllama-hf" -o "$DIR/tinyllama-$dtype.bin" --dtype "$dtype"
    fi
done

echo "## barellm bench: $THREADS threads, -p $PROMPT -n $GEN -r $REPS, commit $(git rev-parse --short HEAD)"
echo
if [ -f "$DIR/stories260K-f32.bin" ]; then
    "$BARELLM" bench "$DIR/stories260K-f32.bin" --threads "$THREADS" -p "$PROMPT" -n 128 -r "$REPS"
    echo
fi
for dtype in f16 bf16 q8; do
    "$BARELLM" bench "$DIR/tinyllama-$dtype.bin" --threads "$THREADS" -p "$PROMPT" -n "$GEN" -r "$REPS"
    echo
done
echo "## tokenizer"
echo
python3 scripts/bench_tokenizer.py

# Steps shared by dev/gpu/gpu_session.sh and dev/gpu/gpu_decode_profile.sh, sourced by them
# from the repository root once WORK and LOG are set and note() and step() are defined.

# ../shared (models and tokenizers) from the copy `dev/gpu/gpu_session.sh --stage` made.
link_staged_shared() {
    if [ ! -e ../shared ] && [ -d gpu_data/shared ]; then ln -s "$PWD/gpu_data/shared" ../shared; fi
}

# The Mistral-7B-shaped f16 checkpoint $MISTRAL, written in the background (about 14.5 GB
# twice) unless it exists; MISTRAL_PID is its process, empty when nothing was started.
MISTRAL=$WORK/mistral-7b-f16.bin
MISTRAL_PID=
start_mistral_checkpoint() {
    [ -f "$MISTRAL" ] && return
    step "generating the Mistral-7B-shaped f16 checkpoint in the background"
    (
        rm -rf "$WORK/mistral-hf" &&
            python3 convert/synth.py --preset mistral-7b --dtype f16 -o "$WORK/mistral-hf" &&
            python3 convert/convert.py "$WORK/mistral-hf" -o "$MISTRAL" --dtype f16 &&
            rm -rf "$WORK/mistral-hf"
    ) >"$LOG/mistral_synth.log" 2>&1 &
    MISTRAL_PID=$!
}

# Waits for the checkpoint until DEADLINE seconds into the run (the device tool stops a
# command at 600), then gives up on it; $MISTRAL exists afterwards only if it is complete.
wait_for_mistral_checkpoint() {
    local deadline=$1
    [ -n "$MISTRAL_PID" ] || return 0
    step "waiting for the Mistral-7B checkpoint (until ${deadline}s)"
    while kill -0 "$MISTRAL_PID" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 2; done
    if kill -0 "$MISTRAL_PID" 2>/dev/null; then
        kill "$MISTRAL_PID"
        note "Mistral-7B checkpoint not ready at ${SECONDS}s: its benchmarks are skipped"
    elif ! wait "$MISTRAL_PID"; then
        note "Mistral-7B checkpoint generation failed: $(tail -1 "$LOG/mistral_synth.log")"
    fi
    MISTRAL_PID=
}

# make TARGETS for this GPU only (CUDA_ARCHS: one architecture keeps nvcc fast), the log
# in $LOG/build.log; CPPFLAGS_EXTRA points at the staged nlohmann/json headers if any.
CPPFLAGS_EXTRA=""
[ -d gpu_data/include ] && CPPFLAGS_EXTRA="-I$PWD/gpu_data/include"
build_for_gpu() {
    make -j"$(nproc)" CUDA_ARCHS="$CUDA_ARCHS" CUDA_PTX_ARCH="${CUDA_ARCHS##* }" \
        CPPFLAGS="$CPPFLAGS_EXTRA" "$@" >"$LOG/build.log" 2>&1
}

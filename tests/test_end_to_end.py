"""The C++ CPU backend against the independent numpy reference (reference/model.py):
logits at every position, decode (one token at a time) and prefill (one batch)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as reference  # noqa: E402
from convert_testlib import BUILD, CONVERT, STORIES, SYNTH, need_shared, run  # noqa: E402

DUMP_LOGITS = os.path.join(BUILD, "dump_logits")

# Prompt ids long enough to cross the prefill GEMM's 4-token tiles unevenly.
IDS = [1, 403, 407, 261, 378, 425, 301, 282, 500, 117, 300, 99, 2, 45, 67, 12, 480, 333, 7]


def barellm_logits(model, ids, *flags):
    """Logits [len(ids), vocab] from build/dump_logits."""
    if not os.path.exists(DUMP_LOGITS):
        pytest.fail(f"{DUMP_LOGITS} is missing: run `make` first")
    out = model + ".logits"
    subprocess.run([DUMP_LOGITS, model, out, *map(str, ids), *flags], check=True)
    return np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)


def relative_error(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def check_quantized_logits(model, want):
    """The logits of the integer-weight `model` (q8, q4) at IDS against `want`, the
    reference fed its dequantized weights: the scalar path uses those weights exactly;
    SIMD decode, and the VNNI prefill GEMMs, also quantize the activations to 8 bits
    (integer dot products), a small extra error. Decode and prefill, on the best level
    and on AVX2 (with AVX-VNNI where the CPU has it: the Q8 and Q4 tiles there)."""
    scalar = barellm_logits(model, IDS, "--kv", "f32", "--simd", "scalar")
    assert relative_error(scalar, want) < 1e-4
    levels = [[], ["--simd", "avx2"]] if "avx2" in cpuinfo("flags") else [[]]
    for level in levels:
        for flags in ([], ["--prefill"]):
            got = barellm_logits(model, IDS, "--kv", "f32", *level, *flags)
            assert relative_error(got, want) < 2e-2, (level, flags)
            assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() > 0.9, (level, flags)


def cpuinfo(key):
    """The words of the first line of /proc/cpuinfo that starts with `key` (the first CPU's),
    after its colon."""
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        return next((line.partition(":")[2].split() for line in f if line.startswith(key)), [])


def rounds_x_to_bf16():
    """Whether bf16 weights' matrix products (decode and prefill) round x to bf16 on this
    CPU: they multiply with vdpbf16ps where the CPU has AVX-512 F/BW/VL/DQ and AVX512_BF16
    and is an AMD one (cpu::cpu_prefers_bf16_dot_products)."""
    return cpuinfo("vendor_id") == ["AuthenticAMD"] and {
        "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
        "avx512_bf16"} <= set(cpuinfo("flags"))


def bf16_tolerance(tolerance):
    """The tolerance for bf16 weights' logits: where the matrix products round x to bf16, x
    keeps 8 significant bits at every product (measured: 1.8e-3 on stories260K, up to 6e-3
    on the tiny Qwen test shapes), else `tolerance`."""
    return max(tolerance, 1e-2) if rounds_x_to_bf16() else tolerance


def convert(hf_dir, out, dtype):
    result = run(CONVERT, hf_dir, "-o", out, "--dtype", dtype)
    assert result.returncode == 0, result.stderr
    return out


# f32 weights with an f32 KV cache must match to float rounding; f16 and bf16 weights
# are compared against the reference on the same (rounded) weights, with an f16 cache.
@pytest.mark.parametrize("dtype,kv,tolerance", [("f32", "f32", 1e-4), ("f32", "f16", 1e-3),
                                                ("f16", "f16", 1e-3), ("bf16", "f16", 1e-3)])
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_stories260k_logits_match_reference(tmp_path, dtype, kv, tolerance, mode):
    need_shared(STORIES)
    model = convert(STORIES, str(tmp_path / f"stories-{dtype}.bin"), dtype)
    want = reference.logits_for(model, IDS)
    flags = ["--kv", kv] + (["--prefill"] if mode == "prefill" else [])
    got = barellm_logits(model, IDS, *flags)
    if dtype == "bf16":
        tolerance = bf16_tolerance(tolerance)
    assert relative_error(got, want) < tolerance
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


def test_q8_matches_reference(tmp_path):
    """Q8: the scalar path uses the dequantized weights exactly; SIMD decode and the
    AVX-512 VNNI prefill also quantize the activations, a small extra error."""
    need_shared(STORIES)
    model = convert(STORIES, str(tmp_path / "stories-q8.bin"), "q8")
    want = reference.logits_for(model, IDS)
    check_quantized_logits(model, want)


def test_scalar_path_matches_reference(tmp_path):
    need_shared(STORIES)
    model = convert(STORIES, str(tmp_path / "stories-f16.bin"), "f16")
    got = barellm_logits(model, IDS, "--kv", "f32", "--simd", "scalar")
    assert relative_error(got, reference.logits_for(model, IDS)) < 1e-4


# Shapes that stress what stories260K does not: a sliding window shorter than the prompt,
# head_dim * heads != dim, llama3 RoPE scaling, untied output, sizes off the SIMD width.
SYNTHETIC = {
    "mistral-window": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 40,
        "intermediate_size": 100, "num_hidden_layers": 3, "num_attention_heads": 5,
        "num_key_value_heads": 1, "vocab_size": 512, "max_position_embeddings": 64,
        "sliding_window": 6, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2},
    "llama3-scaling": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 48,
        "intermediate_size": 70, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 18, "vocab_size": 512,
        "max_position_embeddings": 64, "rope_theta": 500000.0, "rms_norm_eps": 1e-6,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2},
}


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_synthetic_shapes_match_reference(tmp_path, name, mode):
    need_shared(STORIES)
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(SYNTHETIC[name]))
    hf_dir = tmp_path / "hf"
    result = run(SYNTH, "--config", config_path, "--tokenizer", STORIES, "-o", hf_dir,
                 "--dtype", "f32", "--seed", "3")
    assert result.returncode == 0, result.stderr
    model = convert(str(hf_dir), str(tmp_path / "model.bin"), "f32")
    want = reference.logits_for(str(hf_dir), IDS)
    flags = ["--kv", "f32"] + (["--prefill"] if mode == "prefill" else [])
    assert relative_error(barellm_logits(model, IDS, *flags), want) < 1e-4

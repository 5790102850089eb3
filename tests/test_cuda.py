"""The CUDA backend against the CPU backend: logits at every position, for stories260K and
synthetic checkpoints with awkward shapes (sizes off every vector width, GQA, a group of 8
query heads per KV head, head_dim 34/64/128, a sliding window shorter than the prompt,
llama3 RoPE scaling, tied and untied output), synthetic Qwen2 and Qwen3 checkpoints (q/k/v
and o biases, per-head q/k norms, a sliding window on some layers only), synthetic Gemma 3
checkpoints (scaled embeddings, post norms, GeGLU, sliding and full layers with their own
RoPE, query_pre_attn_scalar; Gemma 3 1B's heads of 256) and Gemma 2 ones (soft-capped
scores and logits), f32/f16/bf16/q8/q4
weights (q8 and q4: the GPU quantizes the activations to int8 as the CPU does, and the
logits follow the CPU's within QUANTIZED_TOLERANCE; a q4 file keeps f16 the matrices whose
columns are not a multiple of 32), f32/f16 KV cache, contexts of 1, 7, 100 and 4096
positions; the batched prefill's logits at every position (one batch and more than one;
q8 and q4 against the CPU's scalar path and its prefill, QUANTIZED_PREFILL_TOLERANCE) and
`ppl`; the prefill on the warpgroup GEMM of sm_90a (BARELLM_CUDA_WGMMA=always; q8 and q4
dequantized to f16 for it); plus every
kernel on its own (build/cuda_kernel_check), the server's step over the paged KV cache
(build/step_logits: several sequences at once, decode rows beside prompt chunks, on the
batched matvec and on the GEMMs, scattered block tables, copied blocks), graph replay against direct launches,
decode with programmatic dependent launch (BARELLM_CUDA_PDL=1) against plain launches, every
rung of the GPU ladder on Qwen (and its refusal of Gemma on rungs 1-4), `run` and `bench`;
synthetic Mixtral and Qwen3-MoE checkpoints (decode, prefill and the server's step); files
of ggml's block types, a type per matrix (Q2_K, Q3_K_M, Q4_K_M, Q5_K_M, Q6_K, IQ4_XS and
IQ4_NL mixes: decode, prefill and the server's step against the CPU's scalar path).

Every test but the last skips, printing why, on a machine without a usable CUDA GPU (CI
never has one); the last checks what `--device cuda` says there.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from convert_testlib import (BUILD, CONVERT, SHARED, STORIES, SYNTH,  # noqa: E402
                             TINY_CONFIG, cuda_unavailable_reason, make_checkpoint,
                             need_shared, require_cuda, run, tiny_tensors, tiny_tokenizer_json)
from test_gemma import CONFIGS as GEMMA_CPU_CONFIGS, gemma_tensors  # noqa: E402
from test_gpt_oss import BLOCK_SHAPE as GPT_OSS_BLOCK_SHAPE  # noqa: E402
from test_gpt_oss import CONFIG as GPT_OSS_CONFIG  # noqa: E402
from test_gpt_oss import MXFP4_CONFIG as GPT_OSS_MXFP4_CONFIG  # noqa: E402
from test_gpt_oss import checkpoint as gpt_oss_checkpoint, gpt_oss_tensors  # noqa: E402
from test_moe import checkpoint as moe_checkpoint  # noqa: E402
from test_qwen import convert as convert_model  # noqa: E402
from test_qwen import CONFIGS as QWEN_CPU_CONFIGS, qwen_tensors  # noqa: E402

BARELLM = os.path.join(BUILD, "barellm")
DUMP_LOGITS = os.path.join(BUILD, "dump_logits")
EMULATED_DUMP_LOGITS = os.path.join(BUILD, "emulated", "dump_logits")
STEP_LOGITS = os.path.join(BUILD, "step_logits")
KERNEL_CHECK = os.path.join(BUILD, "cuda_kernel_check")

TOLERANCE = 1e-3  # relative error of the logits of each position, CUDA against CPU
# q8 and q4 weights: both backends round each matvec's input to int8 (x / scale), a step
# function: where the two inputs differ in the last bit (float sums in another order) a
# value can round the other way, by a whole step (1/127 of its block's largest), and the
# difference grows through the layers and the KV cache. The CPU's own AVX2 and AVX-512
# paths differ by up to 2e-2 this way on these models over 100-512 positions (with
# AVX-512, q4's f16 matrices also read an f16-rounded input). The kernels themselves are
# held to the CPU's arithmetic in cuda_kernel_check.
QUANTIZED_TOLERANCE = 5e-2
# The same for batched prefill, by weight dtype: the GPU's GEMMs read their input rows rounded
# to the weights' dtype (f16 keeps 11 significant bits, bf16 8). The same rounding on the CPU
# moves these models' logits, against f32 activations, by up to 4.8e-3 for f16 (the AVX-512
# matvecs, qwen3, 100 positions) and 2.2e-2 for bf16 (the vdpbf16ps GEMM of AMD's AVX-512,
# qwen3, 700 positions; 6e-3 on stories260K in test_end_to_end). With an f16 KV cache the
# prefill attention runs on tensor cores, its queries and probabilities rounded to f16 too:
# at least PREFILL_F16_KV_TOLERANCE.
PREFILL_TOLERANCE = {"f32": 1e-3, "f16": 6e-3, "bf16": 3e-2}
PREFILL_F16_KV_TOLERANCE = 3e-3
# Batched prefill of q8 and q4 weights. The GPU's GEMM dequantizes each weight to f16 (one
# rounding, relative 2^-11 at most) and multiplies f16 activations, as an f16 model's prefill
# does; the CPU's q8/q4 prefill GEMM instead quantizes the activations to int8 per group of
# 32. Two references, both met on an H100:
# - The CPU's scalar path (`--simd scalar`: the dequantized weights exactly, f32 activations,
#   token by token) differs from the GPU by the f16 roundings only: an f16 model's prefill
#   budget (3e-3) plus the weights' own f16 rounding, whose errors of random sign add up to
#   far less than 2^-11 relative: QUANTIZED_PREFILL_SCALAR_TOLERANCE.
# - The CPU's `--prefill` differs by its int8 activations, which dominate: against its own
#   `--simd scalar` logits it shows up to 4.2e-2 (stories260K q8, 700 positions; 3.6e-2 on the
#   synthetic shapes, measured on the CPU), and another CPU's SIMD level (AVX2 or AVX-512
#   VNNI) moves its rounding by up to 2e-2 (QUANTIZED_TOLERANCE above); the GPU's f16 error
#   adds at most 3e-3: QUANTIZED_PREFILL_TOLERANCE.
QUANTIZED_PREFILL_SCALAR_TOLERANCE = 5e-3
QUANTIZED_PREFILL_TOLERANCE = 6e-2
# A run whose matvecs round their input to int8 (q8 experts through a router, the block
# types' decode) against the scalar path: at most this many times as far as the CPU's own
# int8 path of the same sequence is (int8_limit).
INT8_INPUT_MARGIN = 1.5


def tolerance(dtype):
    return QUANTIZED_TOLERANCE if dtype in ("q8", "q4") else TOLERANCE


@pytest.fixture(scope="module")
def cuda():
    require_cuda()


@pytest.fixture(params=["emulated", "gpu"])
def cuda_program(request):
    """The dump_logits that runs the CUDA backend: build/emulated/dump_logits, every kernel on
    the CPU emulation of CUDA (skipped where `make emulated` has not built it), or
    build/dump_logits on this machine's GPU (skipped, printing why, where there is none)."""
    if request.param == "gpu":
        require_cuda()
        return DUMP_LOGITS
    if not os.path.exists(EMULATED_DUMP_LOGITS):
        pytest.skip(f"{EMULATED_DUMP_LOGITS} is not built (`make emulated`)")
    return EMULATED_DUMP_LOGITS


def dump_logits(model, ids, *flags, env=None, program=None):
    """Logits [len(ids), vocab] from build/dump_logits (or `program`, another build of it)."""
    out = f"{model}.{os.getpid()}.logits"
    result = subprocess.run([program or DUMP_LOGITS, model, out, *map(str, ids), *flags],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    logits = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)
    os.unlink(out)
    return logits


def relative_errors(got, want):
    """The relative error of each position's logits."""
    return np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)


def int8_limit(cpu_int8, scalar):
    """The limit of a run that rounds its matvecs' input to int8, against the scalar path:
    INT8_INPUT_MARGIN times as far as the CPU's int8 path of the same sequence (cpu_int8)
    is, and no less than QUANTIZED_TOLERANCE."""
    return max(QUANTIZED_TOLERANCE, INT8_INPUT_MARGIN * relative_errors(cpu_int8, scalar).max())


def assert_close(got, want, what, limit=TOLERANCE):
    """Per-position relative error of the logits within limit, and no NaN."""
    assert np.isfinite(got).all(), f"{what}: non-finite logits"
    errors = relative_errors(got, want)
    worst = int(errors.argmax())
    assert errors[worst] <= limit, (
        f"{what}: relative error {errors[worst]:.2e} at position {worst} "
        f"(median {np.median(errors):.2e})")


# The CPU reference runs the AVX2 kernels (or scalar ones on a CPU without AVX2), which read
# every activation in f32 as the GPU's decode does: the AVX-512 matvecs read their input
# rounded to f16, which alone moves the logits by about 1e-3 (measured on an AVX-512 CPU).
CPU_REFERENCE = ("--simd", "avx2")


def compare_with_cpu(model, ids, kv, limit=TOLERANCE):
    cpu = dump_logits(model, ids, "--kv", kv, *CPU_REFERENCE)
    gpu = dump_logits(model, ids, "--kv", kv, "--device", "cuda")
    assert_close(gpu, cpu, f"{os.path.basename(model)} kv {kv}, {len(ids)} positions", limit)


def compare_prefill_with_cpu(model, dtype, ids, kv, gpu_env=None):
    """Every position's logits from one prefill call (batches of up to 512 tokens); the GPU
    run in gpu_env when given."""
    cpu = dump_logits(model, ids, "--kv", kv, "--prefill", *CPU_REFERENCE)
    gpu = dump_logits(model, ids, "--kv", kv, "--prefill", "--device", "cuda", env=gpu_env)
    tolerance = PREFILL_TOLERANCE[dtype]
    if kv == "f16":
        tolerance = max(tolerance, PREFILL_F16_KV_TOLERANCE)
    assert_close(gpu, cpu, f"{os.path.basename(model)} prefill kv {kv}, {len(ids)} positions",
                 tolerance)


def compare_quantized_prefill_with_cpu(model, ids, kv, gpu_env=None):
    """Every position's logits from one prefill call of a q8/q4 model against the CPU's
    scalar path and its prefill (QUANTIZED_PREFILL_SCALAR_TOLERANCE and
    QUANTIZED_PREFILL_TOLERANCE); the GPU run in gpu_env when given."""
    gpu = dump_logits(model, ids, "--kv", kv, "--prefill", "--device", "cuda", env=gpu_env)
    what = f"{os.path.basename(model)} prefill kv {kv}, {len(ids)} positions"
    scalar = dump_logits(model, ids, "--kv", kv, "--simd", "scalar")
    assert_close(gpu, scalar, what + " against the CPU's scalar path",
                 QUANTIZED_PREFILL_SCALAR_TOLERANCE)
    prefill = dump_logits(model, ids, "--kv", kv, "--prefill")
    assert_close(gpu, prefill, what + " against the CPU's prefill", QUANTIZED_PREFILL_TOLERANCE)


def token_ids(count, seed=0, vocab=512):
    return np.random.default_rng(seed).integers(0, vocab, count).tolist()


# Shapes the CUDA kernels must handle beyond stories260K's. Every width is off the 4/8
# elements of a 16-byte vector somewhere; vocab_size is not a multiple of the rows per block.
SYNTHETIC = {
    # Mistral: GQA 6/2, head_dim 34 (17 pairs), window 50 shorter than the long prompts.
    "gqa-window": {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 204,
        "intermediate_size": 301, "num_hidden_layers": 2, "num_attention_heads": 6,
        "num_key_value_heads": 2, "head_dim": 34, "vocab_size": 515,
        "max_position_embeddings": 4096, "sliding_window": 50, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2},
    # One KV head for 4 query heads of 128 (Llama-size heads), llama3 RoPE scaling.
    "wide-heads": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 260,
        "intermediate_size": 700, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 600,
        "max_position_embeddings": 4096, "rope_theta": 500000.0, "rms_norm_eps": 1e-6,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 1024},
        "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 1,
        "eos_token_id": 2},
    # 8 query heads per KV head (two attention blocks per KV head), tied embeddings.
    "group-of-8": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 72,
        "intermediate_size": 100, "num_hidden_layers": 3, "num_attention_heads": 8,
        "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 512,
        "max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "tie_word_embeddings": True, "bos_token_id": 1,
        "eos_token_id": 2},
    # Phi-4-mini's attention: 38 of each head's 50 elements rotated (partial rotary, q and k
    # rows reordered), LongRoPE's factors (the long ones where a prompt outgrows the original
    # 4 positions) and attention factor; fused matrices in the checkpoint.
    "phi3-partial": {
        "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 200,
        "intermediate_size": 301, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 515, "max_position_embeddings": 4096,
        "original_max_position_embeddings": 4, "partial_rotary_factor": 0.76,
        "rope_scaling": {"type": "longrope", "short_factor": [1 + 0.1 * i for i in range(19)],
                         "long_factor": [1 + 0.5 * i for i in range(19)]},
        "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "hidden_act": "silu",
        "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 0},
}


# Qwen2 and Qwen3 as tests/test_qwen.py makes them (vocab 512; qwen_tensors: biases N(0, 1),
# q/k norm weights in [0.5, 2.5], the output scaled so that the logits are far from
# uniform), at shapes the CUDA kernels find awkward.
_QWEN_BASE = {**QWEN_CPU_CONFIGS["qwen2"], "max_position_embeddings": 4096}
QWEN = {
    # q/k/v biases; a window of 50 positions on layers 1 and 2 only (layer 0 attends to all);
    # GQA 6/2, head_dim 34 (17 pairs).
    "qwen2-window": {
        **_QWEN_BASE, "hidden_size": 204, "intermediate_size": 301, "num_hidden_layers": 3,
        "num_attention_heads": 6, "num_key_value_heads": 2, "tie_word_embeddings": False,
        "use_sliding_window": True, "sliding_window": 50, "max_window_layers": 1},
    # Tied embeddings as in Qwen2.5-0.5B; 5 query heads of 20 on one KV head.
    "qwen2-tied": {
        **_QWEN_BASE, "hidden_size": 100, "intermediate_size": 172, "num_hidden_layers": 2,
        "num_attention_heads": 5, "num_key_value_heads": 1, "tie_word_embeddings": True,
        "use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 2},
    # Per-head q/k norms; head_dim 128 beside dim 200 (4 query heads on one KV head).
    "qwen3": {
        **_QWEN_BASE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 200, "intermediate_size": 301, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 128,
        "attention_bias": False, "tie_word_embeddings": False, "sliding_window": None,
        "max_window_layers": 2},
    # attention_bias: q, k, v and o biases beside the q/k norms; 9 heads of 18 on 3 KV heads.
    "qwen3-attention-bias": {
        **_QWEN_BASE, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 72, "intermediate_size": 100, "num_hidden_layers": 2,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 18,
        "attention_bias": True, "tie_word_embeddings": True, "sliding_window": None,
        "max_window_layers": 2},
}


# Gemma 3 and Gemma 2 as tests/test_gemma.py makes them (gemma_tensors: norms 1 + w around 1,
# the tied embedding scaled so that the logits are far from uniform), with a context for the
# long prompts, and Gemma 3 1B's attention: 4 query heads of 256 on one KV head.
GEMMA = {
    # Windows of 5 (layers 2 and 5 full), head_dim 18, scale 24^-1/2.
    "gemma3": {**GEMMA_CPU_CONFIGS["gemma3"], "max_position_embeddings": 4096},
    # layer_types; linear RoPE scaling on the full layers; head_dim 10.
    "gemma3-scaled": {**GEMMA_CPU_CONFIGS["gemma3-scaled"], "max_position_embeddings": 4096},
    # Heads of 256 (the decode attention's largest, prefill's CUDA-core kernel), a window of
    # 50 on layers 0 and 1, query_pre_attn_scalar 168 (27B's) rather than head_dim.
    "gemma3-1b-heads": {
        **GEMMA_CPU_CONFIGS["gemma3"], "max_position_embeddings": 4096, "hidden_size": 200,
        "intermediate_size": 301, "num_hidden_layers": 3, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 50,
        "sliding_window_pattern": 3, "query_pre_attn_scalar": 168},
    # Gemma 2: no q/k norms, layers 0, 2, 4 sliding; the scores and the logits soft-capped.
    "gemma2": {**GEMMA_CPU_CONFIGS["gemma2"], "max_position_embeddings": 4096},
}


def qwen_tokenizer():
    """The tiny tokenizer with one more piece per id up to the vocabulary's end (" t40",
    " t41", ...): every generated id shows in the text."""
    tokenizer = tiny_tokenizer_json()
    vocab = tokenizer["model"]["vocab"]
    vocab.update({f"\u2581t{i}": i for i in range(len(vocab), _QWEN_BASE["vocab_size"])})
    return tokenizer


def write_hf_checkpoint(name, hf_dir, seed):
    """The Hugging Face directory of SYNTHETIC[name] (convert/synth.py, the stories260K
    tokenizer), QWEN[name] (qwen_tensors, qwen_tokenizer) or GEMMA[name] (gemma_tensors) at
    hf_dir."""
    if name in QWEN:
        make_checkpoint(hf_dir, QWEN[name], qwen_tensors(QWEN[name], seed), qwen_tokenizer())
        return
    if name in GEMMA:
        make_checkpoint(hf_dir, GEMMA[name], gemma_tensors(GEMMA[name], seed))
        return
    config_path = os.path.join(os.path.dirname(hf_dir), f"{name}.config.json")
    with open(config_path, "w") as f:
        json.dump(SYNTHETIC[name], f)
    result = run(SYNTH, "--config", config_path, "--tokenizer", STORIES, "-o", hf_dir,
                 "--dtype", "f32", "--seed", str(seed))
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """models(name, dtype) -> path of a converted checkpoint, made once per test module.
    name is "stories260K", a SYNTHETIC key, a QWEN key or a GEMMA key."""
    made = {}

    def get(name, dtype):
        if (name, dtype) in made:
            return made[name, dtype]
        need_shared(STORIES)
        directory = tmp_path_factory.mktemp(f"{name}-{dtype}")
        if name == "stories260K":
            hf_dir = STORIES
        else:
            hf_dir = str(directory / "hf")
            write_hf_checkpoint(name, hf_dir, seed=5)
        out = str(directory / "model.bin")
        result = run(CONVERT, hf_dir, "-o", out, "--dtype", dtype)
        assert result.returncode == 0, result.stderr
        made[name, dtype] = out
        return out

    return get


def test_every_kernel_matches_the_cpu_kernels(cuda):
    assert os.path.exists(KERNEL_CHECK), f"{KERNEL_CHECK} is missing: make builds it with nvcc"
    result = subprocess.run([KERNEL_CHECK], capture_output=True, text=True, timeout=600)
    failures = [line for line in result.stdout.splitlines() if not line.startswith("PASS")]
    assert result.returncode == 0, "\n".join(failures[-40:]) + result.stderr


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "q8", "q4"])
@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("length", [1, 7, 512])
def test_stories260k_cuda_matches_cpu(cuda, models, dtype, kv, length):
    compare_with_cpu(models("stories260K", dtype), token_ids(length, seed=length), kv,
                     tolerance(dtype))


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
@pytest.mark.parametrize("dtype,kv", [("f32", "f32"), ("f32", "f16"), ("f16", "f16"),
                                      ("bf16", "f16"), ("q8", "f16"), ("q4", "f32")])
@pytest.mark.parametrize("length", [1, 7, 100])
def test_synthetic_cuda_matches_cpu(cuda, models, name, dtype, kv, length):
    compare_with_cpu(models(name, dtype), token_ids(length, seed=length), kv, tolerance(dtype))


@pytest.mark.parametrize("name", ["gqa-window", "wide-heads"])
@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_long_context_cuda_matches_cpu(cuda, models, name, kv):
    compare_with_cpu(models(name, "f16"), token_ids(4096, seed=4096), kv)


@pytest.mark.parametrize("name", ["stories260K"] + sorted(SYNTHETIC) + sorted(QWEN))
@pytest.mark.parametrize("dtype,kv", [("f32", "f32"), ("f32", "f16"), ("f16", "f16"),
                                      ("bf16", "f16")])
@pytest.mark.parametrize("length", [1, 7, 100, 700])
def test_prefill_cuda_matches_cpu(cuda, models, name, dtype, kv, length):
    """700 tokens: two batches, the second continuing the cache of the first (and crossing
    the sliding windows of gqa-window and qwen2-window). Qwen: biases, q/k norms."""
    compare_prefill_with_cpu(models(name, dtype), dtype, token_ids(length, seed=length), kv)


def compute_capability():
    """The first GPU's compute capability as nvidia-smi gives it ("9.0"), or None."""
    result = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                            capture_output=True, text=True)
    lines = result.stdout.split()
    return lines[0] if result.returncode == 0 and lines else None


@pytest.mark.parametrize("name", ["stories260K", "gqa-window", "wide-heads", "qwen2-window"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("length", [100, 700])
def test_warpgroup_gemm_prefill_matches_cpu(cuda, models, name, dtype, length):
    """BARELLM_CUDA_WGMMA=always runs the prefill's f16/bf16 GEMMs on the warpgroup GEMM of
    sm_90a (kernels/gemm_warpgroup.cuh), these models' small grids included (by default they
    stay on the other tiles), and w1, w3 and SwiGLU in one pass: TMA tiles whose columns
    (204, 260) and rows end inside a tile, Qwen2's biases, a 700-token prompt in two
    batches."""
    if compute_capability() != "9.0":
        pytest.skip("the warpgroup GEMM runs on sm_90 GPUs (H100, H200) only")
    compare_prefill_with_cpu(models(name, dtype), dtype, token_ids(length, seed=length), "f16",
                             gpu_env={**os.environ, "BARELLM_CUDA_WGMMA": "always"})


@pytest.mark.parametrize("name", ["stories260K", "gqa-window", "wide-heads"])
@pytest.mark.parametrize("dtype,kv", [("q8", "f16"), ("q4", "f32")])
@pytest.mark.parametrize("length", [1, 7, 100, 700])
def test_quantized_prefill_cuda_matches_cpu(cuda, models, name, dtype, kv, length):
    """The Q8/Q4 GEMMs of the batched prefill (700 tokens: two batches). stories260K:
    every matrix Q8 or Q4; wide-heads (dim 260): q4 mixes Q4 matrices with the f16 ones
    whose columns are not a multiple of 32; gqa-window (dim 204): q4 keeps every matrix f16,
    q8 pads every row's last block. The CPU's numbers behind the tolerances were measured
    with its AVX-512 VNNI prefill."""
    compare_quantized_prefill_with_cpu(models(name, dtype), token_ids(length, seed=length), kv)


@pytest.mark.parametrize("name", ["stories260K", "wide-heads"])
@pytest.mark.parametrize("dtype,kv", [("q8", "f16"), ("q4", "f32")])
@pytest.mark.parametrize("length", [100, 700])
def test_warpgroup_gemm_quantized_prefill_matches_cpu(cuda, models, name, dtype, kv, length):
    """BARELLM_CUDA_WGMMA=always: the Q8/Q4 matrices of the prefill dequantized to f16
    (kernels/dequantize.cuh) and multiplied on the warpgroup GEMM of sm_90a, w1 and w3 side
    by side in the gated form; wide-heads' q4 mixes them with f16 matrices."""
    if compute_capability() != "9.0":
        pytest.skip("the warpgroup GEMM runs on sm_90 GPUs (H100, H200) only")
    compare_quantized_prefill_with_cpu(models(name, dtype), token_ids(length, seed=length), kv,
                                       gpu_env={**os.environ, "BARELLM_CUDA_WGMMA": "always"})


# Every text of ../shared/eval; f32 weights (the SIMT GEMM) and f16 (the tensor cores, with an
# f16 KV cache: the tensor-core prefill attention).
# Files of ggml's block types, each matrix its own type (convert.py's q2_k, q3_k_m, q4_k_m,
# q5_k_m, q6_k, iq4_xs and iq4_nl of a checkpoint, llama-quantize's mixes): rows of 256 (whole
# super-blocks), 9 layers (the mixes' more-bits layers Q6_K; q2_k's wq, wk, w1 and w3 Q2_K, its
# wv and wo Q3_K; q3_k_m's wq, wk, w1 and w3 Q3_K; iq4_nl's IQ4_NL but for w2 of layer 0 and
# the output). KQUANT_SHAPE's w2 has 288 columns, so it falls back (Q3_K to Q4_0, Q4_K to
# Q5_0, Q5_K to Q5_1, Q6_K to Q8_0) or is IQ4_NL of 9 blocks; IQ4_SHAPE's fall back nowhere
# (IQ4_XS, Q5_K, Q6_K). The vocabulary of 41 is off every tile.
KQUANT_SHAPE = {**TINY_CONFIG, "hidden_size": 256, "intermediate_size": 288,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 41,
                "num_hidden_layers": 9, "max_position_embeddings": 128}
IQ4_SHAPE = {**KQUANT_SHAPE, "intermediate_size": 512, "num_attention_heads": 8}
BLOCK_MIXES = {"q2_k": KQUANT_SHAPE, "q3_k_m": KQUANT_SHAPE, "q4_k_m": KQUANT_SHAPE,
               "q5_k_m": KQUANT_SHAPE, "q6_k": KQUANT_SHAPE, "iq4_xs": IQ4_SHAPE,
               "iq4_nl": KQUANT_SHAPE}


@pytest.fixture(scope="module")
def block_mix(tmp_path_factory):
    """block_mix(mix) -> path of BLOCK_MIXES[mix]'s file, made once per test module."""
    made = {}

    def get(mix):
        if mix not in made:
            directory = tmp_path_factory.mktemp(mix)
            config = BLOCK_MIXES[mix]
            hf = make_checkpoint(str(directory / "hf"), config, tiny_tensors(config, seed=5))
            made[mix] = str(directory / "model.bin")
            result = run(CONVERT, hf, "-o", made[mix], "--dtype", mix)
            assert result.returncode == 0, result.stderr
        return made[mix]

    return get


@pytest.mark.parametrize("mix", sorted(BLOCK_MIXES))
@pytest.mark.parametrize("length", [1, 7, 100])
def test_block_types_cuda_match_cpu(cuda, block_mix, mix, length):
    """Decode multiplies each block type's values, unpacked in registers, with the input
    rounded to int8 as the CPU's matvecs of that type round it (per 32 columns, or per 256
    for the super-blocks): the CPU's AVX2 path, which rounds it alike, within
    QUANTIZED_TOLERANCE (as q8 and q4 decode), and the scalar path (the dequantized weights
    exactly, f32 activations) within int8_limit: per 256 the rounding moves these models'
    logits far, the CPU's own AVX2 path 5.1e-2 from its scalar path on the iq4_xs mix over 30
    positions. Prefill dequantizes each matrix to f16 for the GEMM: as q8 and q4 prefill
    are."""
    ids = token_ids(length, seed=length, vocab=BLOCK_MIXES[mix]["vocab_size"])
    compare_block_types_with_cpu(block_mix(mix), ids, f"{mix}, {length} positions")


def compare_block_types_with_cpu(model, ids, what, program=None):
    """The CUDA backend (build/dump_logits, or `program`: build/emulated/dump_logits runs it
    on the CPU emulation of CUDA) on a file of block types, as test_block_types_cuda_match_cpu
    holds it: decode within QUANTIZED_TOLERANCE of the CPU's AVX2 path and within int8_limit
    of its scalar path; prefill (of more than one position) within
    QUANTIZED_PREFILL_SCALAR_TOLERANCE of the scalar path."""
    scalar = dump_logits(model, ids, "--kv", "f32", "--simd", "scalar")
    cpu = dump_logits(model, ids, "--kv", "f32", *CPU_REFERENCE)
    gpu = dump_logits(model, ids, "--kv", "f32", "--device", "cuda", program=program)
    print(f"{what}: decode {relative_errors(gpu, cpu).max():.2e} from the CPU, "
          f"{relative_errors(gpu, scalar).max():.2e} from its scalar path")
    assert_close(gpu, cpu, what + " decode", QUANTIZED_TOLERANCE)
    assert_close(gpu, scalar, what + " decode against the CPU's scalar path",
                 int8_limit(cpu, scalar))
    if len(ids) > 1:
        prefill = dump_logits(model, ids, "--kv", "f32", "--prefill", "--device", "cuda",
                              program=program)
        print(f"{what}: prefill {relative_errors(prefill, scalar).max():.2e} from the scalar "
              f"path")
        assert_close(prefill, scalar, what + " prefill against the CPU's scalar path",
                     QUANTIZED_PREFILL_SCALAR_TOLERANCE)


@pytest.mark.parametrize("name,text,context", [
    ("stories260K", "tinystories_valid_sample.txt", 512),
    ("stories260K", "tinyshakespeare.txt", 512),
    ("stories260K", "wiki.test.raw", 512),
    # 700 positions: each prefill call runs a batch of 512 and one of 188.
    ("gqa-window", "tinystories_valid_sample.txt", 700)])
@pytest.mark.parametrize("dtype,kv", [("f32", "f32"), ("f16", "f16")])
def test_ppl_cuda_matches_cpu(cuda, models, name, text, context, dtype, kv):
    text = os.path.join(SHARED, "eval", text)
    need_shared(text)
    values = []
    for device in ("cpu", "cuda"):
        result = subprocess.run([BARELLM, "ppl", models(name, dtype), "-f", text,
                                 "--ctx", str(context), "--chunks", "3", "--kv", kv,
                                 "--device", device],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        last = result.stdout.strip().splitlines()[-1]
        assert last.startswith("PPL = "), result.stdout
        values.append(float(last.split()[2]))
    assert abs(values[1] - values[0]) <= 1e-3 * values[0], values


@pytest.mark.parametrize("name", sorted(QWEN))
@pytest.mark.parametrize("dtype,kv", [("f32", "f32"), ("f16", "f16"), ("bf16", "f16"),
                                      ("q8", "f16"), ("q4", "f32")])
@pytest.mark.parametrize("length", [1, 7, 100])
def test_qwen_cuda_matches_cpu(cuda, models, name, dtype, kv, length):
    model = models(name, dtype)
    ids = token_ids(length, seed=length)
    cpu = dump_logits(model, ids, "--kv", kv, *CPU_REFERENCE)
    assert cpu.std(axis=1).min() > 2.0  # far from uniform: a missing bias or norm shows
    gpu = dump_logits(model, ids, "--kv", kv, "--device", "cuda")
    assert_close(gpu, cpu, f"{name} {dtype} kv {kv}, {length} positions", tolerance(dtype))


@pytest.mark.parametrize("name", ["qwen2-window", "qwen3"])
def test_qwen_long_context_cuda_matches_cpu(cuda, models, name):
    compare_with_cpu(models(name, "f16"), token_ids(1000, seed=1000), "f16")


@pytest.mark.parametrize("name", ["qwen2-window", "qwen3", "qwen3-attention-bias"])
def test_every_gpu_rung_runs_qwen_as_the_cpu(cuda, models, name):
    """Each rung of the GPU ladder (its own bias, q/k norm and window steps) gives the CPU's
    greedy text on Qwen (qwen_tokenizer: every generated id shows in it)."""
    model = models(name, "f32")
    prompt = "ab ab cab"
    cpu = subprocess.run([BARELLM, "run", model, "-p", prompt, "--temp", "0", "-n", "24",
                          "--device", "cpu"],
                         capture_output=True, text=True, timeout=120)
    assert cpu.returncode == 0, cpu.stderr
    result = subprocess.run([BARELLM, "ladder", model, "--device", "cuda", "--check-text",
                             prompt, "-n", "24"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rungs = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(rungs) == 8
    for rung in rungs:
        assert rung["text"] == cpu.stdout.rstrip("\n"), f"rung {rung['rung']}: {rung}"


@pytest.mark.parametrize("name", sorted(GEMMA))
@pytest.mark.parametrize("dtype,kv", [("f32", "f32"), ("f16", "f16"), ("bf16", "f16"),
                                      ("q8", "f16"), ("q4", "f32")])
@pytest.mark.parametrize("length", [1, 7, 100])
def test_gemma_cuda_matches_cpu(cuda, models, name, dtype, kv, length):
    """Decode: the scaled embedding, GeGLU in the fused matvecs, the post norms, each layer's
    RoPE table and window."""
    model = models(name, dtype)
    ids = token_ids(length, seed=length)
    cpu = dump_logits(model, ids, "--kv", kv, *CPU_REFERENCE)
    assert cpu.std(axis=1).min() > 2.0  # far from uniform: a missing norm or scale shows
    gpu = dump_logits(model, ids, "--kv", kv, "--device", "cuda")
    assert_close(gpu, cpu, f"{name} {dtype} kv {kv}, {length} positions", tolerance(dtype))


@pytest.mark.parametrize("name", sorted(GEMMA))
@pytest.mark.parametrize("dtype,kv", [("f32", "f32"), ("f16", "f16"), ("bf16", "f16")])
@pytest.mark.parametrize("length", [7, 100, 700])
def test_gemma_prefill_cuda_matches_cpu(cuda, models, name, dtype, kv, length):
    """Prefill: GeGLU in gemm_swiglu (or swiglu_rows), the post norms on the batch's rows;
    700 tokens take two batches, the second crossing every window."""
    compare_prefill_with_cpu(models(name, dtype), dtype, token_ids(length, seed=length), kv)


@pytest.mark.parametrize("name", ["gemma3", "gemma3-1b-heads"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_gemma_warpgroup_prefill_matches_cpu(cuda, models, name, dtype):
    """The gated warpgroup GEMM's GeGLU epilogue (sm_90a; elsewhere the other tiles)."""
    compare_prefill_with_cpu(models(name, dtype), dtype, token_ids(300, seed=300), "f16",
                             gpu_env={**os.environ, "BARELLM_CUDA_WGMMA": "always"})


def test_gemma_long_context_cuda_matches_cpu(cuda, models):
    compare_with_cpu(models("gemma3-1b-heads", "f16"), token_ids(1000, seed=1000), "f16")


def test_gpu_ladder_refuses_gemma_in_one_line(cuda, models):
    """The GPU ladder's rungs 1-4 run the Llama-family layer: Gemma 3 is refused in one
    line naming it, exit status 1."""
    result = subprocess.run([BARELLM, "ladder", models("gemma3", "f16"), "--device", "cuda",
                             "-n", "8"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "gemma3" in lines[0], result.stderr


@pytest.mark.parametrize("name,dtype", [("gqa-window", "bf16"), ("stories260K", "q4"),
                                        ("gemma3-1b-heads", "f16")])
def test_graph_replay_equals_direct_launches(cuda, models, name, dtype):
    """The captured graph and plain launches run the same kernels: identical logits."""
    model = models(name, dtype)
    ids = token_ids(64, seed=64)
    replayed = dump_logits(model, ids, "--device", "cuda")
    direct = dump_logits(model, ids, "--device", "cuda",
                         env={**os.environ, "BARELLM_CUDA_GRAPHS": "0"})
    assert np.array_equal(replayed, direct)


@pytest.mark.parametrize("name,dtype", [("gqa-window", "bf16"), ("stories260K", "q4"),
                                        ("stories260K", "q8"), ("gemma3-1b-heads", "f16"),
                                        ("qwen3-attention-bias", "f32")])
def test_dependent_launch_equals_stream_order(cuda, models, name, dtype):
    """BARELLM_CUDA_PDL=1 (kernels/dependent_launch.cuh) starts each decode matvec and the
    attention while the kernel ahead of it ends; they wait for its writes before reading
    them: the same logits, bit for bit, in the graph and launched directly."""
    model = models(name, dtype)
    ids = token_ids(64, seed=65)
    in_order = dump_logits(model, ids, "--device", "cuda")
    for graphs in ("1", "0"):
        overlapped = dump_logits(model, ids, "--device", "cuda",
                                 env={**os.environ, "BARELLM_CUDA_PDL": "1",
                                      "BARELLM_CUDA_GRAPHS": graphs})
        assert np.array_equal(in_order, overlapped), f"graphs {graphs}"


@pytest.mark.parametrize("mix", sorted(BLOCK_MIXES))
def test_dependent_launch_block_types_equal_stream_order(cuda, block_mix, mix):
    """The block types' matvecs under BARELLM_CUDA_PDL=1: the same logits, bit for bit."""
    model = block_mix(mix)
    ids = token_ids(40, seed=66, vocab=BLOCK_MIXES[mix]["vocab_size"])
    in_order = dump_logits(model, ids, "--kv", "f32", "--device", "cuda")
    overlapped = dump_logits(model, ids, "--kv", "f32", "--device", "cuda",
                             env={**os.environ, "BARELLM_CUDA_PDL": "1"})
    assert np.array_equal(in_order, overlapped)


@pytest.mark.parametrize("prompt", ["Once upon a time", "The little dog",
                                    "Tom and his mom went to the park. They saw"])
def test_run_greedy_text_matches_cpu(cuda, models, prompt):
    """64 greedy tokens after a prompt that the GPU runs as one batch."""
    model = models("stories260K", "f32")
    texts = []
    for device in ("cpu", "cuda"):
        result = subprocess.run([BARELLM, "run", model, "-p", prompt, "-n", "64",
                                 "--temp", "0", "--device", device, "--kv", "f32"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        texts.append(result.stdout)
    assert texts[0] == texts[1]
    assert len(texts[1].split()) > 30, texts[1]


def test_bench_reports_device_to_device_bandwidth(cuda, models):
    result = subprocess.run([BARELLM, "bench", models("stories260K", "f16"), "--device", "cuda",
                             "-p", "16", "-n", "16", "-r", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "| cuda |" in result.stdout
    assert "device-to-device copy" in result.stdout


def test_bench_at_a_depth_runs(cuda, models):
    result = subprocess.run([BARELLM, "bench", models("stories260K", "f16"), "--device", "cuda",
                             "-p", "16", "-n", "16", "-d", "300", "-r", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "| pp16 @ d300 |" in result.stdout and "| tg16 @ d300 |" in result.stdout


@pytest.mark.parametrize("dtype", ["q8", "q4"])
def test_bench_runs_quantized_weights(cuda, models, dtype):
    result = subprocess.run([BARELLM, "bench", models("stories260K", dtype), "--device", "cuda",
                             "-p", "16", "-n", "16", "-r", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "| cuda |" in result.stdout


def test_gpu_ladder_refuses_quantized_weights_in_one_line(cuda, models):
    """The GPU ladder's first rungs read f32/f16/bf16 only: one line, exit status 1."""
    result = subprocess.run([BARELLM, "ladder", models("stories260K", "q8"), "--device", "cuda",
                             "-n", "8"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Q8" in lines[0], result.stderr


@pytest.mark.parametrize("variable,value", [("BARELLM_CUDA_WGMMA", "yes"),
                                            ("BARELLM_CUDA_PDL", "on")])
def test_wrong_cuda_switch_is_one_line(cuda, models, variable, value):
    """BARELLM_CUDA_WGMMA takes 0, 1 or always and BARELLM_CUDA_PDL 0 or 1, on any GPU:
    another value stops barellm before it uploads the weights, with one line naming it,
    exit status 1."""
    result = subprocess.run([BARELLM, "run", models("stories260K", "f16"), "-p",
                             "Once upon a time", "-n", "4", "--device", "cuda"],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, variable: value})
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{variable} is '{value}'" in lines[0], result.stderr


def test_device_cuda_without_gpu_says_so_in_one_line(tmp_path):
    """Runs where there is no GPU (CI): one line on stderr, exit status 1."""
    if cuda_unavailable_reason() is None:
        pytest.skip("a CUDA GPU is present: the no-GPU message cannot be checked here")
    need_shared(STORIES)
    model = str(tmp_path / "stories.bin")
    assert run(CONVERT, STORIES, "-o", model, "--dtype", "f16").returncode == 0
    result = subprocess.run([BARELLM, "run", model, "-p", "hi", "--device", "cuda"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda" in lines[0], result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
@pytest.mark.parametrize("dtype", ["f32", "f16", "q8", "q4"])
@pytest.mark.parametrize("length", [1, 7, 60])
def test_mixture_of_experts_cuda_matches_cpu(cuda, tmp_path, name, dtype, length):
    """Mixtral (every layer sparse, top 2 of 8) and Qwen3-MoE (dense layers among sparse ones,
    top 3 of 12): decode routes on the device and reads the chosen experts (inside the CUDA
    graph), prefill groups the batch's routes by expert, one GEMM per expert. The routers
    here have no deliberate near-ties (test_moe.py's), which float sums in another order
    could route the other way."""
    model = convert_model(moe_checkpoint(tmp_path, name, near_tie=False),
                          tmp_path / "model.bin", dtype)
    ids = token_ids(length, seed=length)
    compare_with_cpu(model, ids, "f32", tolerance(dtype))
    if dtype in ("q8", "q4"):
        compare_quantized_prefill_with_cpu(model, ids, "f32")
    else:
        compare_prefill_with_cpu(model, dtype, ids, "f32")


def gpt_oss_model(tmp_path, dtype):
    """A tiny gpt-oss (tests/test_gpt_oss.py's: sinks, every bias, the clamped SwiGLU, sliding
    layers of 5 positions, YaRN) converted to dtype; "mxfp4" is its MXFP4 checkpoint, the
    experts kept in ggml's blocks and the rest F32. Whole blocks of 32 for the quantized
    types, whose tokens go to every expert: their inputs rounded to int8 (the CPU's scalar
    path keeps them f32) would otherwise move some token's choice between two close experts
    (measured on mxfp4 with 2 of 6: 0.33 from the scalar path over 7 positions)."""
    every_expert = {"num_experts_per_tok": GPT_OSS_CONFIG["num_local_experts"]}
    if dtype == "mxfp4":
        config = {**GPT_OSS_MXFP4_CONFIG, **every_expert}
        hf = gpt_oss_checkpoint(tmp_path, config, gpt_oss_tensors(config, mxfp4=True))
        result = run(CONVERT, hf, "-o", tmp_path / "model.bin")
        assert result.returncode == 0, result.stderr
        return str(tmp_path / "model.bin")
    config = {**GPT_OSS_CONFIG, **GPT_OSS_BLOCK_SHAPE,
              **(every_expert if dtype in ("q8", "q4") else {})}
    return convert_model(gpt_oss_checkpoint(tmp_path, config, gpt_oss_tensors(config)),
                         tmp_path / "model.bin", dtype)


@pytest.mark.parametrize("dtype", ["f32", "f16", "q8", "mxfp4"])
@pytest.mark.parametrize("length", [1, 7, 60])
def test_gpt_oss_cuda_matches_cpu(cuda, tmp_path, dtype, length):
    """gpt-oss on the device: each head's sink in the decode, prefill and split attention, the
    router's bias before the routing, the experts' biases around the clamped SwiGLU; 60
    positions cross the sliding layers' window many times over."""
    model = gpt_oss_model(tmp_path, dtype)
    ids = token_ids(length, seed=length)
    if dtype == "mxfp4":
        compare_mxfp4_experts_with_cpu(model, ids, f"gpt-oss mxfp4, {length} positions")
        return
    compare_with_cpu(model, ids, "f32", tolerance(dtype))
    if dtype == "q8":
        compare_quantized_prefill_with_cpu(model, ids, "f32")
    else:
        compare_prefill_with_cpu(model, dtype, ids, "f32")


def compare_mxfp4_experts_with_cpu(model, ids, what):
    """A file whose experts are MXFP4 and other matrices F32: the expert products round their
    input to int8, in decode and prefill alike, on both backends. Decode within
    QUANTIZED_TOLERANCE of the CPU and int8_limit of its scalar path (the rounding moves this
    model's logits far: 0.18 over 7 positions); prefill within QUANTIZED_PREFILL_TOLERANCE of
    the CPU's prefill."""
    scalar = dump_logits(model, ids, "--kv", "f32", "--simd", "scalar")
    cpu = dump_logits(model, ids, "--kv", "f32", *CPU_REFERENCE)
    gpu = dump_logits(model, ids, "--kv", "f32", "--device", "cuda")
    assert_close(gpu, cpu, what + " decode", QUANTIZED_TOLERANCE)
    assert_close(gpu, scalar, what + " decode against the CPU's scalar path",
                 int8_limit(cpu, scalar))
    prefill = dump_logits(model, ids, "--kv", "f32", "--prefill", "--device", "cuda")
    cpu_prefill = dump_logits(model, ids, "--kv", "f32", "--prefill")
    assert_close(prefill, cpu_prefill, what + " prefill against the CPU's prefill",
                 QUANTIZED_PREFILL_TOLERANCE)


def test_step_gpt_oss_matches_cpu(cuda, tmp_path):
    """The CUDA step of gpt-oss (the paged attention with sinks), several sequences at once,
    against each sequence alone on the CPU backend, as test_step_matches_cpu_forward."""
    model = gpt_oss_model(tmp_path, "f32")
    sequences = [token_ids(n, seed=300 + n) for n in STEP_LENGTHS]
    gpu = step_logits(model, sequences, "--chunks", STEP_CHUNKS, "--block-size", "16",
                      "--kv", "f32", "--device", "cuda")
    assert np.isfinite(gpu).all()
    first = 0
    for ids in sequences:
        cpu = dump_logits(model, ids, "--kv", "f32", *CPU_REFERENCE)
        assert_close(gpu[first:first + len(ids)], cpu,
                     f"gpt-oss step, {len(ids)} positions", PREFILL_TOLERANCE["f32"])
        first += len(ids)


def step_logits(model, sequences, *flags, env=None):
    """Logits [sum of the lengths, vocab] of every position of each sequence from
    build/step_logits (Backend::step over the paged KV cache); NaN rows where none were
    asked for."""
    out = f"{model}.{os.getpid()}.step"
    args = [STEP_LOGITS, model, out]
    for ids in sequences:
        args += ["--seq", ",".join(map(str, ids))]
    result = subprocess.run([*args, *flags], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    logits = np.fromfile(out, dtype=np.float32).reshape(sum(map(len, sequences)), -1)
    os.unlink(out)
    return logits


# Four sequences of different lengths; chunks of 1 (decode rows), 5 and 24 positions: the
# first steps hold 1 + 5 + 24 + 1 rows (the GEMMs), the later ones fewer than 16 (the batched
# matvec).
STEP_LENGTHS = (70, 37, 100, 19)
STEP_CHUNKS = "1,5,24,1"


@pytest.mark.parametrize("name,dtype,kv", [
    ("stories260K", "f32", "f32"), ("gqa-window", "f32", "f16"), ("qwen2-window", "f32", "f32"),
    ("qwen3-attention-bias", "f32", "f16"), ("gemma3", "f32", "f32"),
    ("gemma3-1b-heads", "f32", "f16"), ("stories260K", "f16", "f16"),
    ("wide-heads", "bf16", "f16"), ("stories260K", "q8", "f16"), ("group-of-8", "q4", "f32")])
@pytest.mark.parametrize("block_size", [16, 32])
def test_step_matches_cpu_forward(cuda, models, name, dtype, kv, block_size):
    """The CUDA step, several sequences at once over scattered block tables, against each
    sequence alone on the CPU backend (contiguous cache, token by token). Steps of many rows
    read their inputs rounded to the GEMM's dtype, as prefill does: PREFILL_TOLERANCE; q8
    and q4 against the CPU's scalar path, as the quantized prefill is."""
    model = models(name, dtype)
    sequences = [token_ids(n, seed=100 + n) for n in STEP_LENGTHS]
    gpu = step_logits(model, sequences, "--chunks", STEP_CHUNKS, "--block-size", str(block_size),
                      "--kv", kv, "--device", "cuda", "--seed", str(block_size))
    assert np.isfinite(gpu).all()
    if dtype in ("q8", "q4"):
        reference, limit = ("--simd", "scalar"), QUANTIZED_PREFILL_SCALAR_TOLERANCE
    else:
        reference = CPU_REFERENCE
        limit = max(PREFILL_TOLERANCE[dtype], PREFILL_F16_KV_TOLERANCE if kv == "f16" else 0)
    first = 0
    for ids in sequences:
        cpu = dump_logits(model, ids, "--kv", kv, *reference)
        assert_close(gpu[first:first + len(ids)], cpu,
                     f"{name} {dtype} step, blocks of {block_size}, {len(ids)} positions", limit)
        first += len(ids)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
@pytest.mark.parametrize("dtype", ["f32", "q8"])
def test_step_mixture_of_experts_matches_cpu(cuda, tmp_path, name, dtype):
    """The CUDA step of a mixture of experts (every row routed on the device, the expert
    matvecs over each row's routes), several sequences at once, against each sequence alone
    on the CPU backend, as test_step_matches_cpu_forward. But q8's expert matvecs round their
    input to int8 in every step, however many rows it has, as the CPU's q8 path does, and
    through the routers that moves the logits far: on qwen3_moe over 66 positions the CPU's
    own q8 path is 8.6e-2 from its scalar path, the emulated step 7.4e-2 (and the GPU's
    decode 8e-8 from the CPU's q8 path). So a q8 step may be as far from the scalar path as
    the CPU's q8 path of the same sequence is, with a margin, and no less than
    QUANTIZED_TOLERANCE."""
    model = convert_model(moe_checkpoint(tmp_path, name, near_tie=False),
                          tmp_path / "model.bin", dtype)
    sequences = [token_ids(n, seed=200 + n) for n in STEP_LENGTHS]
    gpu = step_logits(model, sequences, "--chunks", STEP_CHUNKS, "--block-size", "16",
                      "--kv", "f32", "--device", "cuda")
    assert np.isfinite(gpu).all()
    reference = ("--simd", "scalar") if dtype == "q8" else CPU_REFERENCE
    first = 0
    for ids in sequences:
        cpu = dump_logits(model, ids, "--kv", "f32", *reference)
        limit = PREFILL_TOLERANCE[dtype] if dtype != "q8" else int8_limit(
            dump_logits(model, ids, "--kv", "f32", *CPU_REFERENCE), cpu)
        assert_close(gpu[first:first + len(ids)], cpu,
                     f"{name} {dtype} step, {len(ids)} positions", limit)
        first += len(ids)


@pytest.mark.parametrize("mix", ["q4_k_m", "iq4_xs"])
def test_step_block_types_match_cpu(cuda, block_mix, mix):
    """The CUDA step of a file of block types (the batched matvec dequantizing each block
    once for every row, the GEMMs on matrices dequantized to f16) against each sequence
    alone on the CPU's scalar path, as test_step_matches_cpu_forward's q8 and q4."""
    model = block_mix(mix)
    vocab = BLOCK_MIXES[mix]["vocab_size"]
    sequences = [token_ids(n, seed=400 + n, vocab=vocab) for n in STEP_LENGTHS]
    gpu = step_logits(model, sequences, "--chunks", STEP_CHUNKS, "--block-size", "16",
                      "--kv", "f32", "--device", "cuda")
    assert np.isfinite(gpu).all()
    first = 0
    for ids in sequences:
        cpu = dump_logits(model, ids, "--kv", "f32", "--simd", "scalar")
        assert_close(gpu[first:first + len(ids)], cpu, f"{mix} step, {len(ids)} positions",
                     QUANTIZED_PREFILL_SCALAR_TOLERANCE)
        first += len(ids)


def test_step_sparse_logits_and_copied_blocks(cuda, models):
    """Rows that want no logits get none, and the others are the same logits; blocks copied
    (copy_kv_block) into other places of the pool between steps change nothing."""
    model = models("qwen2-window", "f32")
    sequences = [token_ids(n, seed=200 + n) for n in STEP_LENGTHS]
    flags = ("--chunks", STEP_CHUNKS, "--kv", "f32", "--device", "cuda")
    full = step_logits(model, sequences, *flags)
    sparse = step_logits(model, sequences, *flags, "--sparse-logits", "--copy-blocks",
                         "--block-size", "64", "--seed", "7")
    asked = np.isfinite(sparse).all(axis=1)
    assert 0 < asked.sum() < len(asked)
    assert np.isnan(sparse[~asked]).all()
    assert_close(sparse[asked], full[asked], "sparse logits over copied blocks", 1e-5)


def test_step_graphs_match_direct_launches(cuda, models):
    """The server step's graphs (one per bucket of row counts, the rows padded to it) and
    plain launches of the same step (unpadded, the attention split for the step's own
    lengths): the same logits but for the order of float sums."""
    model = models("gqa-window", "f16")
    sequences = [token_ids(n, seed=300 + n) for n in STEP_LENGTHS]
    flags = ("--chunks", STEP_CHUNKS, "--kv", "f16", "--device", "cuda")
    replayed = step_logits(model, sequences, *flags)
    direct = step_logits(model, sequences, *flags,
                         env={**os.environ, "BARELLM_CUDA_GRAPHS": "0"})
    assert_close(replayed, direct, "graphs against direct launches", 1e-4)

"""The CUDA backend against the CPU backend: logits at every position, for stories260K and
synthetic checkpoints with awkward shapes (sizes off every vector width, GQA, a group of 8
query heads per KV head, head_dim 34/64/128, a sliding window shorter than the prompt,
llama3 RoPE scaling, tied and untied output), f32/f16/bf16 weights, f32/f16 KV cache,
contexts of 1, 7, 100 and 4096 positions; the batched prefill's logits at every position
(one batch and more than one) and `ppl`; plus every kernel on its own
(build/cuda_kernel_check), graph replay against direct launches, `run` and `bench`.

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
                             cuda_unavailable_reason, need_shared, require_cuda, run)

BARELLM = os.path.join(BUILD, "barellm")
DUMP_LOGITS = os.path.join(BUILD, "dump_logits")
KERNEL_CHECK = os.path.join(BUILD, "cuda_kernel_check")

TOLERANCE = 1e-3  # relative error of the logits of each position, CUDA against CPU
# The same for batched prefill, by weight dtype: the GPU's GEMMs read their input rows rounded
# to the weights' dtype (f16 keeps 11 significant bits, bf16 8; the CPU's bf16 GEMM, which
# rounds the same way, shows up to 6e-3 against f32 activations in test_end_to_end).
PREFILL_TOLERANCE = {"f32": 1e-3, "f16": 3e-3, "bf16": 1e-2}


@pytest.fixture(scope="module")
def cuda():
    require_cuda()


def dump_logits(model, ids, *flags, env=None):
    """Logits [len(ids), vocab] from build/dump_logits."""
    out = f"{model}.{os.getpid()}.logits"
    result = subprocess.run([DUMP_LOGITS, model, out, *map(str, ids), *flags],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    logits = np.fromfile(out, dtype=np.float32).reshape(len(ids), -1)
    os.unlink(out)
    return logits


def assert_close(got, want, what, tolerance=TOLERANCE):
    """Per-position relative error of the logits within tolerance, and no NaN."""
    assert np.isfinite(got).all(), f"{what}: non-finite logits"
    errors = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    worst = int(errors.argmax())
    assert errors[worst] <= tolerance, (
        f"{what}: relative error {errors[worst]:.2e} at position {worst} "
        f"(median {np.median(errors):.2e})")


def compare_with_cpu(model, ids, kv):
    cpu = dump_logits(model, ids, "--kv", kv)
    gpu = dump_logits(model, ids, "--kv", kv, "--device", "cuda")
    assert_close(gpu, cpu, f"{os.path.basename(model)} kv {kv}, {len(ids)} positions")


def compare_prefill_with_cpu(model, dtype, ids, kv):
    """Every position's logits from one prefill call (batches of up to 512 tokens)."""
    cpu = dump_logits(model, ids, "--kv", kv, "--prefill")
    gpu = dump_logits(model, ids, "--kv", kv, "--prefill", "--device", "cuda")
    assert_close(gpu, cpu, f"{os.path.basename(model)} prefill kv {kv}, {len(ids)} positions",
                 PREFILL_TOLERANCE[dtype])


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
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """models(name, dtype) -> path of a converted checkpoint, made once per test module.
    name is "stories260K" or a SYNTHETIC key."""
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
            config_path = directory / "config.json"
            config_path.write_text(json.dumps(SYNTHETIC[name]))
            result = run(SYNTH, "--config", config_path, "--tokenizer", STORIES, "-o", hf_dir,
                         "--dtype", "f32", "--seed", "5")
            assert result.returncode == 0, result.stderr
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


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("length", [1, 7, 512])
def test_stories260k_cuda_matches_cpu(cuda, models, dtype, kv, length):
    compare_with_cpu(models("stories260K", dtype), token_ids(length, seed=length), kv)


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
@pytest.mark.parametrize("dtype,kv", [("f32", "f32"), ("f32", "f16"), ("f16", "f16"),
                                      ("bf16", "f16")])
@pytest.mark.parametrize("length", [1, 7, 100])
def test_synthetic_cuda_matches_cpu(cuda, models, name, dtype, kv, length):
    compare_with_cpu(models(name, dtype), token_ids(length, seed=length), kv)


@pytest.mark.parametrize("name", ["gqa-window", "wide-heads"])
@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_long_context_cuda_matches_cpu(cuda, models, name, kv):
    compare_with_cpu(models(name, "f16"), token_ids(4096, seed=4096), kv)


@pytest.mark.parametrize("name", ["stories260K"] + sorted(SYNTHETIC))
@pytest.mark.parametrize("dtype,kv", [("f32", "f32"), ("f32", "f16"), ("f16", "f16"),
                                      ("bf16", "f16")])
@pytest.mark.parametrize("length", [1, 7, 100, 700])
def test_prefill_cuda_matches_cpu(cuda, models, name, dtype, kv, length):
    """700 tokens: two batches, the second continuing the cache of the first (and crossing
    gqa-window's sliding window)."""
    compare_prefill_with_cpu(models(name, dtype), dtype, token_ids(length, seed=length), kv)


@pytest.mark.parametrize("name,text,context", [
    ("stories260K", "tinystories_valid_sample.txt", 512),
    ("stories260K", "tinyshakespeare.txt", 512),
    # 700 positions: each prefill call runs a batch of 512 and one of 188.
    ("gqa-window", "tinystories_valid_sample.txt", 700)])
def test_ppl_cuda_matches_cpu(cuda, models, name, text, context):
    text = os.path.join(SHARED, "eval", text)
    need_shared(text)
    values = []
    for device in ("cpu", "cuda"):
        result = subprocess.run([BARELLM, "ppl", models(name, "f32"), "-f", text,
                                 "--ctx", str(context), "--chunks", "3", "--kv", "f32",
                                 "--device", device],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        last = result.stdout.strip().splitlines()[-1]
        assert last.startswith("PPL = "), result.stdout
        values.append(float(last.split()[2]))
    assert abs(values[1] - values[0]) <= 1e-3 * values[0], values


def test_graph_replay_equals_direct_launches(cuda, models):
    """The captured graph and plain launches run the same kernels: identical logits."""
    model = models("gqa-window", "bf16")
    ids = token_ids(64, seed=64)
    replayed = dump_logits(model, ids, "--device", "cuda")
    direct = dump_logits(model, ids, "--device", "cuda",
                         env={**os.environ, "BARELLM_CUDA_GRAPHS": "0"})
    assert np.array_equal(replayed, direct)


def test_run_greedy_text_matches_cpu(cuda, models):
    model = models("stories260K", "f32")
    texts = []
    for device in ("cpu", "cuda"):
        result = subprocess.run([BARELLM, "run", model, "-p", "Once upon a time", "-n", "40",
                                 "--temp", "0", "--device", device, "--kv", "f32"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        texts.append(result.stdout)
    assert texts[0] == texts[1]
    assert "Lily" in texts[1]


def test_bench_reports_device_to_device_bandwidth(cuda, models):
    result = subprocess.run([BARELLM, "bench", models("stories260K", "f16"), "--device", "cuda",
                             "-p", "16", "-n", "16", "-r", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "| cuda |" in result.stdout
    assert "device-to-device copy" in result.stdout


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

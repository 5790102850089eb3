"""The CUDA backend whole, on the CPU emulation of CUDA: build/emulated/ (`make emulated`:
kernels/*.cu compiled by g++ on tests/emulation/, with the CUDA runtime's host API emulated
by cuda_runtime_emulation.h) runs `--device cuda` with every kernel of the forward pass on
the CPU. tests/test_cuda.py's checks run on it here, on every machine, with prompts short
enough for the emulation (a fraction of a second per token): logits at every position
against the CPU backend, for decode and the batched prefill of every weight type (and a
prompt of two batches), the block-type mixes, the Qwen, Gemma and mixture-of-experts
shapes, the server's step over the paged KV cache, graph replay against direct launches,
dependent launch and the warpgroup GEMM of an emulated sm_90, the simple tiles of an sm_75,
`run`, `bench`, `serve` (four clients at once) and the GPU ladder.

What this adds to the unit tests, which run each kernel alone on the emulation: the host side
of the backend (kernels/forward.cu: uploads, buffers, launch shapes and rules, graph capture
and replay, the server's step), which otherwise runs only on a machine with a GPU. The
emulated runtime also refuses what CUDA would: copies outside device memory, allocations
while a graph is captured, dynamic shared memory beyond a kernel's allowance; device memory
starts as NaN, so a buffer read before it is written shows.

The emulated GPU is an sm_80 with 3 SMs unless a test says otherwise (BARELLM_EMULATED_GPU).
"""

import concurrent.futures
import os
import subprocess

import numpy as np
import pytest

import test_cuda as gpu
from convert_testlib import BUILD
from test_cuda import (BLOCK_MIXES, GEMMA, QWEN, SYNTHETIC, compare_prefill_with_cpu,
                       compare_quantized_prefill_with_cpu, compare_with_cpu, dump_logits,
                       token_ids, tolerance)
from test_cuda import block_mix, models  # noqa: F401 (fixtures)

EMULATED = os.path.join(BUILD, "emulated")
LENGTH = 7  # positions per prompt: a few per window and split, seconds on the emulation
HOPPER = {"BARELLM_EMULATED_GPU": "90:2"}


@pytest.fixture(autouse=True)
def emulated_build(monkeypatch):
    """test_cuda's helpers run build/emulated/'s programs (its CPU backend is the CPU
    build's: the references are unchanged)."""
    for name in ("BARELLM", "DUMP_LOGITS", "STEP_LOGITS"):
        program = os.path.join(EMULATED, os.path.basename(getattr(gpu, name)))
        assert os.path.exists(program), f"{program} is missing: `make emulated` builds it"
        monkeypatch.setattr(gpu, name, program)


def environment(**variables):
    return {**os.environ, **variables}


def prefill(model, dtype, kv, ids, gpu_env=None):
    """One prefill call's logits at every position against the CPU's (q8 and q4: against
    its scalar path and its prefill); the emulated GPU run in gpu_env when given."""
    if dtype in ("q8", "q4"):
        compare_quantized_prefill_with_cpu(model, ids, kv, gpu_env=gpu_env)
    else:
        compare_prefill_with_cpu(model, dtype, ids, kv, gpu_env=gpu_env)


def decode_and_prefill(model, dtype, kv, ids):
    """Decode's logits at every position, then one prefill call's, against the CPU's."""
    compare_with_cpu(model, ids, kv, tolerance(dtype))
    prefill(model, dtype, kv, ids)


@pytest.mark.parametrize("dtype,kv", [("f32", "f32"), ("f16", "f16"), ("bf16", "f16"),
                                      ("q8", "f16"), ("q4", "f32")])
def test_stories260k_decode_and_prefill(models, dtype, kv):
    decode_and_prefill(models("stories260K", dtype), dtype, kv, token_ids(LENGTH, seed=1))


@pytest.mark.parametrize("name,dtype,kv", [("stories260K", "f16", "f16"),
                                           ("gqa-window", "f32", "f32"), ("stories260K", "q4", "f32")])
def test_prefill_in_two_batches(models, name, dtype, kv):
    """520 tokens: a batch of 512, then one of 8 continuing its cache (gqa-window's window of
    50 crossing from one to the other)."""
    prefill(models(name, dtype), dtype, kv, token_ids(520, seed=8))


@pytest.mark.parametrize("name", sorted(SYNTHETIC) + sorted(QWEN))
@pytest.mark.parametrize("dtype,kv", [("f16", "f16"), ("q4", "f32")])
def test_shapes_decode_and_prefill(models, name, dtype, kv):
    """Widths off every vector, GQA, groups of 8, windows, tied output; Qwen's biases and
    q/k norms."""
    decode_and_prefill(models(name, dtype), dtype, kv, token_ids(LENGTH, seed=2))


@pytest.mark.parametrize("name", sorted(GEMMA))
@pytest.mark.parametrize("dtype,kv", [("bf16", "f16"), ("q8", "f32")])
def test_gemma_decode_and_prefill(models, name, dtype, kv):
    """Scaled embeddings, post norms, GeGLU, sliding and full layers (heads of 256 in
    gemma3-1b-heads), Gemma 2's soft-capped scores and logits."""
    decode_and_prefill(models(name, dtype), dtype, kv, token_ids(LENGTH, seed=3))


@pytest.mark.parametrize("mix", sorted(BLOCK_MIXES))
def test_block_types_decode_and_prefill(block_mix, mix):
    gpu.test_block_types_cuda_match_cpu(None, block_mix, mix, LENGTH)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])
@pytest.mark.parametrize("dtype", ["f16", "q4"])
def test_mixture_of_experts_decode_and_prefill(tmp_path, name, dtype):
    gpu.test_mixture_of_experts_cuda_matches_cpu(None, tmp_path, name, dtype, LENGTH)


@pytest.mark.parametrize("dtype", ["f32", "mxfp4"])
def test_gpt_oss_decode_and_prefill(tmp_path, dtype):
    gpu.test_gpt_oss_cuda_matches_cpu(None, tmp_path, dtype, LENGTH)


# The server's step: four sequences, the first steps of 1 + 5 + 24 + 1 rows (the GEMMs),
# the later ones fewer than 16 (the batched matvec). The longest, 24 positions a step, fills
# a block of 64 over three steps: a block copied between them must be copied whole.
STEP_LENGTHS = (10, 9, 66, 4)


@pytest.fixture
def short_steps(monkeypatch):
    monkeypatch.setattr(gpu, "STEP_LENGTHS", STEP_LENGTHS)


@pytest.mark.parametrize("name,dtype,kv", [("stories260K", "f32", "f32"),
                                           ("gemma3", "f32", "f16"), ("gemma2", "f16", "f32"),
                                           ("qwen3-attention-bias", "f16", "f16"),
                                           ("group-of-8", "q4", "f32")])
def test_step_matches_cpu_forward(short_steps, models, name, dtype, kv):
    gpu.test_step_matches_cpu_forward(None, models, name, dtype, kv, block_size=16)


def test_step_mixture_of_experts_and_block_types(short_steps, tmp_path, block_mix):
    gpu.test_step_mixture_of_experts_matches_cpu(None, tmp_path, "qwen3_moe", "q8")
    gpu.test_step_block_types_match_cpu(None, block_mix, "q4_k_m")


def test_step_gpt_oss(short_steps, tmp_path):
    gpu.test_step_gpt_oss_matches_cpu(None, tmp_path)


def test_step_graphs_and_copied_blocks(short_steps, models):
    gpu.test_step_graphs_match_direct_launches(None, models)
    gpu.test_step_sparse_logits_and_copied_blocks(None, models)


@pytest.mark.parametrize("name,dtype", [("gqa-window", "bf16"), ("stories260K", "q4")])
def test_graph_replay_equals_direct_launches(models, name, dtype):
    model = models(name, dtype)
    ids = token_ids(LENGTH, seed=4)
    replayed = dump_logits(model, ids, "--device", "cuda")
    direct = dump_logits(model, ids, "--device", "cuda",
                         env=environment(BARELLM_CUDA_GRAPHS="0"))
    assert np.array_equal(replayed, direct)


@pytest.mark.parametrize("name,dtype", [("gqa-window", "bf16"), ("stories260K", "q8"),
                                        ("gemma3-1b-heads", "f16")])
def test_dependent_launch_on_sm90_equals_stream_order(models, name, dtype):
    """BARELLM_CUDA_PDL=1 on an emulated sm_90: the launches with the attribute, captured
    and direct (the emulation runs them in order; the unit tests check each kernel's
    prologue)."""
    model = models(name, dtype)
    ids = token_ids(LENGTH, seed=5)
    in_order = dump_logits(model, ids, "--device", "cuda", env=environment(**HOPPER))
    for graphs in ("1", "0"):
        overlapped = dump_logits(model, ids, "--device", "cuda",
                                 env=environment(**HOPPER, BARELLM_CUDA_PDL="1",
                                                 BARELLM_CUDA_GRAPHS=graphs))
        assert np.array_equal(in_order, overlapped), f"graphs {graphs}"


@pytest.mark.parametrize("name,dtype", [("wide-heads", "f16"), ("qwen2-window", "bf16"),
                                        ("gemma3", "f16"), ("stories260K", "q4")])
def test_warpgroup_gemm_prefill_on_sm90(models, name, dtype):
    """The prefill's GEMMs on the warpgroup GEMM (BARELLM_CUDA_WGMMA=always) of an emulated
    sm_90a: tensor maps, clusters and the gated form from the host code's own launches."""
    model = models(name, dtype)
    ids = token_ids(20, seed=6)
    prefill(model, dtype, "f32" if dtype == "q4" else "f16", ids,
            gpu_env=environment(**HOPPER, BARELLM_CUDA_WGMMA="always"))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_sm75_prefill(models, dtype):
    """An sm_75 (Turing): f16 on the mma tiles without cp.async, bf16 on the SIMT GEMM."""
    model = models("wide-heads", dtype)
    compare_prefill_with_cpu(model, dtype, token_ids(LENGTH, seed=7), "f16",
                             gpu_env=environment(BARELLM_EMULATED_GPU="75:3"))


def test_run_greedy_text_matches_cpu(models):
    model = models("stories260K", "f32")
    texts = []
    for device in ("cpu", "cuda"):
        result = subprocess.run([gpu.BARELLM, "run", model, "-p", "Once upon a time", "-n",
                                 "24", "--temp", "0", "--device", device, "--kv", "f32"],
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        texts.append(result.stdout)
    assert texts[0] == texts[1]


def test_bench_runs(models):
    result = subprocess.run([gpu.BARELLM, "bench", models("stories260K", "q4"), "--device",
                             "cuda", "-p", "8", "-n", "4", "-r", "1"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "| cuda |" in result.stdout and "device-to-device copy" in result.stdout


def test_bench_at_a_depth_runs(models):
    """bench -d on the CUDA backend: the fill's prefill, then pp and tg from position 40."""
    result = subprocess.run([gpu.BARELLM, "bench", models("stories260K", "f16"), "--device",
                             "cuda", "-p", "8", "-n", "4", "-d", "40", "-r", "1"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "| pp8 @ d40 |" in result.stdout and "| tg4 @ d40 |" in result.stdout


def test_every_gpu_rung_runs_qwen_as_the_cpu(models):
    gpu.test_every_gpu_rung_runs_qwen_as_the_cpu(None, models, "qwen3-attention-bias")


def test_serve_concurrent_greedy_requests_equal_run(tmp_path_factory):
    """`barellm serve --device cuda`: the scheduler's steps on the CUDA backend (prompt chunks
    beside decode rows, graphs per bucket of rows, the paged cache), four clients at once
    through the `openai` client, each the greedy text of `run` on the CPU."""
    serve = pytest.importorskip("test_serve")
    model = serve.make_chat_model(tmp_path_factory)
    server = serve.Server(model, "--ctx", serve.CONTEXT, "--parallel", 4, program=gpu.BARELLM,
                          device="cuda")
    try:
        client = server.client()

        def complete(prompt):
            return client.completions.create(model=server.model_id, prompt=prompt,
                                             max_tokens=16, temperature=0).choices[0].text

        prompts = serve.PROMPTS[:4]
        # One request alone first: the openai client's pydantic models build their schemas on
        # first use, and four threads doing that at once can fail inside pydantic.
        client.completions.create(model=server.model_id, prompt=prompts[0], max_tokens=1)
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(complete, prompts))
        assert together == [serve.run_greedy(model, p, 16) for p in prompts]
    finally:
        assert server.stop() == 0, "".join(server.lines)


def test_wrong_emulated_gpu_is_one_line(models):
    result = subprocess.run([gpu.DUMP_LOGITS, models("stories260K", "f32"), os.devnull, "1",
                             "--device", "cuda"], capture_output=True, text=True,
                            env=environment(BARELLM_EMULATED_GPU="70:3"), timeout=60)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "BARELLM_EMULATED_GPU" in lines[0], result.stderr

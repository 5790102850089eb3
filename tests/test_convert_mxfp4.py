"""ggml's MXFP4 blocks (the OCP microscaling format's FP4: an E8M0 exponent byte, then 32 E2M1
nibbles) in the converter and both backends: a Llama GGUF mixing random MXFP4 matrices with Q8_0
ones, and a Qwen3-MoE GGUF whose experts are MXFP4 and the rest Q8_0 or F32 (llama-quantize's
MXFP4_MOE layout), keep every block byte for byte; barellm's logits on them are those of the
numpy reference forward pass (reference/model.py) on the weights the gguf package dequantizes
(scalar, SIMD decode and prefill, and the CUDA backend, on the CPU emulation of CUDA and on the
GPU where there is one, against the CPU); a scale exponent under which a weight would not be a finite f32 is refused in one line;
llama-quantize's own MXFP4_MOE file (where it is built) is kept matrix for matrix. The
converter's own `--dtype mxfp4_moe` quantizes as the gguf package does, and gives
llama-quantize's file byte for byte."""

import json
import os
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="pip package gguf missing")

import model as reference  # noqa: E402
import test_cuda as gpu  # noqa: E402
from test_cuda import cuda_program  # noqa: E402,F401
from convert_testlib import (REPO, TINY_CONFIG, make_checkpoint, read_raw,  # noqa: E402
                             tiny_tensors)
from test_convert_kquants import (assert_logits_match, assert_refused,  # noqa: E402
                                  assert_same_matrices, convert, gguf_from_hf, llama_quantize,
                                  logits, metadata, rewritten_gguf, rotate_half)
from test_moe import CONFIGS as MOE_CONFIGS, moe_tensors  # noqa: E402

MXFP4 = gguf.GGMLQuantizationType.MXFP4
Q8_0 = gguf.GGMLQuantizationType.Q8_0
# The RMS of the 16 levels (the E2M1 values doubled), each nibble equally likely.
LEVEL_RMS = float(np.sqrt(np.mean(np.square(gguf.quants.MXFP4.kvalues))))
LARGEST_EXPONENT = 252  # 12 · 2^(252 − 128) < 2^128 <= 12 · 2^(253 − 128)

# Rows of 160 and 224 weights (5 and 7 blocks); head_dim 32, 5 query heads on one KV head.
DENSE_CONFIG = {**TINY_CONFIG, "hidden_size": 160, "intermediate_size": 224,
                "num_attention_heads": 5, "num_key_value_heads": 1, "vocab_size": 41}
HEAD_DIM = 32
# Each matrix's type in the dense file: MXFP4 but for these (a barellm name's last part).
DENSE_Q8_0 = ("wk", "wv", "token_embedding", "output")
PARTS = {"wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output", "w1": "ffn_gate",
         "w3": "ffn_up", "w2": "ffn_down"}
# Qwen3-MoE, every layer sparse (llama.cpp has no dense layers among sparse ones), rows whole
# blocks; every expert chosen for every token, so that the activations' 8-bit rounding on the
# SIMD paths cannot flip a choice between two close experts.
MOE_CONFIG = {**MOE_CONFIGS["qwen3_moe"], "hidden_size": 64, "intermediate_size": 96,
              "moe_intermediate_size": 32, "head_dim": 16, "num_experts": 6,
              "num_experts_per_tok": 6, "mlp_only_layers": [], "num_hidden_layers": 2,
              "norm_topk_prob": True}
EXPERT_PARTS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
IDS = [1, 5, 9, 30, 31, 7, 2, 17, 3, 12, 40]


def dense_matrices():
    """(barellm name, GGUF name, [rows, cols]) of every matrix of DENSE_CONFIG."""
    dim, hidden = DENSE_CONFIG["hidden_size"], DENSE_CONFIG["intermediate_size"]
    kv = DENSE_CONFIG["num_key_value_heads"] * HEAD_DIM
    shapes = {"wq": (dim, dim), "wk": (kv, dim), "wv": (kv, dim), "wo": (dim, dim),
              "w1": (hidden, dim), "w3": (hidden, dim), "w2": (dim, hidden)}
    yield "token_embedding", "token_embd.weight", (DENSE_CONFIG["vocab_size"], dim)
    yield "output", "output.weight", (DENSE_CONFIG["vocab_size"], dim)
    for layer in range(DENSE_CONFIG["num_hidden_layers"]):
        for short, shape in shapes.items():
            yield f"layers.{layer}.{short}", f"blk.{layer}.{PARTS[short]}.weight", shape


def dense_type(name):
    return "Q8_0" if name.rsplit(".", 1)[-1] in DENSE_Q8_0 else "MXFP4"


def random_mxfp4(rows, cols, rng):
    """Rows of random MXFP4 blocks (uint8 [rows, row bytes]): random nibbles, each block's
    exponent within one of the power of two that gives weights of RMS about cols^-1/2."""
    raw = rng.integers(0, 256, (rows * cols // 32, 17), dtype=np.uint8)
    centre = 128 + np.log2(1 / (LEVEL_RMS * np.sqrt(cols)))
    raw[:, 0] = np.round(centre + rng.uniform(-1, 1, len(raw))).astype(np.uint8)
    return raw.reshape(rows, -1)


def random_q8_0(rows, cols, rng):
    values = rng.normal(0, cols ** -0.5, (rows, cols)).astype(np.float32)
    return gguf.quants.quantize(values, Q8_0)


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    """(Hugging Face checkpoint, {GGUF name: (type, blocks)}, the checkpoint's F32 GGUF, the
    converted file of its matrices replaced by those blocks)."""
    path = tmp_path_factory.mktemp("mxfp4")
    hf = make_checkpoint(path / "hf", config=DENSE_CONFIG,
                         tensors=tiny_tensors(DENSE_CONFIG, seed=4))
    rng = np.random.default_rng(5)
    replaced = {}
    for name, gguf_name, (rows, cols) in dense_matrices():
        kind = dense_type(name)
        replaced[gguf_name] = (kind, (random_q8_0 if kind == "Q8_0" else random_mxfp4)(
            rows, cols, rng))
    source = gguf_from_hf(hf, path / "f32.gguf")
    quantized = rewritten_gguf(source, path / "m.gguf", replaced,
                               file_type=gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    out, log = convert(quantized, path / "m.bin")
    assert log == "", log
    return hf, replaced, source, out


def test_mxfp4_blocks_are_kept_byte_for_byte(dense):
    """Every matrix keeps its GGUF type, named in barellm.matrix_types, and each MXFP4 matrix
    its blocks (q rows moved whole into rotate-half order)."""
    _, replaced, _, out = dense
    types = json.loads(metadata(out)["barellm.matrix_types"])
    assert types == {name: dense_type(name) for name, _, _ in dense_matrices()}
    tensors = read_raw(out)[2]
    for name, gguf_name, _ in dense_matrices():
        kind, raw = replaced[gguf_name]
        if kind != "MXFP4":
            continue
        if name.endswith(".wq"):
            raw = rotate_half(raw, HEAD_DIM)
        assert tensors[name].dtype == np.uint8
        assert np.array_equal(tensors[name], raw), name


def dense_reference(hf, replaced):
    """reference/model.py's logits of IDS on the checkpoint's norms and the matrices of
    `replaced`, dequantized by the gguf package (q and k rows in rotate-half order)."""
    config, weights = reference.load_hf(hf)
    for name, gguf_name, _ in dense_matrices():
        kind, raw = replaced[gguf_name]
        values = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind])
        assert np.isfinite(values).all()
        weights[name] = rotate_half(values, HEAD_DIM) if name.endswith((".wq", ".wk")) \
            else values
    return reference.forward(config, weights, IDS)


def test_mxfp4_logits_are_the_references(dense):
    hf, replaced, _, out = dense
    assert_logits_match(out, IDS, dense_reference(hf, replaced), "dense MXFP4 and Q8_0")


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """(the F32 GGUF of a Qwen3-MoE checkpoint, {GGUF name: (type, blocks)} of its experts as
    MXFP4 and its other matrices as Q8_0, the converted file)."""
    path = tmp_path_factory.mktemp("mxfp4_moe")
    hf = make_checkpoint(path / "hf", config=MOE_CONFIG,
                         tensors=moe_tensors(MOE_CONFIG, near_tie=False))
    source = gguf_from_hf(hf, path / "f32.gguf")
    replaced = {}
    for tensor in gguf.GGUFReader(str(source)).tensors:
        values = np.asarray(tensor.data, dtype=np.float32)
        if tensor.name.split(".")[-2] in EXPERT_PARTS:
            replaced[tensor.name] = ("MXFP4", gguf.quants.quantize(values, MXFP4))
        elif values.ndim == 2 and "gate_inp" not in tensor.name:
            replaced[tensor.name] = ("Q8_0", gguf.quants.quantize(values, Q8_0))
    quantized = rewritten_gguf(source, path / "m.gguf", replaced,
                               file_type=gguf.LlamaFileType.MOSTLY_MXFP4_MOE)
    out, log = convert(quantized, path / "m.bin")
    assert log == "", log
    return source, replaced, out


def moe_reference(model):
    """reference/model.py's logits of IDS on the weights of the barellm file `model`, the
    MXFP4 and Q8_0 matrices dequantized by the gguf package from the blocks it holds."""
    config, weights = reference.load(model)
    stored = read_raw(model)[2]
    for name, kind in json.loads(metadata(model)["barellm.matrix_types"]).items():
        if kind == "MXFP4":
            weights[name] = gguf.quants.dequantize(stored[name], MXFP4)
    return reference.forward(config, weights, IDS)


def test_mxfp4_experts_are_kept_and_run_as_the_reference(moe):
    """The experts keep their MXFP4 blocks, stacked as the GGUF stacks them (one matrix of
    experts × rows); the logits are the reference's on them."""
    _, replaced, out = moe
    types = json.loads(metadata(out)["barellm.matrix_types"])
    experts = {name for name, kind in types.items() if ".experts." in name}
    assert experts and all(types[name] == "MXFP4" for name in experts)
    assert {kind for name, kind in types.items() if name not in experts} >= {"Q8_0"}
    tensors = read_raw(out)[2]
    for layer in range(MOE_CONFIG["num_hidden_layers"]):
        for short, part in zip(("w1", "w3", "w2"), EXPERT_PARTS):
            raw = replaced[f"blk.{layer}.{part}.weight"][1]
            assert np.array_equal(tensors[f"layers.{layer}.experts.{short}"],
                                  raw.reshape(-1, raw.shape[-1]))
    assert_logits_match(out, IDS, moe_reference(out), "MXFP4 experts")


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_mxfp4_on_the_cuda_backend(dense, moe, which, cuda_program):  # noqa: F811
    """The CUDA backend (on the CPU emulation of CUDA, and on the GPU where there is one),
    held as tests/test_cuda.py holds the other block types (compare_block_types_with_cpu)."""
    model = str(dense[3] if which == "dense" else moe[2])
    ids = gpu.token_ids(7, seed=7, vocab=DENSE_CONFIG["vocab_size"])
    gpu.compare_block_types_with_cpu(model, ids, f"{which} MXFP4", program=cuda_program)


@pytest.mark.parametrize("exponent", [LARGEST_EXPONENT + 1, 255])
def test_an_mxfp4_exponent_beyond_f32_is_refused(tmp_path, dense, exponent):
    """Block 5 of a matrix has an exponent under which its largest level would overflow f32
    (255 is NaN in the OCP format); the largest allowed one converts."""
    _, replaced, source, _ = dense
    raw = replaced["blk.0.attn_q.weight"][1].copy()
    blocks = raw.reshape(-1, 17)
    blocks[5, 0] = exponent
    data = rewritten_gguf(source, tmp_path / "q.gguf",
                          {"blk.0.attn_q.weight": ("MXFP4", raw)}).read_bytes()
    assert_refused(tmp_path, data, f"tensor 'blk.0.attn_q.weight' has scale exponent "
                                   f"{exponent} (byte 0) in MXFP4 block 5")
    blocks[5, 0] = LARGEST_EXPONENT
    largest = rewritten_gguf(source, tmp_path / "largest.gguf",
                             {"blk.0.attn_q.weight": ("MXFP4", raw)})
    assert convert(largest, tmp_path / "largest.bin")[1] == ""


def test_llama_quantize_mxfp4_moe_is_kept(tmp_path, moe):
    """llama-quantize's MXFP4_MOE file of the Qwen3-MoE checkpoint keeps every matrix's type
    and blocks and runs as the reference on them."""
    theirs = llama_quantize(moe[0], tmp_path / "mxfp4_moe.gguf", "MXFP4_MOE")
    tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(str(theirs)).tensors}
    kinds = {name: tensor.tensor_type.name for name, tensor in tensors.items()}
    assert {kinds[name] for name in kinds if name.split(".")[-2] in EXPERT_PARTS} == {"MXFP4"}
    out, log = convert(theirs, tmp_path / "m.bin")
    assert log == "", log
    stored = read_raw(out)[2]
    for layer in range(MOE_CONFIG["num_hidden_layers"]):
        for short, part in zip(("w1", "w3", "w2"), EXPERT_PARTS):
            raw = np.asarray(tensors[f"blk.{layer}.{part}.weight"].data)
            assert np.array_equal(stored[f"layers.{layer}.experts.{short}"],
                                  raw.reshape(-1, raw.shape[-1]))
    want = moe_reference(out)
    got = logits(out, IDS, "--kv", "f32", "--simd", "scalar")
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4


def test_quantize_mxfp4_is_the_gguf_packages():
    """The converter's MXFP4 quantizer (convert/kquants.py, ggml's quantize_row_mxfp4_ref)
    gives the gguf package's blocks byte for byte: blocks of magnitudes from 2^-20 to 2^20, a
    block of zeros, one holding a single value, and blocks of values midway between two levels
    (the first of two equally near wins)."""
    sys.path.insert(0, os.path.join(REPO, "convert"))
    import kquants
    rng = np.random.default_rng(13)
    gaussian = rng.standard_normal((64, 32)) * np.exp2(rng.integers(-20, 20, (64, 1)))
    single = np.zeros((1, 32))
    single[0, 7] = -3.0
    levels = np.array(gguf.quants.MXFP4.kvalues[:8], dtype=np.float64) / 2
    midway = (levels[:-1] + levels[1:]) / 2  # E2M1 values midway between two levels
    ties = rng.choice(np.concatenate([midway, -midway, [6.0]]), (8, 32)) * np.exp2(
        rng.integers(-4, 4, (8, 1)))
    x = np.concatenate([gaussian, np.zeros((1, 32)), single, ties]).astype(np.float32)
    got = kquants.quantize(x.reshape(1, -1), "MXFP4").reshape(len(x), -1)
    assert np.array_equal(got, gguf.quants.quantize(x, MXFP4))


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("mxfp4_moe_hf")
    return make_checkpoint(path / "hf", config=MOE_CONFIG,
                           tensors=moe_tensors(MOE_CONFIG, seed=2, near_tie=False))


def test_dtype_mxfp4_moe_quantizes_the_experts(tmp_path, moe_checkpoint):
    """--dtype mxfp4_moe of a Qwen3-MoE checkpoint: the experts in MXFP4, the gguf package's
    blocks of their weights; every other matrix Q8_0; the router F32; the logits the
    reference's on the file's weights."""
    out, log = convert(moe_checkpoint, tmp_path / "m.bin", "--dtype", "mxfp4_moe")
    assert log == "", log
    types = json.loads(metadata(out)["barellm.matrix_types"])
    assert {kind for name, kind in types.items() if ".experts." in name} == {"MXFP4"}
    assert {kind for name, kind in types.items() if ".experts." not in name} == {"Q8_0"}
    assert json.loads(metadata(out)["barellm.config"])["weight_dtype"] == "MXFP4_MOE"
    hf = reference.read_safetensors(os.path.join(moe_checkpoint, "model.safetensors"))[0]
    stored = read_raw(out)[2]
    for layer in range(MOE_CONFIG["num_hidden_layers"]):
        for short, part in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            experts = np.stack([hf[f"model.layers.{layer}.mlp.experts.{e}.{part}.weight"]
                                for e in range(MOE_CONFIG["num_experts"])])
            blocks = gguf.quants.quantize(experts.astype(np.float32), MXFP4)
            assert np.array_equal(stored[f"layers.{layer}.experts.{short}"],
                                  blocks.reshape(-1, blocks.shape[-1])), (layer, short)
    assert_logits_match(out, IDS, moe_reference(out), "--dtype mxfp4_moe")


def test_dtype_mxfp4_moe_is_llama_quantizes(tmp_path, moe_checkpoint):
    """The converter's MXFP4_MOE file of the checkpoint and llama-quantize's of its F32 GGUF
    (converted as it is) have the same type for every matrix and the same bytes in every
    tensor."""
    f32 = gguf_from_hf(moe_checkpoint, tmp_path / "f32.gguf")
    theirs = llama_quantize(f32, tmp_path / "theirs.gguf", "MXFP4_MOE")
    ours, _ = convert(moe_checkpoint, tmp_path / "ours.bin", "--dtype", "mxfp4_moe")
    kept, _ = convert(theirs, tmp_path / "theirs.bin")
    assert_same_matrices(ours, kept)

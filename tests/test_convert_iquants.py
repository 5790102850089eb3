"""ggml's i-quant block types in the converter: GGUF matrices of IQ2_XXS, IQ2_XS, IQ2_S,
IQ3_XXS, IQ3_S, IQ1_S and IQ1_M kept byte for byte beside K-quant ones, as llama.cpp's files
mix them; barellm's logits on such a file those of the numpy reference forward pass
(reference/model.py) on the weights that the gguf package dequantizes; hostile blocks
refused; the lattice grids of src/weights/iq_grids.inc the gguf package's; llama-quantize's
IQ3 files (where it is built) kept matrix for matrix; the CUDA backend (on the CPU emulation
of CUDA, and on the GPU where there is one) on two files holding the seven types between
them, against the CPU."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="pip package gguf missing")

import model as reference  # noqa: E402
import test_cuda as gpu  # noqa: E402
from test_cuda import cuda_program  # noqa: E402,F401
from test_cli import assert_refused as assert_barellm_refused, barellm  # noqa: E402
from convert_testlib import (REPO, TINY_CONFIG, make_checkpoint, read_raw,  # noqa: E402
                             tiny_tensors)
from test_convert_kquants import (assert_logits_match, llama_quantize,  # noqa: E402
                                  assert_refused, convert, gguf_from_hf, logits, metadata,
                                  rewritten_gguf, rotate_half)

IQ_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M")
# Rows of 512 and 768 weights (2 and 3 super-blocks); head_dim 64, 4 query heads a KV head.
IQ_CONFIG = {**TINY_CONFIG, "hidden_size": 512, "intermediate_size": 768,
             "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 41,
             "num_hidden_layers": 2}
HEAD_DIM = 64
GGUF_PARTS = {"wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output",
              "w1": "ffn_gate", "w3": "ffn_up", "w2": "ffn_down"}
# Byte offsets of the f16 fields of each type's block; IQ1_M's d is the top nibbles of its
# four u16 scales words at IQ1_M_SCALES (d's bits 4i..4i + 3 in word i).
F16_FIELDS = {"Q2_K": (80, 82), "Q4_K": (0, 2), "Q6_K": (208,), "IQ2_XXS": (0,),
              "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,),
              "IQ1_M": (), "TQ1_0": (52,), "TQ2_0": (64,)}
IQ1_M_SCALES = 48
# The matrices of the file of each i-quant that are not of that type (a barellm name, or a
# layer suffix for every layer), as llama-quantize's mixes of it place their companions;
# F32 keeps the source's values.
COMPANIONS = {
    "IQ2_XXS": {"wv": "Q4_K", "layers.1.w2": "Q2_K", "token_embedding": "Q2_K",
                "output": "Q6_K"},
    "IQ2_XS": {"wv": "Q4_K", "w2": "Q2_K", "token_embedding": "F32", "output": "Q6_K"},
    "IQ2_S": {"wv": "IQ3_S", "layers.0.w2": "IQ3_S", "output": "Q6_K"},
    "IQ3_XXS": {"wv": "IQ3_S", "w2": "Q4_K", "token_embedding": "IQ3_S", "output": "Q6_K"},
    "IQ3_S": {"wv": "Q4_K", "layers.0.w2": "Q4_K", "output": "F32"},
    "IQ1_S": {"wv": "Q4_K", "w2": "IQ2_XXS", "token_embedding": "Q2_K", "output": "Q6_K"},
    "IQ1_M": {"wv": "Q4_K", "wo": "IQ2_XXS", "layers.0.w2": "IQ2_XXS",
              "token_embedding": "Q2_K", "output": "Q6_K"},
}
IDS = [1, 5, 9, 30, 31, 7, 2, 17, 3, 12, 40]
# Two files holding the seven i-quants between them for the emulated CUDA backend: a type per
# matrix (a barellm name, or a layer suffix for every layer), the rest of each file's type.
EMULATED_MIXES = {
    "IQ2_XXS": {"wq": "IQ3_S", "wv": "IQ3_S", "w1": "IQ1_M", "layers.1.w2": "IQ1_M",
                "token_embedding": "IQ3_S", "output": "IQ1_M"},
    "IQ2_XS": {"wq": "IQ2_S", "wk": "IQ3_XXS", "w3": "IQ1_S", "layers.0.w2": "IQ2_S",
               "token_embedding": "IQ3_XXS", "output": "IQ1_S"},
}


def qtype(type_name):
    return gguf.GGMLQuantizationType[type_name]


def matrices(config):
    """(barellm name, GGUF name, [rows, cols]) of every matrix of a Llama `config`."""
    dim, hidden, vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    kv = config["num_key_value_heads"] * HEAD_DIM
    shapes = {"wq": (dim, dim), "wk": (kv, dim), "wv": (kv, dim), "wo": (dim, dim),
              "w1": (hidden, dim), "w3": (hidden, dim), "w2": (dim, hidden)}
    yield "token_embedding", "token_embd.weight", (vocab, dim)
    yield "output", "output.weight", (vocab, dim)
    for layer in range(config["num_hidden_layers"]):
        for short, shape in shapes.items():
            yield f"layers.{layer}.{short}", f"blk.{layer}.{GGUF_PARTS[short]}.weight", shape


def matrix_type(type_name, name, mixes=COMPANIONS):
    """The type of the matrix `name` in the file of the i-quant `type_name` (`mixes`)."""
    companions = mixes[type_name]
    return companions.get(name, companions.get(name.rsplit(".", 1)[-1], type_name))


def set_f16_fields(raw, type_name, values):
    """Write `values` (one a block) as f16 into every f16 field of the blocks `raw`
    (uint8 [n, block bytes])."""
    bits = values.astype("<f2").view("<u2")
    if type_name == "IQ1_M":
        words = raw[:, IQ1_M_SCALES:IQ1_M_SCALES + 8].copy().view("<u2")
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12)
        raw[:, IQ1_M_SCALES:IQ1_M_SCALES + 8] = words.view(np.uint8)
    for offset in F16_FIELDS[type_name]:
        raw[:, offset:offset + 2] = bits.view(np.uint8).reshape(-1, 2)


def random_matrix(type_name, rows, cols, rng):
    """Rows of blocks of `type_name` (uint8 [rows, row bytes]) of random bytes (every byte is
    a valid one of these types: TQ2_0's level 3 among them) but for the f16 fields: positive,
    one value a block, sized for weights of RMS about cols^-1/2 (as tiny_tensors' matrices)."""
    weights, size = gguf.GGML_QUANT_SIZES[qtype(type_name)]
    count = rows * cols // weights
    raw = rng.integers(0, 256, (count, size), dtype=np.uint8)
    set_f16_fields(raw, type_name, np.ones(count))
    rms = np.sqrt(np.mean(gguf.quants.dequantize(raw, qtype(type_name)) ** 2))
    set_f16_fields(raw, type_name, rng.uniform(0.5, 1.5, count) / (rms * np.sqrt(cols)))
    return raw.reshape(rows, -1)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(Hugging Face checkpoint of IQ_CONFIG, its f32 GGUF)."""
    path = tmp_path_factory.mktemp("iq")
    hf = make_checkpoint(path / "hf", config=IQ_CONFIG, tensors=tiny_tensors(IQ_CONFIG, seed=3))
    return hf, gguf_from_hf(hf, path / "f32.gguf")


@pytest.fixture(scope="module", params=IQ_TYPES)
def iq_file(request, checkpoint, tmp_path_factory):
    """The file of one i-quant: (its type, {GGUF name: (type, blocks)} of the matrices of
    random blocks, the GGUF, the converted file, the converter's stderr)."""
    type_name = request.param
    made = random_blocks_file(checkpoint[1], tmp_path_factory.mktemp(type_name.lower()),
                              type_name, COMPANIONS,
                              np.random.default_rng(IQ_TYPES.index(type_name)))
    return (type_name, *made)


def random_blocks_file(source, path, type_name, mixes, rng):
    """The f32 GGUF `source` rewritten in `path` as a file of type `type_name` whose matrices
    are random blocks of their type in `mixes` (matrix_type; F32 ones keep their values), and
    that file converted: ({GGUF name: (type, blocks)}, the GGUF, the converted file, the
    converter's stderr)."""
    replaced = {}
    for name, gguf_name, (rows, cols) in matrices(IQ_CONFIG):
        kind = matrix_type(type_name, name, mixes)
        if kind != "F32":
            replaced[gguf_name] = (kind, random_matrix(kind, rows, cols, rng))
    gguf_file = rewritten_gguf(source, path / "m.gguf", replaced,
                               file_type=gguf.LlamaFileType[f"MOSTLY_{type_name}"])
    out, log = convert(gguf_file, path / "m.bin")
    return replaced, gguf_file, out, log


def test_iquant_blocks_are_kept_byte_for_byte(iq_file):
    """Every matrix keeps its GGUF type, named in barellm.matrix_types, and its blocks (q
    and k rows moved whole into rotate-half order); the file is named after the GGUF's
    file type and nothing is dequantized."""
    type_name, replaced, _, out, log = iq_file
    assert log == "", log
    types = assert_blocks_kept(out, type_name, replaced, {
        name: matrix_type(type_name, name) for name, _, _ in matrices(IQ_CONFIG)})
    assert sum(kind == type_name for kind in types.values()) >= 9


def assert_blocks_kept(out, type_name, replaced, want_types):
    """The converted file `out` of a GGUF of file type `type_name` is named after that type,
    its barellm.matrix_types are `want_types`, and every matrix of `replaced` ({GGUF name:
    (type, blocks)}) has its blocks byte for byte (q and k rows moved whole into rotate-half
    order). Returns the matrix types."""
    assert json.loads(metadata(out)["barellm.config"])["weight_dtype"] == type_name
    types = json.loads(metadata(out)["barellm.matrix_types"])
    assert types == want_types
    tensors = read_raw(out)[2]
    for name, gguf_name, _ in matrices(IQ_CONFIG):
        if gguf_name not in replaced:
            continue
        raw = replaced[gguf_name][1]
        if name.endswith((".wq", ".wk")):
            raw = rotate_half(raw, HEAD_DIM)
        assert tensors[name].dtype == np.uint8
        assert np.array_equal(tensors[name], raw), name
    return types


def reference_logits(hf, replaced):
    """reference/model.py's logits of IDS on the checkpoint `hf`'s norms and matrices but
    those of `replaced` ({GGUF name: (type, blocks)}), dequantized by the gguf package (q
    and k rows put in rotate-half order)."""
    config, weights = reference.load_hf(hf)
    for name, gguf_name, _ in matrices(IQ_CONFIG):
        if gguf_name in replaced:
            kind, raw = replaced[gguf_name]
            values = gguf.quants.dequantize(raw, qtype(kind))
            assert np.isfinite(values).all()
            weights[name] = rotate_half(values, HEAD_DIM) if name.endswith((".wq", ".wk")) \
                else values
    return reference.forward(config, weights, IDS)


def test_iquant_logits_are_the_references(iq_file, checkpoint):
    """barellm's logits (the scalar CPU, and the SIMD levels one token at a time and as one
    prefill) are those of reference/model.py on the checkpoint's norms and F32 matrices and
    the others' blocks dequantized by the gguf package."""
    type_name, replaced, _, out, _ = iq_file
    assert_logits_match(out, IDS, reference_logits(checkpoint[0], replaced), type_name)


@pytest.mark.parametrize("type_name,bits,kind,where", [
    ("IQ2_XS", 0x7E00, "NaN", "byte 0"),
    ("IQ3_XXS", 0xFC00, "Inf", "byte 0"),
    ("IQ1_M", 0x7C00, "Inf", "top nibbles of bytes 48..55")])
def test_a_non_finite_iquant_d_is_refused(tmp_path, checkpoint, type_name, bits, kind, where):
    """Block 5's d is NaN or Inf (IQ1_M's from the top nibbles of its scales words)."""
    data = gguf_with_a_non_finite_d(checkpoint[1], tmp_path / "q.gguf", type_name, bits)
    assert_refused(tmp_path, data, f"{kind} f16 field ({where}) in {type_name} block 5")


def gguf_with_a_non_finite_d(source, out, type_name, bits):
    """The bytes of the GGUF `source` rewritten as `out` with blk.0.attn_k a random matrix of
    `type_name` whose block 5 has the f16 d `bits`."""
    raw = random_matrix(type_name, 128, 512, np.random.default_rng(8))
    size = gguf.GGML_QUANT_SIZES[qtype(type_name)][1]
    blocks_of = raw.reshape(-1, size)
    d = np.ones(len(blocks_of), dtype="<u2")
    d[5] = bits
    set_f16_fields(blocks_of, type_name, d.view("<f2"))
    return rewritten_gguf(source, out, {"blk.0.attn_k.weight": (type_name, raw)}).read_bytes()


def test_iq_grids_are_the_gguf_packages():
    """src/weights/iq_grids.inc is what scripts/gen_iq_grids.py makes of the gguf
    package's tables."""
    result = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "gen_iq_grids.py"),
                             "--check"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_llama_quantize_iq3_m_is_kept(tmp_path, checkpoint):
    """llama-quantize's IQ3_M file of the checkpoint (IQ3_S, Q4_K and Q6_K matrices; IQ3_XXS
    and the IQ2 and IQ1 types need an importance matrix, which llama-imatrix makes from
    text) keeps every matrix's type and blocks, and runs as the reference on them."""
    theirs = llama_quantize(checkpoint[1], tmp_path / "iq3_m.gguf", "IQ3_M")
    tensors = {tensor.name: tensor for tensor in gguf.GGUFReader(str(theirs)).tensors}
    kinds = {gguf_name: tensors[gguf_name].tensor_type.name
             for _, gguf_name, _ in matrices(IQ_CONFIG)}
    blocks = {gguf_name: (kind, np.asarray(tensors[gguf_name].data))
              for gguf_name, kind in kinds.items() if kind != "F32"}
    assert "IQ3_S" in {kind for kind, _ in blocks.values()}
    out, log = convert(theirs, tmp_path / "m.bin")
    assert log == "", log
    assert json.loads(metadata(out)["barellm.config"])["weight_dtype"] == "IQ3_M"
    types = json.loads(metadata(out)["barellm.matrix_types"])
    assert types == {name: kinds[gguf_name] for name, gguf_name, _ in matrices(IQ_CONFIG)}
    stored = read_raw(out)[2]
    for name, gguf_name, _ in matrices(IQ_CONFIG):
        if gguf_name in blocks:
            raw = blocks[gguf_name][1]
            if name.endswith((".wq", ".wk")):
                raw = rotate_half(raw, HEAD_DIM)
            assert np.array_equal(stored[name], raw), name
    want = reference_logits(checkpoint[0], blocks)
    got = logits(out, IDS, "--kv", "f32", "--simd", "scalar")
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-4



@pytest.fixture(scope="module")
def mix_file(checkpoint, tmp_path_factory):
    """mix_file(mix) -> the converted file of EMULATED_MIXES[mix] (random blocks of each
    matrix's type), made once per module."""
    made = {}

    def get(mix):
        if mix not in made:
            _, _, out, log = random_blocks_file(
                checkpoint[1], tmp_path_factory.mktemp(f"mix_{mix.lower()}"), mix,
                EMULATED_MIXES, np.random.default_rng(20 + IQ_TYPES.index(mix)))
            assert log == "", log
            types = json.loads(metadata(out)["barellm.matrix_types"])
            assert types == {name: matrix_type(mix, name, EMULATED_MIXES)
                             for name, _, _ in matrices(IQ_CONFIG)}
            made[mix] = str(out)
        return made[mix]

    return get


@pytest.mark.parametrize("mix", sorted(EMULATED_MIXES))
def test_iquants_on_the_cuda_backend(mix_file, mix, cuda_program):  # noqa: F811
    """The CUDA backend (on the CPU emulation of CUDA, and on the GPU where there is one) on a
    file of a type per matrix, the seven i-quants across the two mixes, held as
    tests/test_cuda.py holds the other block types: decode (the input rounded to int8 per
    256 columns) within QUANTIZED_TOLERANCE of the CPU's AVX2 path and within int8_limit of
    its scalar path (the dequantized weights exactly); prefill (each matrix dequantized to
    f16 for the GEMM) within QUANTIZED_PREFILL_SCALAR_TOLERANCE of the scalar path."""
    assert {matrix_type(other, name, EMULATED_MIXES) for other in EMULATED_MIXES
            for name, _, _ in matrices(IQ_CONFIG)} == set(IQ_TYPES)
    model = mix_file(mix)
    ids = gpu.token_ids(7, seed=7, vocab=IQ_CONFIG["vocab_size"])
    types = sorted(set(json.loads(metadata(model)["barellm.matrix_types"]).values()))
    gpu.compare_block_types_with_cpu(model, ids, f"{mix} mix ({', '.join(types)})",
                                     program=cuda_program)


def with_matrix_type(source, out, name, was, now):
    """A copy of the barellm file `source` whose barellm.matrix_types gives the matrix `name`
    (of type `was`) the type `now`; the header keeps its length (padded with spaces), so the
    data keeps its offsets."""
    data = open(source, "rb").read()
    length = int.from_bytes(data[:8], "little")
    entry = '\\"{}\\":\\"{}\\"'
    text = data[8:8 + length].rstrip(b" ")
    assert text.count(entry.format(name, was).encode()) == 1
    text = text.replace(entry.format(name, was).encode(), entry.format(name, now).encode())
    assert len(text) <= length
    out.write_bytes(data[:8] + text + b" " * (length - len(text)) + data[8 + length:])
    assert json.loads(metadata(out)["barellm.matrix_types"])[name] == now
    return out


@pytest.mark.parametrize("case", ["IQ1_M named IQ1_S", "IQ2_XXS named IQ1_M", "cut"])
def test_a_hostile_iq1_m_matrix_is_refused_in_one_line(tmp_path, mix_file, case):
    """The loader refuses, in one line and exit 1, a file whose matrix_types give an IQ1_M
    matrix (56 bytes a block) the type IQ1_S (50) or an IQ2_XXS matrix (66) the type IQ1_M,
    and a file cut inside its last tensor, the IQ1_M output matrix."""
    model = mix_file("IQ2_XXS")
    if case == "cut":
        data = open(model, "rb").read()
        header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
        last = max((entry["data_offsets"][1], name) for name, entry in header.items()
                   if name != "__metadata__")[1]
        assert last == "output" and matrix_type("IQ2_XXS", last, EMULATED_MIXES) == "IQ1_M"
        bad = tmp_path / "cut.bin"
        bad.write_bytes(data[:-100])
        message = "tensor 'output': data_offsets"
    elif case == "IQ1_M named IQ1_S":
        bad = with_matrix_type(model, tmp_path / "bad.bin", "layers.0.w1", "IQ1_M", "IQ1_S")
        message = "'layers.0.w1' has shape [768, 112], the config needs [768, 100]"
    else:
        bad = with_matrix_type(model, tmp_path / "bad.bin", "layers.0.wo", "IQ2_XXS", "IQ1_M")
        message = "'layers.0.wo' has shape [512, 132], the config needs [512, 112]"
    result = barellm("run", bad, "-p", "a", "-n", "1")
    assert_barellm_refused(result, message)
    assert case != "cut" or "(file truncated?)" in result.stderr

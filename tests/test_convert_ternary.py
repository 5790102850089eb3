"""ggml's ternary block types in the converter: GGUF matrices of TQ1_0 and TQ2_0 (TriLM's and
BitNet b1.58's weights) kept byte for byte beside K-quant ones; barellm's logits on such a file
(the scalar path, the SIMD kernels of this CPU and of AVX2, one token at a time and as one
prefill) those of the numpy reference forward pass (reference/model.py) on the weights that the
gguf package dequantizes; a non-finite d and hostile files refused in one line; the CUDA backend
(on the CPU emulation of CUDA, and on the GPU where there is one) against the CPU."""

import json

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="pip package gguf missing")

import test_cuda as gpu  # noqa: E402
from test_cuda import cuda_program  # noqa: E402,F401
from test_cli import assert_refused as assert_barellm_refused, barellm  # noqa: E402
from test_convert_iquants import (IDS, IQ_CONFIG, assert_blocks_kept,  # noqa: E402,F401
                                  checkpoint, gguf_with_a_non_finite_d, matrices,
                                  matrix_type as iq_matrix_type, qtype, random_blocks_file,
                                  reference_logits, with_matrix_type)
from test_convert_kquants import assert_logits_match, assert_refused, metadata  # noqa: E402

TQ_TYPES = ("TQ1_0", "TQ2_0")
# The matrices of the file of each ternary type that are not of that type (a barellm name, or a
# layer suffix for every layer); F32 keeps the source's values. Each file holds both ternary
# types, one of them in its token embedding.
COMPANIONS = {
    "TQ1_0": {"wv": "Q4_K", "layers.1.w2": "TQ2_0", "output": "Q6_K"},
    "TQ2_0": {"wk": "TQ1_0", "w2": "Q2_K", "layers.0.w3": "Q4_K", "output": "TQ1_0"},
}


def matrix_type(type_name, name):
    """The type of the matrix `name` in the file of the ternary type `type_name`."""
    return iq_matrix_type(type_name, name, COMPANIONS)


@pytest.fixture(scope="module", params=TQ_TYPES)
def tq_file(request, checkpoint, tmp_path_factory):  # noqa: F811
    """The file of one ternary type: (its type, {GGUF name: (type, blocks)} of the matrices of
    random blocks, the converted file, the converter's stderr)."""
    type_name = request.param
    replaced, _, out, log = random_blocks_file(
        checkpoint[1], tmp_path_factory.mktemp(type_name.lower()), type_name, COMPANIONS,
        np.random.default_rng(40 + TQ_TYPES.index(type_name)))
    return type_name, replaced, out, log


def test_ternary_blocks_are_kept_byte_for_byte(tq_file):
    """Every matrix keeps its GGUF type, named in barellm.matrix_types, and its blocks (q and
    k rows moved whole into rotate-half order); the file is named after the GGUF's file type
    and nothing is dequantized."""
    type_name, replaced, out, log = tq_file
    assert log == "", log
    types = assert_blocks_kept(out, type_name, replaced, {
        name: matrix_type(type_name, name) for name, _, _ in matrices(IQ_CONFIG)})
    assert set(TQ_TYPES) <= set(types.values())


def test_ternary_logits_are_the_references(tq_file, checkpoint):  # noqa: F811
    """barellm's logits (the scalar CPU; this CPU's SIMD level and AVX2's, one token at a time
    and as one prefill) are those of reference/model.py on the checkpoint's norms and F32
    matrices and the others' blocks dequantized by the gguf package."""
    type_name, replaced, out, _ = tq_file
    assert_logits_match(out, IDS, reference_logits(checkpoint[0], replaced), type_name)


@pytest.mark.parametrize("type_name,bits,kind,where", [
    ("TQ1_0", 0x7E00, "NaN", "byte 52"),
    ("TQ2_0", 0xFC00, "Inf", "byte 64")])
def test_a_non_finite_ternary_d_is_refused(tmp_path, checkpoint, type_name, bits, kind,  # noqa: F811
                                           where):
    """Block 5's d is NaN or Inf: the converter refuses the file in one line."""
    data = gguf_with_a_non_finite_d(checkpoint[1], tmp_path / "q.gguf", type_name, bits)
    assert_refused(tmp_path, data, f"{kind} f16 field ({where}) in {type_name} block 5")


def row_bytes(type_name, cols):
    weights, size = gguf.GGML_QUANT_SIZES[qtype(type_name)]
    return cols // weights * size


@pytest.mark.parametrize("case", ["TQ1_0 named TQ2_0", "TQ2_0 named TQ1_0", "cut"])
def test_a_hostile_ternary_file_is_refused_in_one_line(tmp_path, tq_file, case):
    """The loader refuses, in one line and exit 1, a file whose matrix_types give a TQ1_0
    matrix (54 bytes a block) the type TQ2_0 (66) or the reverse, and a file cut inside its
    last tensor, the output matrix."""
    type_name, _, model, _ = tq_file
    if case == "cut":
        data = open(model, "rb").read()
        header = json.loads(data[8:8 + int.from_bytes(data[:8], "little")])
        last = max((entry["data_offsets"][1], name) for name, entry in header.items()
                   if name != "__metadata__")[1]
        assert last == "output"
        bad = tmp_path / "cut.bin"
        bad.write_bytes(data[:-100])
        result = barellm("run", bad, "-p", "a", "-n", "1")
        assert_barellm_refused(result, "tensor 'output': data_offsets")
        assert "(file truncated?)" in result.stderr
        return
    was, now = case.split(" named ")
    name = next(name for name, _, _ in matrices(IQ_CONFIG)
                if name.startswith("layers.") and matrix_type(type_name, name) == was)
    rows, cols = next(shape for other, _, shape in matrices(IQ_CONFIG) if other == name)
    bad = with_matrix_type(model, tmp_path / "bad.bin", name, was, now)
    result = barellm("run", bad, "-p", "a", "-n", "1")
    assert_barellm_refused(result, f"'{name}' has shape [{rows}, {row_bytes(was, cols)}], "
                           f"the config needs [{rows}, {row_bytes(now, cols)}]")


def test_ternary_types_on_the_cuda_backend(tq_file, cuda_program):  # noqa: F811
    """The CUDA backend (on the CPU emulation of CUDA, and on the GPU where there is one) on
    each file, both ternary types in each, held as tests/test_cuda.py holds the other block
    types: decode (the input rounded to int8 per 256 columns) within QUANTIZED_TOLERANCE of
    the CPU's AVX2 path and within int8_limit of its scalar path (the dequantized weights
    exactly); prefill (each matrix dequantized to f16 for the GEMM) within
    QUANTIZED_PREFILL_SCALAR_TOLERANCE of the scalar path."""
    type_name, _, model, _ = tq_file
    ids = gpu.token_ids(7, seed=7, vocab=IQ_CONFIG["vocab_size"])
    types = sorted(set(json.loads(metadata(model)["barellm.matrix_types"]).values()))
    gpu.compare_block_types_with_cpu(model, ids, f"{type_name} file ({', '.join(types)})",
                                     program=cuda_program)

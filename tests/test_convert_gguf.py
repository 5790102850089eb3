"""convert/convert.py on GGUF files written by scripts/gguf_from_hf.py from Hugging Face
checkpoints: the barellm file of the GGUF must give the logits of the barellm file of the
checkpoint itself (build/dump_logits), and its tokenizer the ids of the Hugging Face
tokenizer (pip `tokenizers`). Types the gguf package only decodes (K-quants, IQ) are
checked on random blocks against its own dequantization."""

import collections
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from convert_testlib import (BUILD, CONVERT, LLAMA2_TOKENIZER, REPO, SMOLLM2_TOKENIZER,
                             STORIES, TINY_CONFIG, make_checkpoint, need_shared, read_raw, run,
                             tiny_tensors)
from test_convert_gguf_hostile import TinyGGUF
from test_qwen import CONFIGS, checkpoint as qwen_checkpoint, qwen_tensors

gguf = pytest.importorskip("gguf", reason="pip package gguf missing")
tokenizers = pytest.importorskip("tokenizers", reason="pip package tokenizers missing")

GGUF_FROM_HF = os.path.join(REPO, "scripts", "gguf_from_hf.py")
BARELLM = os.path.join(BUILD, "barellm")
DUMP_LOGITS = os.path.join(BUILD, "dump_logits")
STORY = ("Once upon a time, there was a little girl named Lily. She loved to play "
         "outside in the park with her dog, and one day they found a big red ball.")
# Quantized types the gguf package writes, and how far their logits may be from f32's:
# the relative error of the logits over STORY (measured on stories260K: q8_0 0.6%,
# q5_1 4.8%, q5_0 5.5%, q4_1 9.4%, q4_0 13.3%), with a margin.
QUANTIZED_TOLERANCE = {"q8_0": 0.01, "q5_1": 0.07, "q5_0": 0.08, "q4_1": 0.14, "q4_0": 0.2}
TEXTS = [
    "Once upon a time, there was a little girl named Lily.",
    "Emoji 😀🎉👩‍👩‍👧 and flags 🇫🇷, accents: déjà vu, Ünïcödé ﬁ",
    "CJK 日本語のテキスト、中文文本，한국어 텍스트",
    "def f(x):\n\treturn {'a': [1, 2, 3]}  # comment\n\n\n    if x != 0:  pass",
    "whitespace   runs\t\t\tand\n\n\nnewlines \r\n end   ",
    "numbers 1234567 3.14159 1e-10 and $99.99, 'quotes' don't I'll",
    "   leading spaces",
    "",
]


def story_ids():
    """BOS, then STORY with the stories260K tokenizer."""
    reference = tokenizers.Tokenizer.from_file(os.path.join(STORIES, "tokenizer.json"))
    return [1] + reference.encode(STORY, add_special_tokens=False).ids


def need_tools():
    for tool in (BARELLM, DUMP_LOGITS):
        if not os.path.exists(tool):
            pytest.fail(f"{tool} is missing: run `make` first")


def gguf_from_hf(hf, out, *options):
    result = run(GGUF_FROM_HF, hf, "-o", out, *options)
    assert result.returncode == 0, result.stderr
    return out


def convert(source, out, *options):
    """Convert `source`; return (output path, stderr)."""
    result = run(CONVERT, source, "-o", out, *options)
    assert result.returncode == 0, result.stderr
    return out, result.stderr


def logits(model, ids):
    out = str(model) + ".logits"
    subprocess.run([DUMP_LOGITS, str(model), out, *map(str, ids)], check=True)
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def metadata(path):
    return read_raw(path)[1]["__metadata__"]


def config_of(path):
    return json.loads(metadata(path)["barellm.config"])


def barellm_ids(model, text, tmp_path):
    text_file = tmp_path / "text.txt"
    text_file.write_bytes(text.encode("utf-8"))
    result = subprocess.run([BARELLM, "tokenize", str(model), "-f", str(text_file)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# ---------------------------------------------------------------------------- round trip

@pytest.mark.parametrize("gguf_type,dtype", [("f32", "f32"), ("f16", "f16"), ("bf16", "bf16")])
def test_float_types_give_the_checkpoints_file(tmp_path, gguf_type, dtype):
    """F32, F16 and BF16 are kept: the same tensors, config and logits as converting the
    checkpoint directly (q and k rows put back in rotate-half order)."""
    need_shared(STORIES)
    need_tools()
    source = gguf_from_hf(STORIES, tmp_path / "s.gguf", "--type", gguf_type)
    from_gguf, log = convert(source, tmp_path / "gguf.bin")
    direct, _ = convert(STORIES, tmp_path / "hf.bin", "--dtype", dtype)
    assert "stored as" not in log
    assert config_of(from_gguf) == config_of(direct)
    a, b = read_raw(from_gguf)[2], read_raw(direct)[2]
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    assert np.array_equal(logits(from_gguf, story_ids()), logits(direct, story_ids()))


def rotate_half_rows(interleaved, head_dim):
    """Rows of llama.cpp's interleaved q/k layout in Hugging Face's rotate-half order:
    within each head, row t * head_dim/2 + i comes from row 2i + t."""
    out = np.empty_like(interleaved)
    half = head_dim // 2
    for head in range(interleaved.shape[0] // head_dim):
        for t in range(2):
            for i in range(half):
                out[head * head_dim + t * half + i] = interleaved[head * head_dim + 2 * i + t]
    return out


def gguf_q8_0_blocks(path, name):
    """(int8 values, f16 scales) of a Q8_0 tensor, read with the gguf package."""
    tensor = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    blocks = np.asarray(tensor.data).reshape(tensor.data.shape[0], -1, 34)
    scales = blocks[:, :, :2].copy().view("<f2")[:, :, 0]
    values = blocks[:, :, 2:].copy().view(np.int8).reshape(tensor.data.shape[0], -1)
    return values, scales


def matrix_types_of(path):
    return json.loads(metadata(path)["barellm.matrix_types"])


def test_q8_0_is_copied_bit_for_bit(tmp_path):
    """Q8_0 blocks become barellm's Q8 values and scales unchanged (q rows in rotate-half
    order); the F16 matrices (rows of 172, not whole blocks) stay F16: a file of per-matrix
    types named after the GGUF's file type, with nothing dequantized."""
    need_shared(STORIES)
    need_tools()
    source = gguf_from_hf(STORIES, tmp_path / "s.gguf", "--type", "q8_0")
    out, log = convert(source, tmp_path / "q8.bin")
    assert config_of(out)["weight_dtype"] == "Q8_0"
    types = matrix_types_of(out)
    assert {name: kind for name, kind in types.items() if kind != "Q8_0"} == {
        f"layers.{layer}.w2": "F16" for layer in range(5)}
    assert "dequantized" not in log and "stored as" not in log, log
    tensors = read_raw(out)[2]
    values, scales = gguf_q8_0_blocks(source, "blk.2.attn_v.weight")
    assert np.array_equal(tensors["layers.2.wv"], values)
    assert np.array_equal(tensors["layers.2.wv.scale"].view("<u2"), scales.view("<u2"))
    values, scales = gguf_q8_0_blocks(source, "blk.1.attn_q.weight")
    assert np.array_equal(tensors["layers.1.wq"], rotate_half_rows(values, 8))
    assert np.array_equal(tensors["layers.1.wq.scale"].view("<u2"),
                          rotate_half_rows(scales, 8).view("<u2"))
    assert tensors["layers.0.w2"].dtype == np.float16


def test_q8_0_with_dtype_q8_is_a_uniform_file(tmp_path):
    """--dtype q8 asks for one type: the F16 matrices are quantized by barellm's rule, and
    the stderr line names them."""
    need_shared(STORIES)
    need_tools()
    source = gguf_from_hf(STORIES, tmp_path / "s.gguf", "--type", "q8_0")
    out, log = convert(source, tmp_path / "q8.bin", "--dtype", "q8")
    assert config_of(out)["weight_dtype"] == "Q8"
    assert "barellm.matrix_types" not in metadata(out)
    assert log.count("\n") == 1 and "5 tensors stored as Q8" in log and "5 F16" in log


def test_q4_0_is_copied_bit_for_bit(tmp_path):
    """Q4_0 blocks become barellm's Q4 values and scales unchanged (the same nibble order;
    q rows in rotate-half order); the F16 matrices (rows of 172, not whole blocks) stay
    F16 under Q4, so no line names a changed type; the logits are those of the GGUF's own
    values dequantized to f32."""
    need_shared(STORIES)
    need_tools()
    source = gguf_from_hf(STORIES, tmp_path / "s.gguf", "--type", "q4_0")
    out, log = convert(source, tmp_path / "q4.bin")
    assert config_of(out)["weight_dtype"] == "Q4"
    assert "changed" not in log and "stored as" not in log, log
    tensors = read_raw(out)[2]
    for gguf_name, name, rotated in [("blk.2.attn_v.weight", "layers.2.wv", False),
                                     ("blk.1.attn_q.weight", "layers.1.wq", True)]:
        tensor = next(t for t in gguf.GGUFReader(str(source)).tensors if t.name == gguf_name)
        blocks = np.asarray(tensor.data).reshape(tensor.data.shape[0], -1, 18)
        scales = blocks[:, :, :2].copy().view("<f2")[:, :, 0]
        packed = blocks[:, :, 2:].copy().reshape(tensor.data.shape[0], -1)
        if rotated:
            packed, scales = rotate_half_rows(packed, 8), rotate_half_rows(scales, 8)
        assert np.array_equal(tensors[name], packed), name
        assert np.array_equal(tensors[name + ".scale"].view("<u2"), scales.view("<u2")), name
    assert tensors["layers.0.w2"].dtype == np.float16
    f32, _ = convert(source, tmp_path / "f32.bin", "--dtype", "f32")
    exact, got = logits(f32, story_ids()), logits(out, story_ids())
    # The same weights; only barellm's 8-bit activations for the integer dot products differ.
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 2e-2


def test_q8_0_against_the_checkpoints_q8(tmp_path):
    """llama.cpp's Q8_0 and barellm's Q8 pick the same f16 scale (max |w| / 127), but
    llama.cpp rounds w * (1 / d) with the unrounded d and barellm w / d with d rounded
    to f16: values may differ by one step in a few elements."""
    need_shared(STORIES)
    need_tools()
    source = gguf_from_hf(STORIES, tmp_path / "s.gguf", "--type", "q8_0")
    from_gguf, _ = convert(source, tmp_path / "gguf.bin", "--dtype", "q8")
    direct, _ = convert(STORIES, tmp_path / "hf.bin", "--dtype", "q8")
    a, b = read_raw(from_gguf)[2], read_raw(direct)[2]
    differing = total = 0
    for name in a:
        if name.endswith(".scale") and ".w2" not in name:
            assert np.array_equal(a[name].view("<u2"), b[name].view("<u2")), name
        elif a[name].dtype == np.int8 and ".w2" not in name:
            step = np.abs(a[name].astype(int) - b[name].astype(int))
            assert step.max() <= 1, name
            differing += int(np.count_nonzero(step))
            total += step.size
    print(f"Q8_0 vs barellm q8: {differing} of {total} values one step apart")
    assert differing <= total // 100
    f32, _ = convert(STORIES, tmp_path / "f32.bin", "--dtype", "f32")
    exact = logits(f32, story_ids())
    errors = [np.linalg.norm(logits(path, story_ids()) - exact) / np.linalg.norm(exact)
              for path in (from_gguf, direct)]
    print(f"logits vs f32: relative error {errors[0]:.2e} from Q8_0, {errors[1]:.2e} from "
          "barellm's q8")
    assert errors[0] < 1.25 * errors[1]


@pytest.mark.parametrize("gguf_type", sorted(QUANTIZED_TOLERANCE))
def test_quantized_types_close_to_f32(tmp_path, gguf_type):
    """Every quantized type the gguf package writes converts (to f32 here: exactly the
    values the gguf package dequantizes) and gives logits close to those of the f32
    checkpoint."""
    need_shared(STORIES)
    need_tools()
    source = gguf_from_hf(STORIES, tmp_path / "s.gguf", "--type", gguf_type)
    out, _ = convert(source, tmp_path / "q.bin", "--dtype", "f32")
    tensors = read_raw(out)[2]
    reader = gguf.GGUFReader(str(source))
    for tensor in reader.tensors:
        if tensor.name == "blk.3.attn_k.weight":
            values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
            assert np.array_equal(tensors["layers.3.wk"], rotate_half_rows(values, 8))
        if tensor.name == "blk.0.ffn_up.weight":
            values = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
            assert np.array_equal(tensors["layers.0.w3"], values)
    direct, _ = convert(STORIES, tmp_path / "hf.bin", "--dtype", "f32")
    exact = logits(direct, story_ids())
    got = logits(out, story_ids())
    relative = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    same = np.mean(got.argmax(axis=1) == exact.argmax(axis=1))
    print(f"{gguf_type} vs f32 logits: relative error {relative:.2e}, same argmax {same:.0%}")
    assert relative < QUANTIZED_TOLERANCE[gguf_type]


def test_q4_1_is_kept_by_default(tmp_path):
    """Q4_1 is a block type barellm runs: its tensors are copied byte for byte (q rows in
    rotate-half order), the file named after the GGUF's file type, nothing dequantized."""
    need_shared(STORIES)
    need_tools()
    source = gguf_from_hf(STORIES, tmp_path / "s.gguf", "--type", "q4_1")
    out, log = convert(source, tmp_path / "q.bin")
    assert config_of(out)["weight_dtype"] == "Q4_1"
    assert matrix_types_of(out)["layers.1.wq"] == "Q4_1"
    assert matrix_types_of(out)["layers.1.w2"] == "F16"
    assert "dequantized" not in log
    reader = gguf.GGUFReader(str(source))
    stored = {t.name: np.asarray(t.data) for t in reader.tensors}
    tensors = read_raw(out)[2]
    assert np.array_equal(tensors["layers.1.wv"], stored["blk.1.attn_v.weight"])
    assert np.array_equal(tensors["layers.1.wq"],
                          rotate_half_rows(stored["blk.1.attn_q.weight"], 8))


def test_llama3_rope_freqs_become_the_rope_scaling(tmp_path):
    """gguf_from_hf writes Llama 3 scaling as rope_freqs: it comes back as the same
    rope_scaling, and the same logits."""
    need_tools()
    config = {**TINY_CONFIG, "hidden_size": 32, "rope_theta": 500000.0,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192}}
    hf = make_checkpoint(tmp_path / "hf", config=config)
    source = gguf_from_hf(hf, tmp_path / "m.gguf")
    from_gguf, _ = convert(source, tmp_path / "gguf.bin")
    direct, _ = convert(hf, tmp_path / "hf.bin")
    assert config_of(from_gguf)["rope_scaling"] == config["rope_scaling"]
    ids = [1, 5, 9, 30, 31, 7, 2, 17]
    assert np.array_equal(logits(from_gguf, ids), logits(direct, ids))


def test_separate_output_and_no_tied_embeddings(tmp_path):
    need_tools()
    hf = make_checkpoint(tmp_path / "hf")
    from_gguf, _ = convert(gguf_from_hf(hf, tmp_path / "m.gguf"), tmp_path / "gguf.bin")
    direct, _ = convert(hf, tmp_path / "hf.bin")
    assert config_of(from_gguf)["tied_embeddings"] is False
    assert np.array_equal(read_raw(from_gguf)[2]["output"], read_raw(direct)[2]["output"])


# Qwen2 (q/k/v biases) and Qwen3 (per-head q/k norms, head_dim * heads != dim): test_qwen's
# tiny checkpoints.
QWEN_LAYER_0 = {
    "qwen2": {"blk.0.attn_q.bias": "self_attn.q_proj.bias",
              "blk.0.attn_k.bias": "self_attn.k_proj.bias",
              "blk.0.attn_v.bias": "self_attn.v_proj.bias"},
    "qwen3": {"blk.0.attn_q_norm.weight": "self_attn.q_norm.weight",
              "blk.0.attn_k_norm.weight": "self_attn.k_norm.weight"},
}


@pytest.mark.parametrize("name", sorted(QWEN_LAYER_0))
@pytest.mark.parametrize("gguf_type,dtype", [("f32", "f32"), ("f16", "f16")])
def test_qwen_round_trip(tmp_path, name, gguf_type, dtype):
    """A Qwen checkpoint written as llama.cpp's qwen2/qwen3 (biases and q/k norms under
    llama.cpp's names, q and k rows in Hugging Face's order: its Qwen RoPE rotates half)
    converts back to the checkpoint's own file: config, tensors and logits."""
    need_tools()
    hf = qwen_checkpoint(tmp_path, name)
    source = gguf_from_hf(hf, tmp_path / "m.gguf", "--type", gguf_type)
    reader = gguf.GGUFReader(str(source))
    assert reader.fields["general.architecture"].contents() == name
    stored = {t.name: np.asarray(t.data) for t in reader.tensors}
    hf_tensors = qwen_tensors(CONFIGS[name])
    for gguf_name, hf_name in {**QWEN_LAYER_0[name],
                               "blk.0.attn_q.weight": "self_attn.q_proj.weight",
                               "blk.0.attn_k.weight": "self_attn.k_proj.weight"}.items():
        want = hf_tensors[f"model.layers.0.{hf_name}"][1]
        assert np.array_equal(stored[gguf_name], want.astype(stored[gguf_name].dtype)), gguf_name
    from_gguf, log = convert(source, tmp_path / "gguf.bin")
    direct, _ = convert(hf, tmp_path / "hf.bin", "--dtype", dtype)
    assert "stored as" not in log
    assert config_of(from_gguf) == config_of(direct)
    a, b = read_raw(from_gguf)[2], read_raw(direct)[2]
    assert sorted(a) == sorted(b)
    for tensor in a:
        assert np.array_equal(a[tensor], b[tensor]), tensor
    ids = [1, 5, 9, 300, 31, 7, 2, 17, 511]
    assert np.array_equal(logits(from_gguf, ids), logits(direct, ids))


def gguf_without(source, out, dropped):
    """A copy of the GGUF file `source` without the tensors named in `dropped`."""
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(out), reader.fields["general.architecture"].contents())
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        kind = field.types[0]
        writer.add_key_value(field.name, field.contents(), kind,
                             field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
    for tensor in reader.tensors:
        if tensor.name not in dropped:
            writer.add_tensor(tensor.name, np.asarray(tensor.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def test_qwen_without_its_tensors(tmp_path):
    """qwen3's q/k norms are not optional; qwen2's biases are (llama.cpp loads them
    where present), and without them the config has no qkv_bias."""
    need_tools()
    source = gguf_from_hf(qwen_checkpoint(tmp_path, "qwen3"), tmp_path / "m.gguf")
    cut = gguf_without(source, tmp_path / "cut.gguf", {"blk.1.attn_k_norm.weight"})
    result = run(CONVERT, cut, "-o", tmp_path / "cut.bin")
    assert result.returncode != 0 and "missing tensors: blk.1.attn_k_norm.weight" in result.stderr
    source = gguf_from_hf(qwen_checkpoint(tmp_path, "qwen2"), tmp_path / "q2.gguf")
    biases = {f"blk.{layer}.attn_{part}.bias"
              for layer in range(CONFIGS["qwen2"]["num_hidden_layers"]) for part in "qkv"}
    no_bias = gguf_without(source, tmp_path / "nobias.gguf", biases)
    out, _ = convert(no_bias, tmp_path / "nobias.bin")
    assert "qkv_bias" not in config_of(out)
    assert not any(".bq" in tensor for tensor in read_raw(out)[2])


def test_qwen3_output_bias_cannot_be_written(tmp_path):
    result = run(GGUF_FROM_HF, qwen_checkpoint(tmp_path, "qwen3-attention-bias"), "-o",
                 tmp_path / "m.gguf")
    assert result.returncode == 1
    assert "o_bias: a GGUF file of architecture qwen3 holds no such tensors" in result.stderr


# ----------------------------------------------------------------------------- tokenizers

def assert_same_ids(model, reference, tmp_path, texts=TEXTS):
    for text in texts:
        expected = reference.encode(text, add_special_tokens=False).ids
        assert barellm_ids(model, text, tmp_path) == expected, text


def test_sentencepiece_tokenizer_of_stories260k(tmp_path):
    need_shared(STORIES)
    need_tools()
    out, _ = convert(gguf_from_hf(STORIES, tmp_path / "s.gguf"), tmp_path / "s.bin")
    assert json.loads(metadata(out)["barellm.config"])["add_bos"] is True
    reference = tokenizers.Tokenizer.from_file(os.path.join(STORIES, "tokenizer.json"))
    assert_same_ids(out, reference, tmp_path)


def test_sentencepiece_tokenizer_of_llama2(tmp_path):
    """Llama 2's 32000 pieces (from its tokenizer.model) on a tiny model."""
    need_shared(LLAMA2_TOKENIZER)
    need_tools()
    config = {**TINY_CONFIG, "vocab_size": 32000}
    hf = make_checkpoint(tmp_path / "hf", config=config)
    os.remove(hf / "tokenizer.json")
    shutil.copy(os.path.join(LLAMA2_TOKENIZER, "tokenizer.model"), hf / "tokenizer.model")
    direct, _ = convert(hf, tmp_path / "hf.bin")
    out, _ = convert(gguf_from_hf(hf, tmp_path / "m.gguf"), tmp_path / "gguf.bin")
    reference = tokenizers.Tokenizer.from_str(metadata(direct)["barellm.tokenizer"])
    assert_same_ids(out, reference, tmp_path)


def smollm2_checkpoint(path, tokenizer):
    """A tiny model with the SmolLM2 vocabulary and `tokenizer` (a tokenizer.json dict)."""
    config = {**TINY_CONFIG, "vocab_size": 49152, "bos_token_id": 1, "eos_token_id": 2,
              "tie_word_embeddings": True}
    return make_checkpoint(path, config=config, tensors=tiny_tensors(config),
                           tokenizer=tokenizer)


def smollm2_variant(pre_tokenizer, normalizer=None, ignore_merges=False):
    with open(os.path.join(SMOLLM2_TOKENIZER, "tokenizer.json"), encoding="utf-8") as f:
        tokenizer = json.load(f)
    if pre_tokenizer is not None:
        tokenizer["pre_tokenizer"] = pre_tokenizer
        tokenizer["normalizer"] = normalizer
    tokenizer["model"]["ignore_merges"] = ignore_merges
    return tokenizer


def byte_level(use_regex, trim_offsets=True):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": trim_offsets,
            "use_regex": use_regex}


def split_then_byte_level(regex, trim_offsets=True):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        byte_level(False, trim_offsets)]}


LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
# GPT-4o's (Phi-4-mini's), as its tokenizer.json gives it.
GPT4O_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
               r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
               r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# tokenizer.ggml.pre -> the Hugging Face tokenizer of that family, on SmolLM2's vocabulary.
BYTE_LEVEL_FAMILIES = {
    "smollm": lambda: smollm2_variant(None),
    "gpt-2": lambda: smollm2_variant(byte_level(True)),
    "llama-bpe": lambda: smollm2_variant(split_then_byte_level(LLAMA3_REGEX),
                                         ignore_merges=True),
    "qwen2": lambda: smollm2_variant(split_then_byte_level(QWEN2_REGEX, False),
                                     normalizer={"type": "NFC"}),
    "gpt-4o": lambda: smollm2_variant(split_then_byte_level(GPT4O_REGEX)),
}


@pytest.mark.parametrize("pre", sorted(BYTE_LEVEL_FAMILIES))
def test_byte_level_bpe_tokenizers(tmp_path, pre):
    need_shared(SMOLLM2_TOKENIZER)
    need_tools()
    tokenizer = BYTE_LEVEL_FAMILIES[pre]()
    hf = smollm2_checkpoint(tmp_path / "hf", tokenizer)
    source = gguf_from_hf(hf, tmp_path / "m.gguf")
    pre_key = gguf.GGUFReader(str(source)).fields["tokenizer.ggml.pre"]
    assert pre_key.contents() == pre
    out, _ = convert(source, tmp_path / "gguf.bin")
    reference = tokenizers.Tokenizer.from_str(json.dumps(tokenizer))
    texts = TEXTS + ["<|im_start|>user\nHi there<|im_end|>\n", "naïve café ǅ Å Å 12345"]
    assert_same_ids(out, reference, tmp_path, texts)
    config = config_of(out)
    assert (config["bos_id"], config["eos_ids"], config["add_bos"]) == (1, [2], False)


def test_chat_template_is_kept(tmp_path):
    need_shared(SMOLLM2_TOKENIZER)
    need_tools()
    hf = smollm2_checkpoint(tmp_path / "hf", smollm2_variant(None))
    template = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                "{{ message['content'] }}<|im_end|>\n{% endfor %}")
    with open(hf / "tokenizer_config.json", "w") as f:
        json.dump({"chat_template": template}, f)
    out, _ = convert(gguf_from_hf(hf, tmp_path / "m.gguf"), tmp_path / "m.bin")
    assert metadata(out)["barellm.chat_template"] == template


# Types the gguf package decodes but cannot write: the byte offsets of the f16 scales in
# each block (set to small values here; the other bytes are random). NVFP4's are the bytes of
# its four UE4M3 scales, finite whatever they hold.
DECODE_ONLY_SCALES = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
                      "Q6_K": (208,), "IQ4_NL": (0,), "IQ4_XS": (0,), "IQ3_S": (0,),
                      "TQ1_0": (52,), "TQ2_0": (64,), "NVFP4": (0, 2)}


# The decode-only types barellm runs, and those it dequantizes.
KEPT_DECODE_ONLY = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL", "IQ3_S", "TQ1_0",
                    "TQ2_0"}


@pytest.mark.parametrize("type_name", sorted(DECODE_ONLY_SCALES))
def test_decode_only_types_become_the_asked_dtype(tmp_path, type_name):
    """A K-quant or IQ matrix of random blocks (rows of 256) converts to f32 exactly as
    the gguf package dequantizes it; by default a type barellm runs is kept byte for byte
    (a file of per-matrix types, `mixed` without a file type), and one it does not run
    becomes F16, named in one line."""
    need_tools()
    qtype = gguf.GGMLQuantizationType[type_name]
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    model = TinyGGUF(hidden=256)
    dims = model.tensors["blk.0.ffn_down.weight"][0]
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, (dims[1], dims[0] // block, block_bytes), dtype=np.uint8)
    scales = (rng.uniform(0.001, 0.01, blocks.shape[:2] + (1,))).astype("<f2").view(np.uint8)
    for offset in DECODE_ONLY_SCALES[type_name]:
        blocks[:, :, offset:offset + 2] = scales
    model.tensors["blk.0.ffn_down.weight"] = [dims, int(qtype), blocks.tobytes(), None]
    source = tmp_path / "m.gguf"
    source.write_bytes(bytes(model))
    out, _ = convert(source, tmp_path / "f32.bin", "--dtype", "f32")
    expected = gguf.quants.dequantize(blocks.reshape(dims[1], -1), qtype)
    assert np.isfinite(expected).all()
    assert np.array_equal(read_raw(out)[2]["layers.0.w2"], expected)
    out, log = convert(source, tmp_path / "own.bin")
    assert config_of(out)["weight_dtype"] == "mixed"
    types = matrix_types_of(out)
    stored = read_raw(out)[2]["layers.0.w2"]
    assert {kind for name, kind in types.items() if name != "layers.0.w2"} == {"F32"}
    if type_name in KEPT_DECODE_ONLY:
        assert types["layers.0.w2"] == type_name and "dequantized" not in log
        assert np.array_equal(stored, blocks.reshape(dims[1], -1))
    else:
        assert types["layers.0.w2"] == "F16"
        assert np.array_equal(stored, expected.astype(np.float16))
        assert log.count("\n") == 1 and log.startswith("convert: dequantized to F16")
        assert f"1 {type_name} (blk.0.ffn_down.weight)" in log


def test_a_gguf_file_is_uniform_only_when_one_weight_dtype_keeps_every_matrix():
    """llama-quantize keeps a Q4_0 file's output matrix in Q6_K or Q8_0: such a file has
    per-matrix types. F16 matrices beside Q4_0 ones whose columns are not whole blocks
    are what a Q4 file stores anyway."""
    sys.path.insert(0, os.path.join(REPO, "convert"))
    import gguf_in
    source = collections.namedtuple("Source", "dtype shape")
    layers = [("blk", source("Q4_0", (4096, 64)), False), ("norm", source("F32", (64,)), True),
              ("ffn_down", source("F16", (64, 172)), False)]
    assert gguf_in.uniform_weight_dtype(layers) == "Q4"
    for finer in ("Q6_K", "Q8_0", "F16"):
        plan = layers + [("output", source(finer, (512, 64)), False)]
        assert gguf_in.uniform_weight_dtype(plan) is None, finer
    assert gguf_in.uniform_weight_dtype([("w", source("Q8_0", (64, 64)), False)]) == "Q8"
    assert gguf_in.uniform_weight_dtype([("w", source("Q8_0", (64, 64)), False),
                                         ("w2", source("F16", (64, 172)), False)]) is None
    assert gguf_in.uniform_weight_dtype([("w", source("BF16", (64, 64)), False)]) == "BF16"

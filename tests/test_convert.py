"""Tests of convert/convert.py: round trips, layout, sharded input and every refusal."""

import json
import os
import shutil
import sys

import numpy as np
import pytest

import model as reference
from convert_testlib import (CONVERT, LLAMA2_TOKENIZER, STORIES, SYNTH, TINY_CONFIG,
                             assert_wrong_command_line, make_checkpoint, need_shared, read_raw,
                             run, tiny_tensors, tiny_tokenizer_json)

sys.path.insert(0, os.path.join(os.path.dirname(CONVERT)))
import dtypes  # noqa: E402  (convert/dtypes.py)

LAYER_NAMES = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w1", "w3", "w2")
NORM_NAMES = ("attn_norm", "ffn_norm")


def model_names(layers, tied):
    """barellm tensor names in model order."""
    names = ["token_embedding"]
    names += [f"layers.{l}.{n}" for l in range(layers) for n in LAYER_NAMES]
    names.append("final_norm")
    return names if tied else names + ["output"]


def is_norm_name(name):
    """Whether barellm tensor `name` is a norm (always F32)."""
    return name.split(".")[-1] in NORM_NAMES or name == "final_norm"


def expected_names(layers, tied, weight_dtype="F32"):
    """barellm tensor names in file order (docs/FORMAT.md): F32 tensors, then F16/BF16
    tensors (Q8 scales), then I8 tensors, each in model order."""
    names = model_names(layers, tied)
    if weight_dtype == "F32":
        return names
    norms = [n for n in names if is_norm_name(n)]
    matrices = [n for n in names if not is_norm_name(n)]
    if weight_dtype == "Q8":
        return norms + [n + ".scale" for n in matrices] + matrices
    return norms + matrices


def hf_name(name):
    """The Hugging Face name a barellm tensor comes from."""
    fixed = {"token_embedding": "model.embed_tokens.weight", "final_norm": "model.norm.weight",
             "output": "lm_head.weight"}
    if name in fixed:
        return fixed[name]
    _, layer, short = name.split(".")
    names = {**reference.HF_LAYER_NAMES, **reference.HF_OPTIONAL_LAYER_NAMES}
    return f"model.layers.{layer}.{names[short]}"


def bf16_nearest_even(values):
    """Round float32 to BF16 bits by comparing both neighbours (independent of convert/).

    The upper neighbour is computed in float64, so rounding past the largest finite
    BF16 correctly gives Inf."""
    values = np.asarray(values, dtype=np.float32)
    low = values.view(np.uint32) & np.uint32(0xFFFF0000)
    high = low + np.uint32(0x10000)
    low_f = low.view(np.float32).astype(np.float64)
    exponent = np.maximum((low >> 23) & 0xFF, 1).astype(np.float64)
    sign = np.where(low >> 31, -1.0, 1.0)
    high_f = low_f + sign * 2.0 ** (exponent - 127 - 7)
    with np.errstate(invalid="ignore"):
        d_low = np.abs(values - low_f)
        d_high = np.abs(high_f - values)
    pick_high = (d_high < d_low) | ((d_high == d_low) & ((low >> 16) & 1 == 1))
    return (np.where(pick_high, high, low) >> 16).astype(np.uint16)


def cast(values, dtype):
    """Raw storage of float32 `values` in `dtype`, as the output should hold it."""
    if dtype == "BF16":
        return bf16_nearest_even(values)
    return values.astype({"F32": "<f4", "F16": "<f2"}[dtype])


ELEMENT_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1, "U8": 1}


def check_layout(path):
    """The file is valid safetensors with a 64-aligned, space-padded header, tensors
    listed in file order, back to back without holes, and each tensor naturally
    aligned: its absolute file offset is a multiple of its element size.
    Returns (header, arrays)."""
    length, header, arrays, size = read_raw(path)
    with open(path, "rb") as f:
        raw_header = f.read(8 + length)[8:]
    assert (8 + length) % 64 == 0
    text = raw_header.decode("utf-8")
    assert text.startswith("{") and text.rstrip(" ").endswith("}")
    assert set(text[len(text.rstrip(" ")):]) <= {" "}
    offset = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        assert entry["data_offsets"][0] == offset, name
        assert (8 + length + offset) % ELEMENT_BYTES[entry["dtype"]] == 0, name
        offset = entry["data_offsets"][1]
    assert 8 + length + offset == size
    return header, arrays


def converted(tmp_path, hf_dir, *options):
    """Convert `hf_dir`; assert success; return the output path."""
    out = tmp_path / "model.barellm"
    result = run(CONVERT, hf_dir, "-o", out, *options)
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize("flag,dtype", [("f32", "F32"), ("f16", "F16"), ("bf16", "BF16")])
def test_stories260k_round_trip(tmp_path, flag, dtype):
    need_shared(STORIES)
    out = converted(tmp_path, STORIES, "--dtype", flag)
    header, arrays = check_layout(out)
    source, _ = reference.read_safetensors(os.path.join(STORIES, "model.safetensors"))
    assert list(arrays) == expected_names(5, tied=True, weight_dtype=dtype)
    for name, array in arrays.items():
        assert header[name]["dtype"] == ("F32" if is_norm_name(name) else dtype)
        expected = cast(source[hf_name(name)], header[name]["dtype"])
        assert array.shape == expected.shape
        assert np.array_equal(array.view(np.uint8), expected.view(np.uint8)), name

    metadata = header["__metadata__"]
    assert metadata["barellm.format"] == "1"
    assert json.loads(metadata["barellm.config"]) == {
        "architecture": "llama", "dim": 64, "hidden_dim": 172, "layers": 5, "heads": 8,
        "kv_heads": 4, "head_dim": 8, "vocab_size": 512, "max_context": 512,
        "rope_theta": 10000.0, "rope_scaling": None, "norm_eps": 1e-5,
        "sliding_window": None, "tied_embeddings": True, "bos_id": 1, "eos_ids": [2],
        "add_bos": True, "weight_dtype": dtype}
    with open(os.path.join(STORIES, "tokenizer.json"), encoding="utf-8") as f:
        shipped = json.load(f)
    tokenizer_text = metadata["barellm.tokenizer"]
    assert json.loads(tokenizer_text) == shipped
    assert tokenizer_text == json.dumps(shipped, separators=(",", ":"), ensure_ascii=False)


def test_stories260k_default_dtype_and_logits(tmp_path):
    need_shared(STORIES)
    out = converted(tmp_path, STORIES)
    config = json.loads(read_raw(out)[1]["__metadata__"]["barellm.config"])
    assert config["weight_dtype"] == "F32"
    ids = [1, 403, 407, 261, 378, 432, 383]
    np.testing.assert_allclose(reference.logits_for(str(out), ids),
                               reference.logits_for(STORIES, ids), rtol=0, atol=1e-9)


def test_sharded_bf16_input(tmp_path):
    config = {**TINY_CONFIG, "num_hidden_layers": 3}
    with open(tmp_path / "config.json", "w") as f:
        json.dump(config, f)
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    with open(tok_dir / "tokenizer.json", "w") as f:
        json.dump(tiny_tokenizer_json(), f)
    hf = tmp_path / "hf"
    result = run(SYNTH, "--config", tmp_path / "config.json", "--tokenizer", tok_dir,
                 "-o", hf, "--dtype", "bf16", "--max-shard-bytes", 2000)
    assert result.returncode == 0, result.stderr
    assert (hf / "model.safetensors.index.json").exists()
    shards = sorted(p.name for p in hf.glob("*.safetensors"))
    assert len(shards) > 3

    source = {}
    for shard in shards:
        source.update(read_raw(hf / shard)[2])
    for flag, dtype in (("bf16", "BF16"), ("f32", "F32")):
        out = converted(tmp_path, hf, "--dtype", flag)
        header, arrays = check_layout(out)
        assert list(arrays) == expected_names(3, tied=False, weight_dtype=dtype)
        for name, array in arrays.items():
            raw = source[hf_name(name)]
            if header[name]["dtype"] == "F32" and raw.dtype == np.uint16:
                raw = (raw.astype(np.uint32) << 16).view(np.float32)
            assert np.array_equal(array, raw), name
    ids = [1, 5, 9, 33, 7]
    np.testing.assert_allclose(reference.logits_for(str(out), ids),
                               reference.logits_for(str(hf), ids), rtol=0, atol=1e-9)


# Odd sizes: I8 tensors with odd byte counts (41 x 21, 23 x 21, 21 x 23) and F16 tensors
# whose byte count is not a multiple of 4, so that laying tensors out in model order
# would misalign the F16/F32 tensors after them.
ODD_CONFIG = {**TINY_CONFIG, "hidden_size": 21, "intermediate_size": 23, "vocab_size": 41,
              "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 6}


def model_order_misaligned(header, weight_dtype):
    """Names of the tensors that would be misaligned if `header`'s tensors were laid out
    back to back in model order after a 64-aligned data start."""
    names = []
    for name in model_names(ODD_CONFIG["num_hidden_layers"], tied=False):
        names += [name, name + ".scale"] if weight_dtype == "Q8" and not is_norm_name(name) \
            else [name]
    offset, bad = 0, []
    for name in names:
        begin, end = header[name]["data_offsets"]
        if offset % ELEMENT_BYTES[header[name]["dtype"]]:
            bad.append(name)
        offset += end - begin
    return bad


@pytest.mark.parametrize("flag,dtype", [("f32", "F32"), ("f16", "F16"), ("bf16", "BF16"),
                                        ("q8", "Q8")])
@pytest.mark.parametrize("model", ["stories260K", "odd"])
def test_every_tensor_naturally_aligned(tmp_path, model, flag, dtype):
    if model == "odd":
        tensors = tiny_tensors(ODD_CONFIG, seed=11)
        hf = make_checkpoint(tmp_path / "hf", config=ODD_CONFIG, tensors=tensors)
        layers, tied = ODD_CONFIG["num_hidden_layers"], False
    else:
        hf = need_shared(STORIES)
        layers, tied = 5, True
    out = converted(tmp_path, hf, "--dtype", flag)
    length, header, arrays, size = read_raw(out)
    base = 8 + length
    assert base % 64 == 0
    spans = sorted((entry["data_offsets"], name) for name, entry in header.items()
                   if name != "__metadata__")
    assert [name for _, name in spans] == expected_names(layers, tied, dtype)
    offset = 0
    for (begin, end), name in spans:
        assert begin == offset, f"{name}: hole or overlap at data offset {offset}"
        element = ELEMENT_BYTES[header[name]["dtype"]]
        assert (base + begin) % element == 0, \
            f"{name} ({header[name]['dtype']}) at file offset {base + begin}"
        offset = end
    assert base + offset == size
    if model == "odd":
        if dtype != "F32":   # the sizes really are odd enough to matter
            assert model_order_misaligned(header, dtype)
        if dtype != "Q8":    # Q8 contents: tests/test_q8.py
            for name, array in arrays.items():
                expected = cast(tensors[hf_name(name)][1], header[name]["dtype"])
                assert np.array_equal(array.view(np.uint8), expected.view(np.uint8)), name


def test_default_dtype_follows_checkpoint(tmp_path):
    tensors = {name: ("F16", array.astype("<f2")) if array.ndim == 2 else (dtype, array)
               for name, (dtype, array) in tiny_tensors(TINY_CONFIG).items()}
    hf = make_checkpoint(tmp_path / "hf", tensors=tensors)
    header, arrays = check_layout(converted(tmp_path, hf))
    assert json.loads(header["__metadata__"]["barellm.config"])["weight_dtype"] == "F16"
    assert np.array_equal(arrays["layers.1.w2"],
                          tensors["model.layers.1.mlp.down_proj.weight"][1])


def test_tied_checkpoint_drops_lm_head_and_ignores_inv_freq(tmp_path):
    config = {**TINY_CONFIG, "tie_word_embeddings": True}
    tensors = tiny_tensors(TINY_CONFIG)
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = ("F32",
                                                               np.ones(2, dtype="<f4"))
    hf = make_checkpoint(tmp_path / "hf", config=config, tensors=tensors)
    header, arrays = check_layout(converted(tmp_path, hf))
    assert list(arrays) == expected_names(2, tied=True)
    assert json.loads(header["__metadata__"]["barellm.config"])["tied_embeddings"] is True


def test_explicit_head_dim_and_null_defaults(tmp_path):
    config = {**TINY_CONFIG, "head_dim": 8, "max_position_embeddings": None}
    hf = make_checkpoint(tmp_path / "hf", config=config)
    out = converted(tmp_path, hf)
    header, arrays = check_layout(out)
    got = json.loads(header["__metadata__"]["barellm.config"])
    assert got["head_dim"] == 8 and got["max_context"] == 2048
    assert arrays["layers.0.wq"].shape == (32, 16) and arrays["layers.0.wo"].shape == (16, 32)
    ids = [1, 4, 9, 30, 2]
    np.testing.assert_allclose(reference.logits_for(str(out), ids),
                               reference.logits_for(str(hf), ids), rtol=0, atol=1e-9)


@pytest.mark.parametrize("in_config", [False, True])
def test_a_chat_template_file_is_kept_verbatim_before_the_tokenizer_configs(tmp_path, in_config):
    """chat_template.jinja (the file transformers saves a template to: openai/gpt-oss-20b's)
    is the template, in place of tokenizer_config.json's where both are, as transformers
    reads them."""
    hf = make_checkpoint(tmp_path / "hf")
    template = "{% for m in messages %}<|start|>{{ m['role'] }}: «{{ m['content'] }}»\n{% endfor %}"
    (hf / "chat_template.jinja").write_text(template, encoding="utf-8")
    if in_config:
        with open(hf / "tokenizer_config.json", "w") as f:
            json.dump({"chat_template": "{{ 'the other one' }}"}, f)
    header, _ = check_layout(converted(tmp_path, hf))
    assert header["__metadata__"]["barellm.chat_template"] == template


def test_mistral_config_fields(tmp_path):
    config = {**TINY_CONFIG, "model_type": "mistral", "sliding_window": 32,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 16}}
    hf = make_checkpoint(tmp_path / "hf", config=config)
    with open(hf / "generation_config.json", "w") as f:
        json.dump({"eos_token_id": [2, 3]}, f)
    with open(hf / "tokenizer_config.json", "w") as f:
        json.dump({"add_bos_token": False}, f)
    header, _ = check_layout(converted(tmp_path, hf))
    got = json.loads(header["__metadata__"]["barellm.config"])
    assert got["architecture"] == "llama"
    assert got["sliding_window"] == 32
    assert got["rope_scaling"] == config["rope_scaling"]
    assert got["eos_ids"] == [2, 3]
    assert got["add_bos"] is False
    assert got["head_dim"] == 4 and got["kv_heads"] == 2


def test_bf16_rounding_and_nan():
    cases = np.array([1.0, -2.5, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, 3.4e38,
                      -3.4e38, 1e-40, -0.0, np.inf, -np.inf, 65504.0, 1 / 3],
                     dtype=np.float32)
    assert np.array_equal(dtypes.f32_to_bf16(cases), bf16_nearest_even(cases))
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 100000, dtype=np.uint64).astype(np.uint32)
    values = bits.view(np.float32)
    values = values[np.isfinite(values)]
    assert np.array_equal(dtypes.f32_to_bf16(values), bf16_nearest_even(values))
    nan = dtypes.f32_to_bf16(np.array([np.nan, -np.nan], dtype=np.float32))
    assert np.isnan(dtypes.bf16_to_f32(nan)).all()
    all_bits = np.arange(2**16, dtype=np.uint16)
    widened = dtypes.bf16_to_f32(all_bits)
    finite = ~np.isnan(widened)
    assert np.array_equal(dtypes.f32_to_bf16(widened)[finite], all_bits[finite])


def refuse(tmp_path, hf_dir, message, *options, out=None):
    """Conversion must exit 1 with one `convert:` line containing `message`, leave no
    output and no temporary file."""
    out = tmp_path / "out" / "model.barellm" if out is None else out
    os.makedirs(tmp_path / "out", exist_ok=True)
    result = run(CONVERT, hf_dir, "-o", out, *options)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("convert: "), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert message in result.stderr, result.stderr
    assert os.listdir(tmp_path / "out") == []
    assert not os.path.exists(out)


def edited_config(**changes):
    """TINY_CONFIG with keys changed (None removes a key)."""
    config = {**TINY_CONFIG, **changes}
    return {k: v for k, v in config.items() if v is not None}


CONFIG_REFUSALS = [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    # Mixtral and Qwen3-MoE need their routers and experts (tests/test_moe.py).
    ({"model_type": "mixtral"},
     "missing tensors: model.layers.0.block_sparse_moe.gate.weight"),
    ({"model_type": "qwen2_moe"}, "model_type 'qwen2_moe' is not supported: Qwen2-MoE's "
     "shared expert"),
    ({"model_type": "qwen3_moe", "head_dim": 4},
     "missing tensors: model.layers.0.self_attn.q_norm.weight"),
    # attention_bias asks for q/k/v/o biases, which this checkpoint lacks.
    ({"attention_bias": True}, "missing tensors: model.layers.0.self_attn.q_proj.bias"),
    ({"model_type": "mistral", "attention_bias": True},
     "attention_bias=true is not supported for mistral"),
    ({"model_type": "qwen2"}, "missing tensors: model.layers.0.self_attn.q_proj.bias"),
    ({"model_type": "qwen3", "head_dim": 4},
     "missing tensors: model.layers.0.self_attn.q_norm.weight"),
    ({"mlp_bias": True}, "mlp_bias=true is not supported"),
    ({"num_local_experts": 8}, "mixture-of-experts models (num_local_experts=8)"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    # LongRoPE is Phi-3's: a Llama config with it is refused.
    ({"rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [2.0]}},
     "rope_scaling type 'longrope' is not supported (only linear, llama3 and yarn)"),
    ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
     "rope_scaling type 'dynamic'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
     "rope_scaling 'low_freq_factor' of type llama3"),
    ({"hidden_size": None}, "config.json: missing 'hidden_size'"),
    ({"num_key_value_heads": 3}, "not a multiple of num_key_value_heads 3"),
    ({"quantization_config": {"quant_method": "gptq"}}, "quantized checkpoints"),
]


@pytest.mark.parametrize("changes,message", CONFIG_REFUSALS)
def test_refuses_config(tmp_path, changes, message):
    hf = make_checkpoint(tmp_path / "hf", config=edited_config(**changes),
                         tensors=tiny_tensors(TINY_CONFIG))
    refuse(tmp_path, hf, message)


def drop(name):
    """Tensor edit: remove `name`."""
    return lambda t: t.pop(name)


def add(name, array):
    """Tensor edit: add `name`."""
    return lambda t: t.__setitem__(name, ("F32", array))


def poke(name, value):
    """Tensor edit: set one element of `name` to `value`."""
    def edit(tensors):
        array = tensors[name][1].copy()
        array.flat[3] = value
        tensors[name] = ("F32", array)
    return edit


TENSOR_REFUSALS = [
    (drop("model.layers.1.mlp.up_proj.weight"),
     "missing tensors: model.layers.1.mlp.up_proj.weight"),
    (drop("lm_head.weight"), "missing tensors: lm_head.weight (tie_word_embeddings is false)"),
    (add("model.layers.0.self_attn.q_proj.bias", np.zeros(16, dtype="<f4")),
     "bias tensors are not supported: model.layers.0.self_attn.q_proj.bias"),
    (add("model.layers.0.mlp.extra.weight", np.zeros((2, 2), dtype="<f4")),
     "unexpected tensors: model.layers.0.mlp.extra.weight"),
    (add("model.layers.1.self_attn.k_proj.weight", np.zeros((16, 16), dtype="<f4")),
     "tensor 'model.layers.1.self_attn.k_proj.weight' has shape [16, 16], expected [8, 16]"),
    (poke("model.layers.1.mlp.gate_proj.weight", np.nan),
     "tensor 'model.layers.1.mlp.gate_proj.weight' contains NaN"),
    (poke("model.norm.weight", -np.inf), "tensor 'model.norm.weight' contains Inf"),
    (lambda t: t.__setitem__("model.norm.weight", ("I32", np.ones(16, dtype="<i4"))),
     "tensor 'model.norm.weight' has dtype I32"),
]


@pytest.mark.parametrize("edit,message", TENSOR_REFUSALS)
def test_refuses_tensors(tmp_path, edit, message):
    tensors = tiny_tensors(TINY_CONFIG)
    edit(tensors)
    refuse(tmp_path, make_checkpoint(tmp_path / "hf", tensors=tensors), message)


def test_refuses_f16_overflow(tmp_path):
    tensors = tiny_tensors(TINY_CONFIG)
    poke("model.layers.0.self_attn.o_proj.weight", 1e6)(tensors)
    hf = make_checkpoint(tmp_path / "hf", tensors=tensors)
    refuse(tmp_path, hf, "'model.layers.0.self_attn.o_proj.weight' has values beyond the "
           "F16 range", "--dtype", "f16")


def test_refuses_truncated_shard(tmp_path):
    hf = make_checkpoint(tmp_path / "hf")
    path = hf / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-10])
    refuse(tmp_path, hf, "model.safetensors: file is truncated (tensor 'lm_head.weight'")
    path.write_bytes(data[:20])
    refuse(tmp_path, hf, "model.safetensors: file is truncated (header of")


def test_refuses_index_naming_missing_tensor(tmp_path):
    hf = make_checkpoint(tmp_path / "hf")
    weight_map = {name: "model.safetensors" for name in tiny_tensors(TINY_CONFIG)}
    weight_map["model.layers.2.mlp.up_proj.weight"] = "model.safetensors"
    with open(hf / "model.safetensors.index.json", "w") as f:
        json.dump({"weight_map": weight_map}, f)
    refuse(tmp_path, hf, "tensor 'model.layers.2.mlp.up_proj.weight' is not in "
           "model.safetensors")


LOOKBEHIND_SPLIT = {"type": "Split", "pattern": {"Regex": "(?<=a)b"}, "behavior": "Isolated",
                    "invert": False}
TOKENIZER_REFUSALS = [
    ("normalizer", {"type": "BertNormalizer"},
     "tokenizer.json: normalizer type 'BertNormalizer' is not supported"),
    ("normalizer", {"type": "Sequence", "normalizers": [{"type": "NFKC"}]},
     "tokenizer.json: normalizer type 'NFKC' is not supported"),
    ("pre_tokenizer", {"type": "Whitespace"},
     "tokenizer.json: pre_tokenizer type 'Whitespace' is not supported"),
    ("decoder", {"type": "WordPiece"}, "tokenizer.json: decoder type 'WordPiece'"),
    ("model", {"type": "Unigram", "vocab": {}},
     "tokenizer.json: model type 'Unigram' is not supported"),
    ("pre_tokenizer", LOOKBEHIND_SPLIT, "tokenizer.json: pre_tokenizer Split regex '(?<=a)b' "
     "is not supported: lookbehind '(?<=' (at offset 0)"),
    ("pre_tokenizer", {"type": "Sequence", "pretokenizers": [{"type": "Digits"},
                                                             LOOKBEHIND_SPLIT]},
     "tokenizer.json: pre_tokenizer Split regex '(?<=a)b' is not supported: lookbehind"),
    ("normalizer", {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"Regex": " +"}, "content": "\u2581"}]},
     "tokenizer.json: normalizer Replace with Regex pattern ' +' is not supported"),
]


@pytest.mark.parametrize("key,value,message", TOKENIZER_REFUSALS)
def test_refuses_tokenizer(tmp_path, key, value, message):
    tokenizer = {**tiny_tokenizer_json(), key: value}
    refuse(tmp_path, make_checkpoint(tmp_path / "hf", tokenizer=tokenizer), message)


def test_refuses_tokenizer_larger_than_vocab(tmp_path):
    hf = make_checkpoint(tmp_path / "hf", config=edited_config(vocab_size=30),
                         tensors=tiny_tensors(edited_config(vocab_size=30)))
    refuse(tmp_path, hf, "the tokenizer has 40 ids but vocab_size is 30")


def test_refuses_unwritable_output(tmp_path):
    hf = make_checkpoint(tmp_path / "hf")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    refuse(tmp_path, hf, "cannot write output", out=blocker / "model.barellm")
    refuse(tmp_path, hf, "cannot write output", out=tmp_path / "missing" / "m.barellm")
    os.makedirs(tmp_path / "dir" / "model.barellm")
    result = run(CONVERT, hf, "-o", tmp_path / "dir" / "model.barellm")
    assert result.returncode == 1 and "it is a directory" in result.stderr
    assert os.listdir(tmp_path / "dir") == ["model.barellm"]


def test_failure_keeps_existing_output(tmp_path):
    tensors = tiny_tensors(TINY_CONFIG)
    poke("lm_head.weight", np.nan)(tensors)
    hf = make_checkpoint(tmp_path / "hf", tensors=tensors)
    out = tmp_path / "model.barellm"
    out.write_bytes(b"previous")
    result = run(CONVERT, hf, "-o", out)
    assert result.returncode == 1
    assert out.read_bytes() == b"previous"
    assert sorted(os.listdir(tmp_path)) == ["hf", "model.barellm"]


def test_refuses_missing_inputs(tmp_path):
    refuse(tmp_path, tmp_path / "nowhere", "nowhere: not a directory")
    hf = make_checkpoint(tmp_path / "hf")
    os.remove(hf / "tokenizer.json")
    refuse(tmp_path, hf, "no tokenizer.json or tokenizer.model")
    os.remove(hf / "config.json")
    refuse(tmp_path, hf, "config.json: file not found")


@pytest.mark.parametrize("args,message", [
    (["--dtype", "q5"], "argument --dtype: invalid choice: 'q5'"),
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--output"], "argument -o/--output: expected one argument"),
])
def test_wrong_command_lines_are_one_line_and_exit_2(tmp_path, args, message):
    hf = make_checkpoint(tmp_path / "hf")
    result = run(CONVERT, hf, "-o", tmp_path / "model.barellm", *args)
    assert_wrong_command_line(result, "convert.py", message)
    assert sorted(os.listdir(tmp_path)) == ["hf"]


def test_tokenizer_model_only_checkpoint(tmp_path):
    need_shared(STORIES)
    hf = tmp_path / "hf"
    shutil.copytree(STORIES, hf)
    os.chmod(hf, 0o755)
    os.remove(hf / "tokenizer.json")
    os.remove(hf / "tokenizer_config.json")
    header, _ = check_layout(converted(tmp_path, hf))
    metadata = header["__metadata__"]
    assert json.loads(metadata["barellm.config"])["add_bos"] is True
    tokenizer = json.loads(metadata["barellm.tokenizer"])
    with open(os.path.join(STORIES, "tokenizer.json"), encoding="utf-8") as f:
        shipped = json.load(f)
    for key in ("model", "normalizer", "pre_tokenizer", "decoder", "added_tokens"):
        assert tokenizer[key] == shipped[key], key


# ---- a config.json without bos_token_id while the tokenizer adds BOS ---------------------

def without_bos_token_id(path):
    """The tiny checkpoint with no BOS id in config.json."""
    config = {key: value for key, value in TINY_CONFIG.items() if key != "bos_token_id"}
    return make_checkpoint(path, config=config)


def test_bos_id_from_tokenizer_config(tmp_path):
    """tokenizer_config.json's bos_token names the BOS of tokenizer.json: id 1 here."""
    hf = without_bos_token_id(tmp_path / "hf")
    with open(hf / "tokenizer_config.json", "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "bos_token": {"content": "<s>"}}, f)
    header, _ = check_layout(converted(tmp_path, hf))
    got = json.loads(header["__metadata__"]["barellm.config"])
    assert (got["add_bos"], got["bos_id"]) == (True, 1)


def test_bos_id_from_the_sentencepiece_trainer_spec(tmp_path):
    """A tokenizer.model alone: its trainer spec's bos_id (1 in Llama 2's)."""
    need_shared(LLAMA2_TOKENIZER)
    hf = make_checkpoint(tmp_path / "hf", config={
        key: value for key, value in {**TINY_CONFIG, "vocab_size": 32000}.items()
        if key != "bos_token_id"})
    os.remove(hf / "tokenizer.json")
    shutil.copy(os.path.join(LLAMA2_TOKENIZER, "tokenizer.model"), hf / "tokenizer.model")
    header, _ = check_layout(converted(tmp_path, hf))
    got = json.loads(header["__metadata__"]["barellm.config"])
    assert (got["add_bos"], got["bos_id"]) == (True, 1)


def test_refuses_bos_added_with_no_bos_id(tmp_path):
    hf = without_bos_token_id(tmp_path / "hf")
    with open(hf / "tokenizer_config.json", "w") as f:
        json.dump({"add_bos_token": True}, f)
    refuse(tmp_path, hf, "the tokenizer adds BOS but no BOS id is known")


def test_no_bos_id_needed_without_bos(tmp_path):
    hf = without_bos_token_id(tmp_path / "hf")
    with open(hf / "tokenizer_config.json", "w") as f:
        json.dump({"add_bos_token": False}, f)
    header, _ = check_layout(converted(tmp_path, hf))
    got = json.loads(header["__metadata__"]["barellm.config"])
    assert (got["add_bos"], got["bos_id"]) == (False, None)

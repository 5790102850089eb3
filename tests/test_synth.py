"""Tests of convert/synth.py: determinism, sharding, presets, usable random weights."""

import json
import math
import os
import sys

import numpy as np
import pytest

import model as reference
from convert_testlib import (CONVERT, LLAMA2_TOKENIZER, REPO, SHARED, SMOLLM2_TOKENIZER,
                             STORIES, SYNTH, TINY_CONFIG, assert_wrong_command_line,
                             need_shared, read_raw, run, tiny_tokenizer_json)

sys.path.insert(0, os.path.dirname(SYNTH))
import convert  # noqa: E402  (convert/convert.py)
import synth  # noqa: E402

GGUF_FROM_HF = os.path.join(REPO, "scripts", "gguf_from_hf.py")


@pytest.fixture
def inputs(tmp_path):
    """(config path, tokenizer dir) for a tiny model with a tiny tokenizer."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**TINY_CONFIG, "vocab_size": 64}))
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text(json.dumps(tiny_tokenizer_json()))
    return config, tok


def synthesize(out, config, tok, *options):
    """Run synth.py; assert success."""
    result = run(SYNTH, "--config", config, "--tokenizer", tok, "-o", out, *options)
    assert result.returncode == 0, result.stderr
    return out


def file_bytes(directory):
    """{file name: content} of a directory."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_deterministic_per_seed(tmp_path, inputs):
    first = file_bytes(synthesize(tmp_path / "a", *inputs, "--seed", "7"))
    second = file_bytes(synthesize(tmp_path / "b", *inputs, "--seed", "7"))
    other = file_bytes(synthesize(tmp_path / "c", *inputs, "--seed", "8"))
    assert first == second
    assert first["model.safetensors"] != other["model.safetensors"]
    assert first["config.json"] == other["config.json"]


def test_sharding_matches_single_file(tmp_path, inputs):
    single = synthesize(tmp_path / "single", *inputs, "--dtype", "f16")
    sharded = synthesize(tmp_path / "sharded", *inputs, "--dtype", "f16",
                         "--max-shard-bytes", 3000)
    with open(sharded / "model.safetensors.index.json") as f:
        index = json.load(f)
    shards = sorted(p.name for p in sharded.glob("*.safetensors"))
    assert len(shards) > 2 and not (sharded / "model.safetensors").exists()
    assert shards == [f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                      for i in range(1, len(shards) + 1)]
    assert sorted(set(index["weight_map"].values())) == shards
    combined, total = {}, 0
    for shard in shards:
        _, header, arrays, _ = read_raw(sharded / shard)
        sizes = [e["data_offsets"][1] - e["data_offsets"][0]
                 for n, e in header.items() if n != "__metadata__"]
        assert sum(sizes) <= 3000 or len(sizes) == 1
        total += sum(sizes)
        for name, array in arrays.items():
            assert index["weight_map"][name] == shard
        combined.update(arrays)
    assert index["metadata"]["total_size"] == total
    _, header, expected, _ = read_raw(single / "model.safetensors")
    assert combined.keys() == expected.keys()
    for name, array in expected.items():
        assert np.array_equal(array, combined[name]), name
        is_norm = array.ndim == 1
        assert header[name]["dtype"] == ("F32" if is_norm else "F16")


def test_random_model_is_usable(tmp_path, inputs):
    config, tok = inputs
    config.write_text(json.dumps({**TINY_CONFIG, "vocab_size": 64, "num_hidden_layers": 24,
                                  "tie_word_embeddings": True}))
    hf = synthesize(tmp_path / "hf", config, tok, "--dtype", "bf16")
    out = tmp_path / "model.barellm"
    result = run(CONVERT, hf, "-o", out)
    assert result.returncode == 0, result.stderr
    ids = list(np.random.default_rng(0).integers(0, 64, 48))
    logits = reference.logits_for(str(out), ids)
    assert np.isfinite(logits).all()
    assert 0.3 < logits.std(axis=1).mean() < 3.0
    assert len(set(logits.argmax(axis=1))) > 8
    with open(hf / "tokenizer_config.json") as f:
        assert json.load(f)["add_bos_token"] is False


def test_refusals(tmp_path, inputs):
    config, tok = inputs
    config.write_text(json.dumps({**TINY_CONFIG, "vocab_size": 32}))
    result = run(SYNTH, "--config", config, "--tokenizer", tok, "-o", tmp_path / "hf")
    assert result.returncode == 1
    assert result.stderr == "synth: the tokenizer has 40 ids but vocab_size is 32\n"
    config.write_text(json.dumps({**TINY_CONFIG, "hidden_act": "gelu"}))
    result = run(SYNTH, "--config", config, "--tokenizer", tok, "-o", tmp_path / "hf")
    assert result.stderr == "synth: hidden_act 'gelu' is not supported (only silu)\n"
    result = run(SYNTH, "--config", config, "-o", tmp_path / "hf")
    assert result.stderr == "synth: --tokenizer is required with --config\n"
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    config.write_text(json.dumps(TINY_CONFIG))
    result = run(SYNTH, "--config", config, "--tokenizer", tok, "-o", tmp_path / "full")
    assert result.stderr.endswith("exists and is not an empty directory\n")
    for quantized in ("q8", "q4"):   # a checkpoint's matrices are floats
        result = run(SYNTH, "--config", config, "--tokenizer", tok, "-o", tmp_path / "q",
                     "--dtype", quantized)
        assert_wrong_command_line(result, "synth.py",
                                  f"argument --dtype: invalid choice: '{quantized}'")
        assert "Traceback" not in result.stderr and not os.path.exists(tmp_path / "q")


PRESET_SHAPES = {
    # name: hidden, intermediate, layers, heads, kv heads, vocab, max pos, theta, tied
    "tinyllama-1.1b": (2048, 5632, 22, 32, 4, 32000, 2048, 10000, False),
    "mistral-7b": (4096, 14336, 32, 32, 8, 32000, 32768, 10000, False),
    "llama3-8b": (4096, 14336, 32, 32, 8, 128256, 8192, 500000, False),
    "llama3.2-1b": (2048, 8192, 16, 32, 8, 128256, 131072, 500000, True),
    "smollm2-135m": (576, 1536, 30, 9, 3, 49152, 8192, 100000, True),
}
# The Qwen presets, as the checkpoints' config.json files give them:
# name: hidden, intermediate, layers, heads, kv heads, head_dim, vocab, max pos, theta, tied
QWEN_PRESET_SHAPES = {
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 64, 151936, 32768, 1e6, True),
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936, 40960, 1e6, True),
    "qwen3-8b": (4096, 12288, 36, 32, 8, 128, 151936, 40960, 1e6, False),
}


@pytest.mark.parametrize("name", sorted(PRESET_SHAPES))
def test_preset_shapes(name):
    _, cfg = synth.PRESETS[name]
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "vocab_size", "max_position_embeddings", "rope_theta",
            "tie_word_embeddings")
    assert tuple(cfg[k] for k in keys) == PRESET_SHAPES[name]
    assert cfg["rms_norm_eps"] == 1e-5
    convert.check_architecture(cfg)
    config = convert.model_config(cfg, None)
    assert config["sliding_window"] == (4096 if name == "mistral-7b" else None)


@pytest.mark.parametrize("name", sorted(QWEN_PRESET_SHAPES))
def test_qwen_preset_shapes(name):
    _, cfg = synth.PRESETS[name]
    config = convert.model_config(cfg, None)
    keys = ("dim", "hidden_dim", "layers", "heads", "kv_heads", "head_dim", "vocab_size",
            "max_context", "rope_theta", "tied_embeddings")
    assert tuple(config[k] for k in keys) == QWEN_PRESET_SHAPES[name]
    assert config["norm_eps"] == 1e-6 and config["sliding_window"] is None
    qwen3 = name.startswith("qwen3")
    assert config["architecture"] == ("qwen3" if qwen3 else "qwen2")
    assert config.get("qk_norm", False) is qwen3 and config.get("qkv_bias", False) is not qwen3
    entries = convert.expected_tensors(config)
    assert ("model.layers.0.self_attn.q_norm.weight" in entries) is qwen3
    assert ("model.layers.0.self_attn.q_proj.bias" in entries) is not qwen3


# The mixture-of-experts presets' barellm configs (mistralai/Mixtral-8x7B-v0.1,
# Qwen/Qwen3-30B-A3B): dim, layers, heads, kv_heads, head_dim, experts, k, expert width,
# norm_topk_prob, and the parameters of the whole model and of one token (the published
# 46.7 B of which 12.9 B active, and 30.5 B of which 3.3 B active).
MOE_PRESET_SHAPES = {
    "mixtral-8x7b": (4096, 32, 32, 8, 128, 8, 2, 14336, True, 46_702_792_704, 12_879_925_248),
    "qwen3-30b-a3b": (2048, 48, 32, 4, 128, 128, 8, 768, True, 30_532_122_624, 3_353_032_704),
}


def parameters(config, entries, active):
    """The parameters of `entries` (convert.expected_tensors), counting `active` of each
    stacked matrix's experts (all when None)."""
    total = 0
    for key, (name, shape, _) in entries.items():
        count = math.prod(shape)
        if isinstance(key, tuple) and active is not None:
            count = count * active // config["experts"]
        total += count
    return total


@pytest.mark.parametrize("name", sorted(MOE_PRESET_SHAPES))
def test_moe_preset_shapes(name):
    _, cfg = synth.PRESETS[name]
    convert.check_architecture(cfg)
    config = convert.model_config(cfg, None)
    keys = ("dim", "layers", "heads", "kv_heads", "head_dim", "experts", "experts_per_token",
            "moe_hidden_dim", "norm_topk_prob")
    entries = convert.expected_tensors(config)
    assert (*(config[k] for k in keys), parameters(config, entries, None),
            parameters(config, entries, config["experts_per_token"])) == MOE_PRESET_SHAPES[name]
    assert "dense_layers" not in config and config["architecture"] == cfg["model_type"]


@pytest.mark.parametrize("layers,message", [(0, "--layers 0 is not between 1 and the "
                                                "preset's 48"),
                                            (49, "--layers 49 is not between")])
def test_layers_out_of_range_are_refused(tmp_path, layers, message):
    result = run(SYNTH, "--preset", "qwen3-30b-a3b", "--layers", str(layers), "-o",
                 tmp_path / "out")
    assert result.returncode == 1 and message in result.stderr
    assert not os.path.exists(tmp_path / "out")


def test_layers_keeps_the_first_layers_of_the_shape(tmp_path):
    """smollm2-135m with 2 of its 30 layers: the real per-layer shapes."""
    need_shared(SMOLLM2_TOKENIZER)  # the preset's default tokenizer
    out = tmp_path / "hf"
    result = run(SYNTH, "--preset", "smollm2-135m", "--layers", "2", "--dtype", "f16", "-o", out)
    assert result.returncode == 0, result.stderr
    with open(out / "config.json") as f:
        cfg = json.load(f)
    assert cfg["num_hidden_layers"] == 2 and cfg["hidden_size"] == 576


def test_layers_keeps_the_first_layer_types():
    """gpt-oss-20b's layer_types (sliding, full, ...) cut to the layers kept."""
    cfg = synth.first_layers(synth.PRESETS["gpt-oss-20b"][1], 3)
    assert cfg["num_hidden_layers"] == 3
    assert cfg["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]


def test_bias_scale():
    bias = next(synth.tensor_blocks("model.layers.0.self_attn.q_proj.bias", (4000,), True, 0))
    assert abs(bias.mean()) < 0.02 and abs(bias.std() - 0.25) < 0.01


def test_smollm2_preset_is_the_real_config():
    path = need_shared(os.path.join(SMOLLM2_TOKENIZER, "config.json"))
    with open(path) as f:
        real = json.load(f)
    _, preset = synth.PRESETS["smollm2-135m"]
    for key, value in preset.items():
        if key in real:
            assert real[key] == value, key


def test_llama2_tokenizer_model_only(tmp_path, inputs):
    need_shared(LLAMA2_TOKENIZER)
    config, _ = inputs
    config.write_text(json.dumps({**TINY_CONFIG, "hidden_size": 8, "num_attention_heads": 2,
                                  "num_key_value_heads": 1, "vocab_size": 32000}))
    hf = synthesize(tmp_path / "hf", config, LLAMA2_TOKENIZER, "--dtype", "f32")
    assert sorted(os.listdir(hf)) == ["config.json", "generation_config.json",
                                      "model.safetensors", "tokenizer.model",
                                      "tokenizer_config.json"]
    with open(hf / "tokenizer_config.json") as f:
        assert json.load(f)["add_bos_token"] is True
    out = tmp_path / "model.barellm"
    result = run(CONVERT, hf, "-o", out)
    assert result.returncode == 0, result.stderr
    metadata = read_raw(out)[1]["__metadata__"]
    assert json.loads(metadata["barellm.config"])["add_bos"] is True
    assert len(json.loads(metadata["barellm.tokenizer"])["model"]["vocab"]) == 32000


def test_matrix_scale():
    blocks = list(synth.tensor_blocks("w", (300, 400), False, 0))
    matrix = np.concatenate(blocks)
    assert matrix.shape == (300, 400)
    assert abs(matrix.std() - 1 / math.sqrt(400)) < 0.002
    norm = next(synth.tensor_blocks("n", (400,), True, 0))
    assert abs(norm.mean() - 1) < 0.02


def test_tokenizer_from_a_gguf_file(tmp_path, inputs):
    """--tokenizer FILE.gguf: the GGUF's tokenizer gives the ids of the checkpoint's own."""
    pytest.importorskip("gguf", reason="pip package gguf missing")
    tokenizers = pytest.importorskip("tokenizers", reason="pip package tokenizers missing")
    need_shared(STORIES)
    vocab_gguf = tmp_path / "stories.gguf"
    result = run(GGUF_FROM_HF, STORIES, "-o", vocab_gguf)
    assert result.returncode == 0, result.stderr
    config, _ = inputs
    config.write_text(json.dumps({**TINY_CONFIG, "vocab_size": 512}))
    hf = synthesize(tmp_path / "hf", config, vocab_gguf, "--dtype", "f32")
    with open(hf / "tokenizer_config.json") as f:
        tok_config = json.load(f)
    assert (tok_config["add_bos_token"], tok_config["bos_token"]) == (True, "<s>")
    out = tmp_path / "model.barellm"
    result = run(CONVERT, hf, "-o", out)
    assert result.returncode == 0, result.stderr
    ours = tokenizers.Tokenizer.from_str(read_raw(out)[1]["__metadata__"]["barellm.tokenizer"])
    reference = tokenizers.Tokenizer.from_file(os.path.join(STORIES, "tokenizer.json"))
    for text in ("Once upon a time, there was a little girl named Lily.",
                 "  two spaces, tabs\tand\nnewlines, déjà vu 😀", ""):
        assert (ours.encode(text, add_special_tokens=False).ids ==
                reference.encode(text, add_special_tokens=False).ids), text


def test_tokenizer_refusals(tmp_path, inputs):
    config, _ = inputs
    for missing in (tmp_path / "absent", tmp_path / "absent.gguf"):
        result = run(SYNTH, "--config", config, "--tokenizer", missing, "-o", tmp_path / "hf")
        assert result.returncode == 1
        assert result.stderr == (f"synth: tokenizer {missing} is neither a directory nor a "
                                 ".gguf file (use --tokenizer)\n")
    truncated = tmp_path / "vocab.gguf"
    truncated.write_bytes(b"GGUF\x03\x00")
    result = run(SYNTH, "--config", config, "--tokenizer", truncated, "-o", tmp_path / "hf")
    assert result.returncode == 1 and result.stderr.startswith("synth: ")
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


GEMMA3_VOCAB = os.path.join(SHARED, "tokenizers", "gemma3", "gemma3-vocab.gguf")
# The Gemma 3 presets, as the checkpoints' config.json files give them: name: hidden,
# intermediate, layers, heads, kv heads, vocab, max pos, sliding window, rope_scaling.
GEMMA3_PRESET_SHAPES = {
    "gemma3-270m": (640, 2048, 18, 4, 1, 262144, 32768, 512, None),
    "gemma3-1b": (1152, 6912, 26, 4, 1, 262144, 32768, 512, None),
    "gemma3-4b": (2560, 10240, 34, 8, 4, 262208, 131072, 1024,
                  {"rope_type": "linear", "factor": 8.0}),
}


@pytest.mark.parametrize("name", sorted(GEMMA3_PRESET_SHAPES))
def test_gemma3_preset_shapes(name):
    tokenizer, cfg = synth.PRESETS[name]
    assert os.path.normpath(os.path.join(synth.SHARED_TOKENIZERS, tokenizer)) == \
        os.path.normpath(GEMMA3_VOCAB)
    convert.check_architecture(cfg)
    config = convert.model_config(convert.language_model_config(cfg), None)
    keys = ("dim", "hidden_dim", "layers", "heads", "kv_heads", "vocab_size", "max_context",
            "sliding_window", "rope_scaling")
    assert tuple(config[k] for k in keys) == GEMMA3_PRESET_SHAPES[name]
    assert config["architecture"] == "gemma3" and config["head_dim"] == 256
    assert config["layer_types"] == ["full" if (layer + 1) % 6 == 0 else "sliding"
                                     for layer in range(config["layers"])]
    assert (config["rope_theta"], config["rope_theta_local"]) == (1e6, 1e4)
    assert config["attention_scale"] == 1 / 16 and config["norm_eps"] == 1e-6
    assert config["embedding_scale"] == float(np.float32(math.sqrt(config["dim"])))
    assert config["tied_embeddings"] and config["bos_id"] == 2 and config["eos_ids"] == [1, 106]


def test_gemma3_weights_hold_norms_w_for_one_plus_w(tmp_path, inputs):
    """A Gemma checkpoint's norm weights are w of the multiplier 1 + w: synth draws them
    near 0 (near 1 for the other families), under Gemma's tensor names."""
    config, tok = inputs
    config.write_text(json.dumps({**synth.PRESETS["gemma3-270m"][1], "hidden_size": 16,
                                  "intermediate_size": 24, "num_hidden_layers": 2,
                                  "head_dim": 8, "vocab_size": 64}))
    hf = synthesize(tmp_path / "hf", config, tok, "--dtype", "f32")
    _, _, arrays, _ = read_raw(hf / "model.safetensors")
    norms = [name for name in arrays if name.endswith("norm.weight")]
    assert len(norms) == 2 * 6 + 1 and "model.layers.1.post_feedforward_layernorm.weight" in norms
    values = np.concatenate([arrays[name] for name in norms])
    assert abs(values.mean()) < 0.02 and 0.03 < values.std() < 0.07


def test_gemma3_vocabulary_as_tokenizer_model(tmp_path, inputs):
    """--tokenizer gemma3-vocab.gguf writes a tokenizer.model that the sentencepiece package
    loads, holding the GGUF's pieces, scores, types and special ids, and encoding the eval
    texts as the tokenizer.json written beside it does (pip tokenizers); tokenizer_config's
    added_tokens_decoder gives the control and user-defined tokens."""
    gguf = pytest.importorskip("gguf", reason="pip package gguf missing")
    sentencepiece = pytest.importorskip("sentencepiece",
                                        reason="pip package sentencepiece missing")
    tokenizers = pytest.importorskip("tokenizers", reason="pip package tokenizers missing")
    need_shared(GEMMA3_VOCAB)
    config, _ = inputs
    config.write_text(json.dumps({**TINY_CONFIG, "hidden_size": 4, "num_attention_heads": 1,
                                  "num_key_value_heads": 1, "num_hidden_layers": 1,
                                  "vocab_size": 262144}))
    hf = synthesize(tmp_path / "hf", config, GEMMA3_VOCAB, "--dtype", "f32")
    reader = gguf.GGUFReader(GEMMA3_VOCAB)

    def field(name):
        return reader.fields[f"tokenizer.ggml.{name}"].contents()

    tokens, scores, types = field("tokens"), field("scores"), field("token_type")
    model = sentencepiece.SentencePieceProcessor(model_file=str(hf / "tokenizer.model"))
    assert model.vocab_size() == len(tokens) == 262144
    assert (model.bos_id(), model.eos_id(), model.unk_id(), model.pad_id()) == (
        field("bos_token_id"), field("eos_token_id"), field("unknown_token_id"),
        field("padding_token_id"))
    rng = np.random.default_rng(0)
    for i in sorted({*range(300), *rng.integers(0, len(tokens), 2000).tolist()}):
        kind = types[i]
        expected = tokens[i].replace(" ", "\u2581") if kind == 4 else tokens[i]
        assert model.id_to_piece(i) == expected, i
        assert model.get_score(i) == pytest.approx(scores[i], rel=1e-7), i
        assert model.is_control(i) == (kind == 3 and i != model.unk_id()), i
        assert model.is_byte(i) == (kind == 6), i
    with open(hf / "tokenizer_config.json") as f:
        decoder = json.load(f)["added_tokens_decoder"]
    assert decoder["106"]["content"] == "<end_of_turn>" and decoder["106"]["special"]
    assert decoder["107"] == {"content": "\n", "lstrip": False, "normalized": False,
                              "rstrip": False, "single_word": False, "special": False}
    assert len(decoder) == sum(kind in (2, 3, 4) for kind in types)
    fast = tokenizers.Tokenizer.from_file(str(hf / "tokenizer.json"))
    eval_dir = os.path.join(SHARED, "eval")
    texts = ["Hello  world\t\n  x", " leading space", "déjà vu 😀 日本語のテキスト",
             "tabs\t\tand\n\n\nnewlines   end  "]
    for name in ("wiki.test.raw", "tinyshakespeare.txt", "tinystories_valid_sample.txt"):
        with open(need_shared(os.path.join(eval_dir, name)), encoding="utf-8") as f:
            texts.append(f.read(6000))
    for text in texts:
        assert model.encode(text) == fast.encode(text, add_special_tokens=False).ids, text[:40]


def test_tokenizer_model_refusals():
    """A GGUF vocabulary that cannot be a tokenizer.model is refused with a message: no
    unknown token, a type that is no SentencePiece piece type, a special id out of range."""
    from common import ConvertError
    import gguf_in

    def keys(types, **ids):
        entries = {"tokenizer.ggml.token_type": ([gguf_in.ARRAY_TYPE, 5], types)}
        entries.update({f"tokenizer.ggml.{name}_token_id": ([4], value)
                        for name, value in ids.items()})
        return gguf_in.Keys(entries)

    tokens = ["<pad>", "<unk>", "a"]
    with pytest.raises(ConvertError, match="has no unknown token"):
        synth.sentencepiece_model(keys([3, 3, 1]), tokens)
    with pytest.raises(ConvertError, match="token 'a' has type 9, not a SentencePiece"):
        synth.sentencepiece_model(keys([3, 3, 9], unknown=1), tokens)
    with pytest.raises(ConvertError, match="tokenizer.ggml.bos_token_id 3 is not a token id"):
        synth.sentencepiece_model(keys([3, 3, 1], unknown=1, bos=3), tokens)
    model = synth.spm.parse_model(synth.sentencepiece_model(keys([3, 3, 1], unknown=1), tokens))
    assert model["pieces"] == [("<pad>", 0.0, 3), ("<unk>", 0.0, 2), ("a", 0.0, 1)]
    assert model["model_type"] == 2 and model["bos_id"] is None
    assert model["add_dummy_prefix"] is True  # the GGUF does not say: SentencePiece's default


def test_gpt_oss_preset_is_gpt_oss_20b():
    """openai/gpt-oss-20b's shape: 20.9 B parameters, of which 3.6 B active apart from the
    embedding (4 of 32 experts), as OpenAI's model card gives them."""
    _, cfg = synth.PRESETS["gpt-oss-20b"]
    convert.check_architecture(cfg)
    config = convert.model_config(convert.language_model_config(cfg), None)
    keys = ("dim", "layers", "heads", "kv_heads", "head_dim", "experts", "experts_per_token",
            "moe_hidden_dim", "vocab_size", "sliding_window", "swiglu_limit", "rope_theta")
    assert tuple(config[k] for k in keys) == (2880, 24, 64, 8, 64, 32, 4, 2880, 201088, 128,
                                              7.0, 150000.0)
    assert config["layer_types"] == ["sliding", "full"] * 12
    scaling = config["rope_scaling"]
    assert (scaling["factor"], scaling["original_max_position_embeddings"],
            scaling["truncate"]) == (32.0, 4096, False)
    sizes = {name: math.prod(shape) for name, shape, _ in convert.expected_tensors(config).values()}
    experts = sum(size for name, size in sizes.items() if ".experts." in name)
    total = sum(sizes.values())
    assert round(total / 1e9, 1) == 20.9
    active = total - experts + experts * 4 // 32 - sizes["token_embedding"]
    assert round(active / 1e9, 1) == 3.6


def test_a_gpt_oss_checkpoint_has_fused_experts_and_non_zero_biases(tmp_path, inputs):
    """A small gpt-oss shape: transformers' fused expert tensors, every bias and sink random
    and non-zero, and a file the converter reads and the reference runs."""
    config, tok = inputs
    config.write_text(json.dumps({
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 32,
        "intermediate_size": 24, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "num_local_experts": 4,
        "num_experts_per_tok": 2, "vocab_size": 64, "max_position_embeddings": 256,
        "sliding_window": 4}))
    hf = synthesize(tmp_path / "hf", config, tok, "--dtype", "bf16")
    header, arrays = read_raw(hf / "model.safetensors")[1:3]
    assert header["model.layers.1.mlp.experts.gate_up_proj"]["shape"] == [4, 32, 48]
    assert header["model.layers.1.mlp.experts.down_proj"]["shape"] == [4, 24, 32]
    for name in ("mlp.experts.gate_up_proj_bias", "mlp.experts.down_proj_bias",
                 "mlp.router.bias", "self_attn.sinks", "self_attn.q_proj.bias"):
        assert (arrays[f"model.layers.1.{name}"] != 0).all(), name
    out = tmp_path / "model.barellm"
    result = run(CONVERT, hf, "-o", out)
    assert result.returncode == 0, result.stderr
    logits = reference.logits_for(str(out), list(range(1, 20)))
    assert np.isfinite(logits).all() and logits.std() > 0.1

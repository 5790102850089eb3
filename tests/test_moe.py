"""Mixture-of-experts checkpoints, Mixtral (every layer sparse, top-2 of 8, weights rescaled to
sum to 1) and Qwen3-MoE (dense layers among sparse ones from mlp_only_layers and
decoder_sparse_step, norm_topk_prob on or off, Qwen3's attention): the converter's output
(the router in F32, each matrix's experts stacked), the loader's checks, and the C++ CPU
backend's logits at every position against the independent numpy reference
(reference/model.py), decode (one token at a time) and prefill (tokens grouped by expert),
every SIMD level, every weight dtype. The routers are built so that routing differs between
tokens and the k-th and (k+1)-th experts of some tokens are near ties."""

import json
import math

import numpy as np
import pytest

import model as reference
from convert_testlib import CONVERT, make_checkpoint, read_raw, run, write_safetensors
from test_end_to_end import IDS, barellm_logits, relative_error, rounds_x_to_bf16
from test_convert_kquants import matrix_values
from test_qwen import barellm, convert

_BASE = {"hidden_act": "silu", "vocab_size": 512, "max_position_embeddings": 64,
         "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "bos_token_id": 1, "eos_token_id": 2,
         "torch_dtype": "float32", "tie_word_embeddings": False}
# Sizes off the SIMD width, the tiles and the blocks.
CONFIGS = {
    "mixtral": {**_BASE, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "hidden_size": 40, "intermediate_size": 44, "num_hidden_layers": 3,
                "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": None,
                "num_local_experts": 8, "num_experts_per_tok": 2},
    # Layer 1 dense (mlp_only_layers), layers 0 and 2 sparse; weights not rescaled.
    "qwen3_moe": {**_BASE, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                  "hidden_size": 40, "intermediate_size": 56, "moe_intermediate_size": 20,
                  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 18, "num_experts": 12, "num_experts_per_tok": 3,
                  "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [1],
                  "use_sliding_window": False},
    # Layers 1 and 3 sparse (decoder_sparse_step 2), weights rescaled.
    "qwen3_moe-step": {**_BASE, "architectures": ["Qwen3MoeForCausalLM"],
                       "model_type": "qwen3_moe", "hidden_size": 40, "intermediate_size": 56,
                       "moe_intermediate_size": 20, "num_hidden_layers": 4,
                       "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 18,
                       "num_experts": 12, "num_experts_per_tok": 3, "norm_topk_prob": True,
                       "decoder_sparse_step": 2, "use_sliding_window": False},
}
LOGIT_GAIN = 4.0
ROUTER_GAIN = 2.0
# The router rows of expert 1 are expert 0's plus NEAR_TIE times another random row: their
# logits differ by about NEAR_TIE, far above float32 rounding (1e-6), far below the spread.
NEAR_TIE = 3e-3


def sparse_layers(config):
    return [layer for layer in range(config["num_hidden_layers"])
            if reference.is_sparse(reference.hf_experts(config), layer)]


def moe_tensors(config, seed=0, near_tie=True):
    """Random F32 tensors with Hugging Face names: N(0, 1/in) matrices (the output scaled by
    LOGIT_GAIN, the routers by ROUTER_GAIN, expert 1's router row a near copy of expert 0's
    with `near_tie`), norms around 1, Qwen3's q/k norms in [0.5, 2.5]."""
    rng = np.random.default_rng(seed)
    model_type = config["model_type"]
    dim, vocab = config["hidden_size"], config["vocab_size"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hd = config.get("head_dim") or dim // heads
    experts = reference.hf_experts(config)
    router_name, expert_names = reference.HF_MOE_NAMES[model_type]

    def matrix(rows, cols, gain=1.0):
        return ("F32", (gain * rng.standard_normal((rows, cols)) / math.sqrt(cols)).astype("<f4"))

    def norm(size):
        return ("F32", (1.0 + 0.1 * rng.standard_normal(size)).astype("<f4"))

    tensors = {"model.embed_tokens.weight": matrix(vocab, dim)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors.update({
            p + "input_layernorm.weight": norm(dim),
            p + "self_attn.q_proj.weight": matrix(heads * hd, dim),
            p + "self_attn.k_proj.weight": matrix(kv * hd, dim),
            p + "self_attn.v_proj.weight": matrix(kv * hd, dim),
            p + "self_attn.o_proj.weight": matrix(dim, heads * hd),
            p + "post_attention_layernorm.weight": norm(dim),
        })
        if model_type == "qwen3_moe":
            for name in ("q_norm.weight", "k_norm.weight"):
                tensors[p + "self_attn." + name] = ("F32", rng.uniform(0.5, 2.5, hd).astype("<f4"))
        if layer in sparse_layers(config):
            width = experts["moe_hidden_dim"]
            router = matrix(experts["experts"], dim, ROUTER_GAIN)[1]
            if near_tie:
                router[1] = router[0] + NEAR_TIE * rng.standard_normal(dim).astype("<f4")
            tensors[p + router_name] = ("F32", router)
            for e in range(experts["experts"]):
                for short, shape in (("w1", (width, dim)), ("w3", (width, dim)),
                                     ("w2", (dim, width))):
                    tensors[p + expert_names[short].format(expert=e)] = matrix(*shape)
        else:
            hidden = config["intermediate_size"]
            tensors.update({p + "mlp.gate_proj.weight": matrix(hidden, dim),
                            p + "mlp.up_proj.weight": matrix(hidden, dim),
                            p + "mlp.down_proj.weight": matrix(dim, hidden)})
    tensors["model.norm.weight"] = norm(dim)
    tensors["lm_head.weight"] = matrix(vocab, dim, LOGIT_GAIN)
    return tensors


def checkpoint(tmp_path, name, config=None, tensors=None, near_tie=True):
    """The Hugging Face directory of CONFIGS[name] (tiny tokenizer, vocab 512)."""
    config = CONFIGS[name] if config is None else config
    return make_checkpoint(str(tmp_path / f"hf-{name}"), config,
                           moe_tensors(config, near_tie=near_tie) if tensors is None
                           else tensors)


SIMD_LEVELS = ["default", "avx2", "scalar"]


def simd_flags(level):
    return [] if level == "default" else ["--simd", level]


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("mode", ["decode", "prefill"])
@pytest.mark.parametrize("simd", SIMD_LEVELS)
def test_f32_logits_match_the_reference(tmp_path, name, mode, simd):
    hf = checkpoint(tmp_path, name)
    model = convert(hf, tmp_path / "model.bin", "f32")
    want = reference.logits_for(hf, IDS)
    assert want.std(axis=1).min() > 2.0  # far from uniform
    flags = ["--kv", "f32", *simd_flags(simd)] + (["--prefill"] if mode == "prefill" else [])
    got = barellm_logits(model, IDS, *flags)
    assert relative_error(got, want) < 1e-4
    assert (got.argmax(axis=1) == want.argmax(axis=1)).all()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_routing_differs_between_tokens_with_near_ties(tmp_path, name, monkeypatch):
    """What the tests above run through: in each sparse layer the tokens go to different
    experts, most experts serve some token, and some token's k-th and (k+1)-th experts are
    within a few NEAR_TIE of each other (yet far above float32 rounding), so that a backend
    whose routing rounded worse or broke ties otherwise would fail them."""
    config, weights = reference.load(checkpoint(tmp_path, name))
    routes, gaps = [], []
    route = reference.route

    def recording_route(config, logits):
        chosen, chosen_weights = route(config, logits)
        probabilities = np.sort(np.exp(logits - logits.max()))[::-1]
        k = config["experts_per_token"]
        gaps.append((probabilities[k - 1] - probabilities[k]) / probabilities.sum())
        routes.append(frozenset(chosen.tolist()))
        return chosen, chosen_weights

    monkeypatch.setattr(reference, "route", recording_route)
    reference.forward(config, weights, IDS)
    per_layer = len(IDS)
    layers = sparse_layers(CONFIGS[name])
    assert len(routes) == per_layer * len(layers)
    for i in range(len(layers)):
        chosen = routes[i * per_layer:(i + 1) * per_layer]
        assert len(set(chosen)) > per_layer // 4
        assert len(set().union(*chosen)) >= 3 * config["experts"] // 4
    assert 1e-6 < min(gaps) < 10 * NEAR_TIE


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_f16_and_bf16_match_the_reference_on_the_same_weights(tmp_path, name, dtype, mode):
    """The reference reads the converted file: the same rounded matrices, the F32 routers.
    The f16 KV cache adds a small error (measured: up to 1.8e-3), and so does x rounded to
    bf16 where bf16 products use vdpbf16ps (up to 1.4e-2: the experts' outputs add up
    the rounding of several matrices); without the near tie, which such rounding may flip."""
    model = convert(checkpoint(tmp_path, name, near_tie=False), tmp_path / "model.bin", dtype)
    want = reference.logits_for(model, IDS)
    got = barellm_logits(model, IDS, "--kv", "f16", *(["--prefill"] if mode == "prefill" else []))
    tolerance = 3e-3
    if dtype == "bf16" and rounds_x_to_bf16():
        tolerance = 3e-2
    assert relative_error(got, want) < tolerance
    assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.8


# Widths of whole Q4 blocks (32 columns), else q4 keeps the matrices in F16.
QUANTIZED_SHAPES = {"mixtral": {"hidden_size": 64, "intermediate_size": 96},
                    "qwen3_moe": {"hidden_size": 64, "moe_intermediate_size": 32,
                                  "intermediate_size": 96, "head_dim": 16},
                    "qwen3_moe-step": {"hidden_size": 64, "moe_intermediate_size": 32,
                                       "intermediate_size": 96, "head_dim": 16}}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("dtype", ["q8", "q4"])
def test_quantized_matches_the_reference_on_the_dequantized_weights(tmp_path, name, dtype):
    """The scalar path uses the dequantized weights exactly. The SIMD paths, decode and
    prefill, also quantize the activations to 8 bits, which every expert's matrices add to
    (measured: 2.3e-2 to 3.6e-2, and 7.3e-2 for Mixtral q8, 2.5e-2 there before x's Q8 rule
    became llama.cpp's: where the rounding of x falls is chance on so small a model)."""
    config = {**CONFIGS[name], **QUANTIZED_SHAPES[name]}
    hf = checkpoint(tmp_path, name, config, moe_tensors(config, near_tie=False))
    model = convert(hf, tmp_path / "model.bin", dtype)
    check_experts_quantized_logits(model, reference.logits_for(model, IDS))


def check_experts_quantized_logits(model, want):
    """The logits of a q8/q4 mixture of experts at IDS against `want`, the reference fed its
    dequantized weights: the scalar path within 1e-4; decode and prefill at the best level
    and on AVX2, whose 8-bit activations every expert's matrices add to, within 1e-1 with the
    argmax at 80% of the positions or more."""
    scalar = barellm_logits(model, IDS, "--kv", "f32", "--simd", "scalar")
    assert relative_error(scalar, want) < 1e-4
    for flags in ([], ["--prefill"], ["--simd", "avx2"], ["--simd", "avx2", "--prefill"]):
        got = barellm_logits(model, IDS, "--kv", "f32", *flags)
        assert relative_error(got, want) < 1e-1
        assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.8


@pytest.mark.parametrize("dtype", ["q4_k_m", "q6_k"])
def test_k_quant_mixes_match_the_reference_on_the_dequantized_weights(tmp_path, dtype):
    """The experts in ggml's blocks (rows of 256 columns): a Mixtral of those widths, against
    the reference fed the file's weights dequantized here (test_convert_kquants.py). Every
    expert is chosen: the activations' 8-bit quantization, 2-3% here, would otherwise flip
    some token's choice between two close experts (measured with 2 of 8: up to 10%)."""
    config = {**CONFIGS["mixtral"], "hidden_size": 256, "intermediate_size": 512,
              "num_hidden_layers": 2, "num_experts_per_tok": 8}
    hf = checkpoint(tmp_path, "mixtral", config, moe_tensors(config, near_tie=False))
    model = convert(hf, tmp_path / "model.bin", dtype)
    types = json.loads(read_raw(model)[1]["__metadata__"]["barellm.matrix_types"])
    assert types["layers.0.experts.w1"].endswith("_K")
    reference_config, weights = reference.load(model)
    stored = read_raw(model)[2]
    for name, kind in types.items():
        weights[name] = matrix_values(stored, name, kind).astype(np.float32)
    want = reference.forward(reference_config, weights, IDS)
    scalar = barellm_logits(model, IDS, "--kv", "f32", "--simd", "scalar")
    assert relative_error(scalar, want) < 1e-4
    for flags in ([], ["--prefill"], ["--simd", "avx2"], ["--simd", "avx2", "--prefill"]):
        got = barellm_logits(model, IDS, "--kv", "f32", *flags)
        assert relative_error(got, want) < 6e-2
        assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() >= 0.8


@pytest.mark.parametrize("name,edit", [
    ("qwen3_moe", {"norm_topk_prob": True}),
    ("qwen3_moe", {"mlp_only_layers": []}),
    ("qwen3_moe-step", {"norm_topk_prob": False}),
    ("mixtral", {"num_experts_per_tok": 3}),
])
def test_each_routing_field_moves_the_logits(tmp_path, name, edit):
    """Each routing setting changes the reference logits far beyond the 1e-4 tolerance, so a
    backend that ignored it would fail the tests above; barellm follows the change."""
    config = {**CONFIGS[name], **edit}
    tensors = moe_tensors(config)
    changed = reference.logits_for(checkpoint(tmp_path, name, config, tensors), IDS)
    original = reference.logits_for(checkpoint(tmp_path / "original", name), IDS)
    assert relative_error(changed, original) > 0.05
    model = convert(checkpoint(tmp_path / "edited", name, config, tensors),
                    tmp_path / "edited.bin", "f32")
    for flags in ([], ["--prefill"]):
        assert relative_error(barellm_logits(model, IDS, "--kv", "f32", *flags), changed) < 1e-4


def test_the_file_stacks_the_experts_and_keeps_the_router_in_f32(tmp_path):
    config = CONFIGS["qwen3_moe"]
    tensors = moe_tensors(config)
    model = convert(checkpoint(tmp_path, "qwen3_moe", config, tensors), tmp_path / "m.bin",
                    "bf16")
    header, arrays = read_raw(model)[1:3]
    stored = json.loads(header["__metadata__"]["barellm.config"])
    assert stored["architecture"] == "qwen3_moe" and stored["qk_norm"] is True
    assert (stored["experts"], stored["experts_per_token"], stored["moe_hidden_dim"],
            stored["norm_topk_prob"], stored["dense_layers"]) == (12, 3, 20, False, [1])
    assert header["layers.0.router"]["dtype"] == "F32"
    assert np.array_equal(arrays["layers.0.router"], tensors["model.layers.0.mlp.gate.weight"][1])
    assert header["layers.0.experts.w1"]["shape"] == [12 * 20, 40]
    assert header["layers.0.experts.w2"]["shape"] == [12 * 40, 20]
    assert header["layers.0.experts.w1"]["dtype"] == "BF16"
    assert "layers.0.w1" not in header and "layers.1.w1" in header
    assert "layers.1.router" not in header and "layers.1.experts.w1" not in header
    f32 = convert(checkpoint(tmp_path, "qwen3_moe", config, tensors), tmp_path / "f.bin", "f32")
    arrays = read_raw(f32)[2]
    for e in (0, 5, 11):
        for short, hf, rows in (("w3", "up_proj", 20), ("w2", "down_proj", 40)):
            part = arrays[f"layers.2.experts.{short}"][e * rows:(e + 1) * rows]
            assert np.array_equal(part, tensors[f"model.layers.2.mlp.experts.{e}.{hf}.weight"][1])


def test_info_shows_the_experts(tmp_path):
    model = convert(checkpoint(tmp_path, "qwen3_moe"), tmp_path / "m.bin", "f32")
    result = barellm("info", model)
    assert result.returncode == 0, result.stderr
    c = CONFIGS["qwen3_moe"]
    assert "experts         12, 3 active per token" in result.stdout
    dim, width, layers = c["hidden_size"], c["moe_intermediate_size"], 2  # sparse layers
    total = int(result.stdout.split("parameters      ")[1].split()[0])
    active = int(result.stdout.split("active parameters ")[1].split()[0])
    assert total - active == layers * (12 - 3) * 3 * dim * width
    # bench's bytes per token: the dense model's less the experts not chosen (f32 matrices).
    read = int(result.stdout.split("weight bytes read per token ")[1].split()[0])
    file_matrices = sum(int(line.split()[2]) for line in
                        result.stdout.split("matrix types")[1].splitlines()[1:]
                        if line.startswith("                F"))
    norms = 4 * (2 * dim * 3 + dim + 2 * 18 * 3 + layers * 12 * dim)  # + q/k norms, routers
    embedding = 4 * c["vocab_size"] * dim  # read a row at a time, not counted
    assert read == file_matrices - embedding - layers * (12 - 3) * 3 * 4 * dim * width + norms


@pytest.mark.parametrize("model_type,message", [
    ("qwen2_moe", "shared expert"),
    ("deepseek_v3", "shared experts"),
])
def test_other_mixtures_of_experts_are_refused(tmp_path, model_type, message):
    config = {**CONFIGS["mixtral"], "model_type": model_type}
    hf = make_checkpoint(str(tmp_path / "hf"), config, moe_tensors(CONFIGS["mixtral"]))
    result = run(CONVERT, hf, "-o", tmp_path / "m.bin")
    assert result.returncode == 1 and message in result.stderr
    assert result.stderr.count("\n") == 1


def test_a_missing_expert_is_named(tmp_path):
    tensors = moe_tensors(CONFIGS["mixtral"])
    del tensors["model.layers.2.block_sparse_moe.experts.7.w3.weight"]
    hf = checkpoint(tmp_path, "mixtral", tensors=tensors)
    result = run(CONVERT, hf, "-o", tmp_path / "m.bin")
    assert result.returncode == 1
    assert "missing tensors: model.layers.2.block_sparse_moe.experts.7.w3.weight" in result.stderr


@pytest.mark.parametrize("edit,message", [
    ({"experts_per_token": 9}, "'experts_per_token' = 9 is outside [1, 8]"),
    ({"dense_layers": [3]}, "'dense_layers' holds 3"),
    ({"dense_layers": [0, 0]}, "'dense_layers' holds 0"),
    ({"experts": None}, "'experts_per_token' needs 'experts'"),
])
def test_the_loader_refuses_bad_expert_fields(tmp_path, edit, message):
    model = convert(checkpoint(tmp_path, "mixtral"), tmp_path / "m.bin", "f32")
    header, arrays = read_raw(model)[1:3]
    config = json.loads(header["__metadata__"]["barellm.config"])
    config.update(edit)
    config = {key: value for key, value in config.items() if value is not None}
    edited = str(tmp_path / "edited.bin")
    write_safetensors(edited, {name: (header[name]["dtype"], array)
                               for name, array in arrays.items()},
                      {**header["__metadata__"], "barellm.config": json.dumps(config)})
    result = barellm("info", edited)
    assert result.returncode != 0 and message in result.stderr
    assert result.stderr.count("\n") == 1


# ---- GGUF input (llama.cpp's names: a llama file with experts, qwen3moe) ----------------

GGUF_CONFIGS = {
    "mixtral": CONFIGS["mixtral"],
    # llama.cpp's qwen3moe: every layer sparse, the chosen weights rescaled.
    "qwen3_moe": {**CONFIGS["qwen3_moe"], "mlp_only_layers": [], "norm_topk_prob": True},
}


@pytest.mark.parametrize("name", sorted(GGUF_CONFIGS))
@pytest.mark.parametrize("gguf_type,dtype", [("f32", "f32"), ("f16", "f16")])
def test_a_gguf_file_converts_to_the_checkpoints_file(tmp_path, name, gguf_type, dtype):
    """The checkpoint written as llama.cpp's GGUF (scripts/gguf_from_hf.py: Mixtral as llama
    with expert_count, q and k rows interleaved; Qwen3-MoE as qwen3moe; the experts stacked
    in ffn_*_exps, the routers in ffn_gate_inp) converts back to the checkpoint's own file:
    config, every tensor, logits."""
    gguf = pytest.importorskip("gguf", reason="pip package gguf missing")
    from test_convert_gguf import gguf_from_hf
    config = GGUF_CONFIGS[name]
    hf = checkpoint(tmp_path, name, config)
    source = gguf_from_hf(hf, tmp_path / "m.gguf", "--type", gguf_type)
    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    assert arch == {"mixtral": "llama", "qwen3_moe": "qwen3moe"}[name]
    assert reader.fields[f"{arch}.expert_count"].contents() == reference.hf_experts(config)[
        "experts"]
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    experts, width = (reference.hf_experts(config)[k] for k in ("experts", "moe_hidden_dim"))
    assert shapes["blk.0.ffn_gate_exps.weight"] == (config["hidden_size"], width, experts)
    assert shapes["blk.0.ffn_down_exps.weight"] == (width, config["hidden_size"], experts)
    result = run(CONVERT, source, "-o", tmp_path / "gguf.bin")
    assert result.returncode == 0, result.stderr
    from_gguf = str(tmp_path / "gguf.bin")
    direct = convert(hf, tmp_path / "hf.bin", dtype)
    header_a, a = read_raw(from_gguf)[1:3]
    header_b, b = read_raw(direct)[1:3]
    config_a = json.loads(header_a["__metadata__"]["barellm.config"])
    config_b = json.loads(header_b["__metadata__"]["barellm.config"])
    for key in ("architecture", "experts", "experts_per_token", "moe_hidden_dim",
                "norm_topk_prob", "qk_norm", "dim", "hidden_dim", "head_dim"):
        assert config_a.get(key) == config_b.get(key), key
    assert sorted(a) == sorted(b)
    for tensor in a:
        assert np.array_equal(a[tensor], b[tensor]), tensor
    assert np.array_equal(barellm_logits(from_gguf, IDS, "--kv", "f32"),
                          barellm_logits(direct, IDS, "--kv", "f32"))


def test_a_gguf_file_with_shared_experts_is_refused(tmp_path):
    from test_convert_gguf import gguf_from_hf
    hf = checkpoint(tmp_path, "mixtral")
    source = gguf_from_hf(hf, tmp_path / "m.gguf", "--type", "f32")
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(source))
    writer = gguf.GGUFWriter(str(tmp_path / "shared.gguf"), "llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        writer.add_key_value(field.name, field.contents(), field.types[0],
                             field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY
                             else None)
    writer.add_uint32("llama.expert_shared_count", 1)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.asarray(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = run(CONVERT, tmp_path / "shared.gguf", "-o", tmp_path / "m.bin")
    assert result.returncode == 1
    assert "'llama.expert_shared_count': shared experts are not supported" in result.stderr


def test_the_ladder_refuses_a_mixture_of_experts(tmp_path):
    """The ladder's rungs are dense forward passes: one line, no crash."""
    model = convert(checkpoint(tmp_path, "mixtral"), tmp_path / "m.bin", "f32")
    result = barellm("ladder", model, "-n", "4")
    assert result.returncode == 1
    assert result.stderr.strip().endswith("ladder runs dense models; mixtral has a mixture of "
                                          "experts (use bench)")
    assert result.stderr.count("\n") == 1


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_an_exact_tie_goes_to_the_lower_index(tmp_path, mode, monkeypatch):
    """Experts 0 and 1 of every Mixtral router have the same row: their probabilities are
    equal for every token, and where only one of them is among the top 2 it is expert 0 in
    the reference (a stable sort) and in barellm (torch.topk's order among exact ties is not
    specified: on the CPU it gave [0.1, 0.3, 0.3, 0.2, 0.3] the indices 2 and 4)."""
    config = CONFIGS["mixtral"]
    tensors = moe_tensors(config, near_tie=False)
    for name in list(tensors):
        if name.endswith("block_sparse_moe.gate.weight"):
            router = tensors[name][1]
            router[1] = router[0]
    hf = checkpoint(tmp_path, "mixtral", config, tensors)
    chosen = []
    route = reference.route

    def recording_route(config, logits):
        experts, weights = route(config, logits)
        chosen.append(set(experts.tolist()) & {0, 1})
        return experts, weights

    monkeypatch.setattr(reference, "route", recording_route)
    want = reference.logits_for(hf, IDS)
    assert {0} in chosen  # the tie decided some token's routing
    model = convert(hf, tmp_path / "model.bin", "f32")
    flags = ["--kv", "f32"] + (["--prefill"] if mode == "prefill" else [])
    assert relative_error(barellm_logits(model, IDS, *flags), want) < 1e-4

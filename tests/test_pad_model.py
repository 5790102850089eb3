"""scripts/pad_model.py: the padded checkpoint computes the same logits as the original,
by the float64 reference, with dense rows; what it cannot pad is refused in one line."""

import json
import os
import sys

import numpy as np
import pytest

from convert_testlib import REPO, TINY_CONFIG, make_checkpoint, run, tiny_tensors

sys.path.insert(0, os.path.join(REPO, "reference"))
import model as reference  # noqa: E402

PAD_MODEL = os.path.join(REPO, "scripts", "pad_model.py")
TOKENS = [1, 5, 17, 33, 2, 8, 39, 12, 26, 4, 30]

# Sizes off every power of two: dim 16 -> 43, head_dim 4 -> 12 (three times), ffn 24 -> 37.
SIZES = ["--dim", "43", "--head-dim", "12", "--ffn", "37"]


def llama3_tied_config():
    """TINY_CONFIG with tied embeddings and llama3 RoPE scaling (frequencies rescaled by
    wavelength, which padding must keep)."""
    return {**TINY_CONFIG, "tie_word_embeddings": True, "rope_theta": 500000.0,
            "max_position_embeddings": 64,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 8}}


def bf16_tensors(config):
    """tiny_tensors(config) stored as BF16 (each float32 cut to its upper 16 bits)."""
    return {name: ("BF16", (array.view("<u4") >> 16).astype("<u2"))
            for name, (_, array) in tiny_tensors(config).items()}


@pytest.mark.parametrize("config, dtype", [(TINY_CONFIG, "F32"), (llama3_tied_config(), "F32"),
                                           (TINY_CONFIG, "BF16")],
                         ids=["untied", "tied-llama3", "bf16"])
def test_the_padded_model_computes_the_same_logits(tmp_path, config, dtype):
    tensors = bf16_tensors(config) if dtype == "BF16" else tiny_tensors(config)
    source = make_checkpoint(str(tmp_path / "model"), config, tensors)
    padded = str(tmp_path / "padded")
    result = run(PAD_MODEL, source, "-o", padded, *SIZES, "--seed", "3")
    assert result.returncode == 0, result.stderr
    with open(os.path.join(padded, "config.json")) as f:
        cfg = json.load(f)
    assert (cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]) == (43, 12, 37)
    assert cfg["tie_word_embeddings"] is False
    expected = reference.logits_for(source, TOKENS)
    got = reference.logits_for(padded, TOKENS)
    assert expected.std() > 0.5  # logits that tell tokens apart
    np.testing.assert_allclose(got, expected, rtol=0, atol=2e-5)


def dense_rows(matrix):
    """Whether every row of `matrix` that is not all zeros has no zero."""
    rows = matrix[np.abs(matrix).max(axis=1) > 0]
    return len(rows) > 0 and bool(np.all(np.abs(rows).min(axis=1) > 0))


def test_every_padded_row_is_dense(tmp_path):
    source = make_checkpoint(str(tmp_path / "model"))
    padded = str(tmp_path / "padded")
    assert run(PAD_MODEL, source, "-o", padded, *SIZES).returncode == 0
    _, weights = reference.load(padded)
    # Along the residual stream no matrix has zeros: rows of the matrices reading it,
    # columns of those writing it (the zero rows and columns are the padded heads and
    # feed-forward).
    for name in ("token_embedding", "layers.0.wq", "layers.1.wk", "layers.1.w1", "output"):
        assert dense_rows(weights[name]), name
    for name in ("layers.0.wo", "layers.1.w2"):
        assert dense_rows(weights[name].T), name


def one_line_refusal(result, message):
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr, result.stderr


def test_what_cannot_be_padded_is_refused_in_one_line(tmp_path):
    source = make_checkpoint(str(tmp_path / "model"))
    out = str(tmp_path / "out")
    one_line_refusal(run(PAD_MODEL, source, "-o", out, "--dim", "8"),
                     "--dim 8 is smaller than the model's 16")
    one_line_refusal(run(PAD_MODEL, source, "-o", out, "--head-dim", "6"),
                     "--head-dim 6 is not a multiple of the model's 4")
    one_line_refusal(run(PAD_MODEL, source, "-o", out, "--head-dim", "0"),
                     "--head-dim 0 is not a multiple")
    one_line_refusal(run(PAD_MODEL, source, "-o", out, "--ffn", "20"),
                     "--ffn 20 is smaller than the model's 24")
    qwen3 = {**TINY_CONFIG, "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}
    qwen3_dir = make_checkpoint(str(tmp_path / "qwen3"), qwen3, tiny_tensors(TINY_CONFIG))
    one_line_refusal(run(PAD_MODEL, qwen3_dir, "-o", out), "model_type 'qwen3'")
    one_line_refusal(run(PAD_MODEL, source, "-o", out, "--seed", "-1"), "--seed -1 is negative")
    one_line_refusal(run(PAD_MODEL, source, "-o", out, "--dim", "100000"),
                     "the padded model would hold")
    tensors = tiny_tensors(TINY_CONFIG)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    missing = make_checkpoint(str(tmp_path / "missing"), TINY_CONFIG, tensors)
    one_line_refusal(run(PAD_MODEL, missing, "-o", out),
                     "tensor 'model.layers.1.mlp.up_proj.weight' is missing")
    tensors = tiny_tensors(TINY_CONFIG)
    tensors["model.layers.0.input_layernorm.weight"] = ("F32", np.ones(15, "<f4"))
    bad_shape = make_checkpoint(str(tmp_path / "shape"), TINY_CONFIG, tensors)
    one_line_refusal(run(PAD_MODEL, bad_shape, "-o", out),
                     "tensor 'model.layers.0.input_layernorm.weight' is F32 [15], not")
    tensors = tiny_tensors(TINY_CONFIG)
    tensors["model.norm.weight"][1][3] = np.nan
    nan = make_checkpoint(str(tmp_path / "nan"), TINY_CONFIG, tensors)
    one_line_refusal(run(PAD_MODEL, nan, "-o", out),
                     "tensor 'model.norm.weight' holds a NaN or an infinity")
    # Nothing was left behind.
    assert sorted(os.listdir(tmp_path)) == ["missing", "model", "nan", "qwen3", "shape"]
    os.mkdir(out)
    one_line_refusal(run(PAD_MODEL, source, "-o", out), "exists")
    assert os.listdir(out) == []
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("a file, not a folder")
    one_line_refusal(run(PAD_MODEL, source, "-o", str(not_a_folder / "padded")),
                     f"{not_a_folder} is not a folder")


def test_the_output_folder_s_parents_are_made(tmp_path):
    source = make_checkpoint(str(tmp_path / "model"))
    padded = tmp_path / "a" / "b" / "padded"
    result = run(PAD_MODEL, source, "-o", str(padded))
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(padded)) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert os.listdir(padded.parent) == ["padded"]  # no temporary folder left beside it

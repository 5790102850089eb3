#!/usr/bin/env python3
"""Rewrite a small Llama checkpoint with wider rows: the same model, in shapes that
llama.cpp's super-block types quantize.

    python3 scripts/pad_model.py HF_DIR -o OUT_DIR [--dim 256] [--head-dim 32] [--ffn 256]
                                 [--seed 1]

`Q4_K`, `Q5_K`, `Q6_K` and `IQ4_XS` quantize rows in super-blocks of 256 values. The one
real pretrained model here, stories260K (../shared/README.md), has rows of 64 and 172, so
`llama-quantize` gives it fallback types only. This writes the same function with rows of
--dim and --ffn: its logits equal the original's to float32 rounding (the float64
reference, reference/model.py, on both), while every matrix row is dense, so that
quantizing it exercises the super-block types on a model whose text means something.

- The residual stream: zero-padded from dim to --dim and turned by a random orthogonal
  matrix R (numpy's Generator seeded with --seed), so that no row is mostly zeros. The
  embedding rows are R times the padded ones; the matrices writing into the stream
  (attention output, feed-forward down) are multiplied by R on the left.
- RMS norm: over --dim the mean square is dim/--dim times the old one. The epsilon is
  scaled by the same ratio and every norm weight becomes sqrt(dim/--dim), which gives back
  the old normalized stream (turned by R). The old norm weights, a diagonal that does not
  commute with R, are folded into the columns of the matrices that read the normed stream
  (q, k, v, gate, up, and the output projection, which is therefore never tied).
- Heads: head_dim d becomes --head-dim D, a multiple of d. Hugging Face's rotate-half RoPE
  turns element j with element j + d/2 at frequency theta^(-2j/d); they move to j*D/d and
  j*D/d + D/2, which turn at theta^(-2(j*D/d)/D), the same frequency. The other elements are
  zero. q is multiplied by sqrt(D/d), which undoes the attention's 1/sqrt(D) in place of
  1/sqrt(d). v keeps its elements first in each head; the attention output's columns follow.
- Feed-forward: zero rows of gate and up, zero columns of down (SiLU(0) * 0 = 0).

Plain Llama/Mistral checkpoints only: q/k/v or output biases, Qwen3's q/k norms, Gemma 3 and
mixtures of experts are refused. The config keeps everything else (RoPE base and scaling,
which depend on the frequencies alone) and the tokenizer files are copied. Matrices are
written as F32. OUT_DIR is written beside itself under a temporary name and renamed into
place at the end.
"""

import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "convert"))

from common import (ConvertError, OneLineParser, read_json, run_main,  # noqa: E402
                    stop_signals_held, umask_applied)
import convert  # noqa: E402
import dtypes  # noqa: E402
import safetensors_io as st  # noqa: E402

# Files of the checkpoint that are written anew rather than copied (and *.safetensors).
KEPT_OUT = ("config.json", "model.safetensors.index.json")
# The most parameters of a padded model: the whole model is built in memory in float64.
MAX_PARAMETERS = 1 << 27


def checked_config(hf_dir):
    """config.json of `hf_dir` and barellm's reading of it; refuses what padding does not
    keep the same function for."""
    cfg = read_json(os.path.join(hf_dir, "config.json"))
    convert.check_architecture(cfg)
    if cfg.get("model_type") not in ("llama", "mistral"):
        raise ConvertError(f"model_type '{cfg.get('model_type')}': only llama and mistral "
                           "checkpoints are padded (no biases, q/k norms or experts)")
    config = convert.model_config(cfg, None)
    if config.get("qkv_bias") or config.get("o_bias"):
        raise ConvertError("attention biases are not padded")
    return cfg, config


def check_sizes(config, dim, head_dim, ffn, seed):
    """Refuse target sizes that cannot hold the model, and a negative seed."""
    if seed < 0:
        raise ConvertError(f"--seed {seed} is negative")
    if dim < config["dim"]:
        raise ConvertError(f"--dim {dim} is smaller than the model's {config['dim']}")
    if ffn < config["hidden_dim"]:
        raise ConvertError(f"--ffn {ffn} is smaller than the model's {config['hidden_dim']}")
    if head_dim < config["head_dim"] or head_dim % config["head_dim"]:
        raise ConvertError(f"--head-dim {head_dim} is not a multiple of the model's "
                           f"{config['head_dim']} (RoPE's frequencies must stay the same)")
    attention = (2 * config["heads"] + 2 * config["kv_heads"]) * head_dim * dim
    parameters = (2 * config["vocab_size"] * dim + dim * dim
                  + config["layers"] * (attention + 3 * dim * ffn))
    if parameters > MAX_PARAMETERS:
        raise ConvertError(f"the padded model would hold {parameters} parameters; this tool is "
                           f"for small models (at most {MAX_PARAMETERS})")


def random_rotation(size, seed):
    """A random orthogonal size x size matrix (QR of a Gaussian one, signs fixed)."""
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((size, size)))
    return q * np.sign(np.diag(r))


def head_positions(head_dim, new_head_dim, rope):
    """Where element j of a head goes in the wider head: rotate-half pairs keep their
    frequency (j -> j*k, j + d/2 -> j*k + D/2); elements without RoPE stay first."""
    if not rope:
        return np.arange(head_dim)
    half, scale = head_dim // 2, new_head_dim // head_dim
    low = np.arange(half) * scale
    return np.concatenate([low, low + new_head_dim // 2])


def spread_heads(rows, heads, head_dim, new_head_dim, rope):
    """(heads*head_dim, n) -> (heads*new_head_dim, n), each head's rows at their new
    positions, zero rows elsewhere."""
    out = np.zeros((heads * new_head_dim, rows.shape[1]))
    positions = head_positions(head_dim, new_head_dim, rope)
    for head in range(heads):
        out[head * new_head_dim + positions] = rows[head * head_dim:(head + 1) * head_dim]
    return out


class Padding:
    """The maps between the old model's vectors and the new one's."""

    def __init__(self, config, dim, seed):
        self.dim, self.new_dim = config["dim"], dim
        self.rotation = random_rotation(dim, seed)

    def writes_stream(self, matrix):
        """A matrix whose output is the residual stream: R @ (rows padded)."""
        padded = np.zeros((self.new_dim, matrix.shape[1]))
        padded[:self.dim] = matrix
        return self.rotation @ padded

    def reads_normed_stream(self, matrix, norm_weight):
        """A matrix whose input is the normed stream: the norm weight folded into its
        columns, the columns padded, then @ R^T."""
        padded = np.zeros((matrix.shape[0], self.new_dim))
        padded[:, :self.dim] = matrix * norm_weight[None, :]
        return padded @ self.rotation.T


def pad_rows(matrix, rows):
    """`matrix` with zero rows added up to `rows`."""
    out = np.zeros((rows, matrix.shape[1]))
    out[:matrix.shape[0]] = matrix
    return out


def padded_tensors(tensors, config, dim, head_dim, ffn, seed):
    """{name: float64 array} of the padded model, Hugging Face names."""
    expected = convert.expected_tensors(config)

    def read(name):
        if name not in tensors:
            raise ConvertError(f"tensor '{name}' is missing")
        info, shape = tensors[name], expected[name][1]
        if info.dtype not in dtypes.STORAGE or info.shape != shape:
            raise ConvertError(f"tensor '{name}' is {info.dtype} {list(info.shape)}, not "
                               f"F32, F16 or BF16 {list(shape)}")
        values = dtypes.to_f32(st.map_tensor(info), info.dtype).astype(np.float64)
        if not np.isfinite(values).all():
            raise ConvertError(f"tensor '{name}' holds a NaN or an infinity")
        return values

    old_head_dim, heads, kv_heads = config["head_dim"], config["heads"], config["kv_heads"]
    pad = Padding(config, dim, seed)
    norm = np.full(dim, math.sqrt(config["dim"] / dim))
    embedding = read("model.embed_tokens.weight")
    out = {"model.embed_tokens.weight": pad.writes_stream(embedding.T).T}
    for layer in range(config["layers"]):
        p = f"model.layers.{layer}."
        attention_norm = read(p + "input_layernorm.weight")
        ffn_norm = read(p + "post_attention_layernorm.weight")
        q = spread_heads(read(p + "self_attn.q_proj.weight"), heads, old_head_dim, head_dim,
                         rope=True) * math.sqrt(head_dim / old_head_dim)
        k = spread_heads(read(p + "self_attn.k_proj.weight"), kv_heads, old_head_dim, head_dim,
                         rope=True)
        v = spread_heads(read(p + "self_attn.v_proj.weight"), kv_heads, old_head_dim, head_dim,
                         rope=False)
        o = spread_heads(read(p + "self_attn.o_proj.weight").T, heads, old_head_dim, head_dim,
                         rope=False).T
        out.update({
            p + "input_layernorm.weight": norm,
            p + "self_attn.q_proj.weight": pad.reads_normed_stream(q, attention_norm),
            p + "self_attn.k_proj.weight": pad.reads_normed_stream(k, attention_norm),
            p + "self_attn.v_proj.weight": pad.reads_normed_stream(v, attention_norm),
            p + "self_attn.o_proj.weight": pad.writes_stream(o),
            p + "post_attention_layernorm.weight": norm,
            p + "mlp.gate_proj.weight": pad.reads_normed_stream(
                pad_rows(read(p + "mlp.gate_proj.weight"), ffn), ffn_norm),
            p + "mlp.up_proj.weight": pad.reads_normed_stream(
                pad_rows(read(p + "mlp.up_proj.weight"), ffn), ffn_norm),
            p + "mlp.down_proj.weight": pad.writes_stream(
                pad_rows(read(p + "mlp.down_proj.weight").T, ffn).T),
        })
    output = embedding if config["tied_embeddings"] else read("lm_head.weight")
    out["model.norm.weight"] = norm
    out["lm_head.weight"] = pad.reads_normed_stream(output, read("model.norm.weight"))
    return out


def write_checkpoint(out_dir, cfg, tensors, hf_dir):
    """The tokenizer files, config.json and model.safetensors (F32) into `out_dir`."""
    for file_name in os.listdir(hf_dir):
        source = os.path.join(hf_dir, file_name)
        if os.path.isfile(source) and file_name not in KEPT_OUT and \
                not file_name.endswith(".safetensors"):
            shutil.copyfile(source, os.path.join(out_dir, file_name))
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    entries = [(name, "F32", array.shape) for name, array in tensors.items()]
    header, _ = st.encode_header(entries, None, alignment=8)
    with open(os.path.join(out_dir, "model.safetensors"), "wb") as f:
        f.write(header)
        for array in tensors.values():
            f.write(np.ascontiguousarray(array, dtype="<f4").tobytes())


def pad_model(hf_dir, out_dir, dim, head_dim, ffn, seed):
    """Write the padded checkpoint; returns a one-line summary."""
    cfg, config = checked_config(hf_dir)
    check_sizes(config, dim, head_dim, ffn, seed)
    if os.path.exists(out_dir):
        raise ConvertError(f"{out_dir} exists")
    tensors = padded_tensors(st.open_checkpoint(hf_dir), config, dim, head_dim, ffn, seed)
    new_cfg = {**cfg, "hidden_size": dim, "head_dim": head_dim, "intermediate_size": ffn,
               "rms_norm_eps": config["norm_eps"] * config["dim"] / dim,
               "tie_word_embeddings": False, "torch_dtype": "float32"}
    parent = os.path.dirname(os.path.abspath(out_dir))
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise ConvertError(f"{parent} is not a folder")
    staging = None
    try:
        os.makedirs(parent, exist_ok=True)
        with stop_signals_held():  # a signal right after mkdtemp still finds `staging` set
            staging = tempfile.mkdtemp(prefix=".pad_model-", dir=parent)
        os.chmod(staging, umask_applied(0o777))
        write_checkpoint(staging, new_cfg, tensors, hf_dir)
        os.rename(staging, out_dir)
    except OSError as e:
        raise ConvertError(f"cannot write {out_dir}: {e.strerror or e}") from e
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return (f"wrote {out_dir}: dim {config['dim']} -> {dim}, head_dim {config['head_dim']} -> "
            f"{head_dim}, feed-forward {config['hidden_dim']} -> {ffn}, rotation seed {seed}")


def main(argv=None):
    """CLI entry point; returns the exit status."""
    parser = OneLineParser(prog="pad_model.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("hf_dir", help="Hugging Face Llama checkpoint directory")
    parser.add_argument("-o", "--output", required=True, help="directory to create")
    parser.add_argument("--dim", type=int, default=256, help="new hidden size (default 256)")
    parser.add_argument("--head-dim", type=int, default=32,
                        help="new head_dim, a multiple of the old (default 32)")
    parser.add_argument("--ffn", type=int, default=256,
                        help="new intermediate size (default 256)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the rotation (default 1)")
    args = parser.parse_args(argv)
    try:
        print(pad_model(args.hf_dir, args.output, args.dim, args.head_dim, args.ffn, args.seed))
    except ConvertError as e:
        print(f"pad_model: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_main(main, "pad_model")

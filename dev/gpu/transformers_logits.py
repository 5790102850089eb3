#!/usr/bin/env python3
"""Logits of every position from Hugging Face transformers, to hold barellm against.

    python3 dev/gpu/transformers_logits.py HF_DIR --ids 1,2,3 -o OUT_FILE
    python3 dev/gpu/transformers_logits.py HF_DIR --ids 1,2,3 --compare BARELLM_LOGITS
                                           [--tolerance 1e-3] [--device cpu|cuda]

Loads HF_DIR with AutoModelForCausalLM (LlamaForCausalLM, MistralForCausalLM,
Qwen2ForCausalLM or Qwen3ForCausalLM) in float32 (f16/bf16 weights are upcast: barellm
computes in f32 too) on the CPU, or with --device cuda on the GPU (its matrix products in
full f32, TF32 off: a 7B model's 512 positions take seconds there, minutes on the CPU),
with eager attention (which applies the sliding window) and no KV cache, runs the ids as one
sequence and
writes the logits [len(ids), vocab] as raw little-endian float32, the layout of
build/dump_logits. With --compare it reads such a file instead of writing one, prints the
worst and median relative error over positions, and exits 1 when the worst exceeds the
tolerance. Needs torch and transformers (present on the GPU machines, not in CI).
"""

import argparse
import os
import sys

import numpy as np


def transformers_logits(hf_dir, ids, device="cpu"):
    """float32 logits [len(ids), vocab] of transformers' forward pass."""
    import torch
    import transformers

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    major = int(transformers.__version__.split(".")[0])
    minor = int(transformers.__version__.split(".")[1])
    # `dtype` replaced `torch_dtype` in transformers 4.56.
    dtype_arg = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    model = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, attn_implementation="eager", **{dtype_arg: torch.float32})
    model.to(device).eval()
    with torch.no_grad():
        output = model(torch.tensor([ids], dtype=torch.long, device=device), use_cache=False)
    return output.logits[0].float().cpu().numpy()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("hf_dir")
    parser.add_argument("--ids", required=True, help="comma-separated token ids")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("-o", "--output", help="write the logits here")
    target.add_argument("--compare", help="barellm logits file to compare against")
    parser.add_argument("--tolerance", type=float, default=1e-3)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    ids = [int(i) for i in args.ids.split(",")]
    if args.output and (os.path.isdir(args.output) or (os.path.exists(args.output) and (
            not os.path.isfile(args.output) or os.path.samefile(
                os.path.dirname(os.path.abspath(args.output)), args.hf_dir)))):
        parser.error(f"-o {args.output}: a directory, a device or a file of the checkpoint, "
                     "never replaced")
    want = transformers_logits(args.hf_dir, ids, args.device)
    if args.output:
        want.astype("<f4").tofile(args.output)
        return 0
    got = np.fromfile(args.compare, dtype="<f4").reshape(len(ids), -1)
    if got.shape != want.shape:
        print(f"shape mismatch: barellm {got.shape}, transformers {want.shape}")
        return 1
    errors = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
    worst = int(np.nanargmax(errors)) if np.isfinite(errors).any() else 0
    agree = float((got.argmax(axis=1) == want.argmax(axis=1)).mean())
    ok = bool(np.isfinite(got).all()) and errors[worst] <= args.tolerance
    print(f"{'PASS' if ok else 'FAIL'} {args.hf_dir}: {len(ids)} positions, worst relative "
          f"error {errors[worst]:.2e} at position {worst}, median {np.median(errors):.2e}, "
          f"argmax agreement {agree:.1%} (tolerance {args.tolerance:g})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Tokenizer speed: barellm (build/tokenize_json) against the pip `tokenizers` package,
both on one thread, encoding a whole text file (default ../shared/eval/wiki.test.raw).

    python3 scripts/bench_tokenizer.py [--file FILE] [--repeats N]

Prints a markdown table of MB/s (best of N runs, encode time only) per tokenizer, and
checks that both produced the same ids."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"  # before importing tokenizers: one thread
import tokenizers  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(REPO, "..", "shared")
sys.path.insert(0, os.path.join(REPO, "convert"))
import spm  # noqa: E402


def tokenizer_files(workdir):
    """(name, tokenizer.json path) for the tokenizers in ../shared."""
    found = []
    for name, path in [("stories260K", "models/stories260K/tokenizer.json"),
                       ("smollm2-135m", "tokenizers/smollm2-135m/tokenizer.json")]:
        full = os.path.join(SHARED, path)
        if os.path.exists(full):
            found.append((name, full))
    llama2 = os.path.join(SHARED, "tokenizers/llama2/tokenizer.model")
    if os.path.exists(llama2):
        with open(llama2, "rb") as f:
            document = spm.tokenizer_json(spm.parse_model(f.read()))
        path = os.path.join(workdir, "llama2.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(document, f, ensure_ascii=False)
        found.append(("llama2", path))
    return found


def time_hf(path, text, repeats):
    tokenizer = tokenizers.Tokenizer.from_file(path)
    best, ids = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        best = min(best, time.perf_counter() - start)
    return best, ids


def time_barellm(tool, path, text_file, repeats):
    best, ids = float("inf"), None
    for _ in range(repeats):
        result = subprocess.run([tool, "--time", path, text_file], capture_output=True,
                                text=True, check=True)
        seconds = float(result.stderr.split()[0])
        best, ids = min(best, seconds), json.loads(result.stdout)
    return best, ids


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=os.path.join(SHARED, "eval", "wiki.test.raw"))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tool = os.path.join(REPO, os.environ.get("BARELLM_BUILD", "build"), "tokenize_json")
    if not os.path.exists(args.file):
        sys.exit(f"bench_tokenizer: {args.file} not found (../shared is absent)")
    with open(args.file, encoding="utf-8") as f:
        text = f.read()
    megabytes = len(text.encode("utf-8")) / 1e6
    print(f"| tokenizer | pip tokenizers MB/s | barellm MB/s | speed-up | same ids |")
    print(f"| --- | ---: | ---: | ---: | --- |")
    with tempfile.TemporaryDirectory() as workdir:
        for name, path in tokenizer_files(workdir):
            hf_seconds, hf_ids = time_hf(path, text, args.repeats)
            our_seconds, our_ids = time_barellm(tool, path, args.file, args.repeats)
            print(f"| {name} | {megabytes / hf_seconds:.2f} | {megabytes / our_seconds:.2f} | "
                  f"{hf_seconds / our_seconds:.1f}x | {'yes' if hf_ids == our_ids else 'NO'} |")
    print(f"\n{os.path.basename(args.file)}: {megabytes:.2f} MB, one thread each, "
          f"best of {args.repeats}, encode time only")


if __name__ == "__main__":
    main()

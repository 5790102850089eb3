"""Hostile inputs to the command line: JSON nested too deep, token ids outside the model's
vocabulary, a standard output that cannot be written, files that are not regular files,
requests too large for memory, weights that overflow in the forward pass and more threads
than the process may start. Each is refused with one line naming the problem and a
non-zero exit: never a signal, a hang, or exit 0."""

import json
import os
import re
import resource
import subprocess

import numpy as np
import pytest

from convert_testlib import BUILD, REPO, tiny_tokenizer_json, write_safetensors
from test_cli import BARELLM, assert_refused, barellm

with open(os.path.join(REPO, "tests", "data", "chat_templates.json"), encoding="utf-8") as f:
    LLAMA2_CHAT = next(e for e in json.load(f) if e["name"] == "llama2-chat")["chat_template"]

DEPTH = 100_000  # far past the nesting limit (src/util/json.h)
DEEP_ARRAY = "[" * DEPTH + "]" * DEPTH

# A tiny model in barellm's own format: dim 8, 1 layer, the 40 ids of tiny_tokenizer_json().
CONFIG = {"architecture": "llama", "dim": 8, "hidden_dim": 12, "layers": 1, "heads": 2,
          "kv_heads": 1, "head_dim": 4, "vocab_size": 40, "max_context": 64,
          "rope_theta": 10000.0, "norm_eps": 1e-5, "tied_embeddings": True, "bos_id": 1,
          "eos_ids": [2], "add_bos": True, "weight_dtype": "F32"}


def write_model(path, config=None, tokenizer=None, metadata=None, weight=0.01):
    """A barellm weight file whose weights all equal `weight`; `config` is a dict,
    `tokenizer` a dict or the text of a tokenizer.json, `metadata` more metadata entries."""
    config = CONFIG if config is None else config
    tokenizer = tiny_tokenizer_json() if tokenizer is None else tokenizer
    dim, hidden, vocab = config["dim"], config["hidden_dim"], config["vocab_size"]
    q_dim = config["heads"] * config["head_dim"]
    kv_dim = config["kv_heads"] * config["head_dim"]

    def filled(*shape):
        return ("F32", np.full(shape, weight, dtype="<f4"))

    tensors = {"token_embedding": filled(vocab, dim)}
    for layer in range(config["layers"]):
        p = f"layers.{layer}."
        tensors.update({p + "attn_norm": filled(dim), p + "wq": filled(q_dim, dim),
                        p + "wk": filled(kv_dim, dim), p + "wv": filled(kv_dim, dim),
                        p + "wo": filled(dim, q_dim), p + "ffn_norm": filled(dim),
                        p + "w1": filled(hidden, dim), p + "w3": filled(hidden, dim),
                        p + "w2": filled(dim, hidden)})
    tensors["final_norm"] = filled(dim)
    write_safetensors(path, tensors, {
        "barellm.format": "1", "barellm.config": json.dumps(config),
        "barellm.tokenizer": tokenizer if isinstance(tokenizer, str) else json.dumps(tokenizer),
        **(metadata or {})})
    return path


def write_raw_header(path, header_text):
    """[u64 length][header_text padded to 8 bytes][16 data bytes]."""
    text = header_text.encode() + b" " * (-len(header_text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"\x01" * 16)
    return path


@pytest.fixture
def model(tmp_path):
    return write_model(tmp_path / "tiny.bin")


def test_the_tiny_model_works(model):
    ids = barellm("tokenize", model, "-p", "abc")
    assert ids.returncode == 0, ids.stderr
    assert barellm("detokenize", model, "-p", ids.stdout).stdout == "abc\n"


# ------------------------------------------------------------------ JSON nested too deep

def test_a_deep_safetensors_header_is_refused(tmp_path):
    header = '{"t": {"dtype": "F32", "shape": ' + DEEP_ARRAY + ', "data_offsets": [0, 4]}}'
    assert_refused(barellm("info", write_raw_header(tmp_path / "deep.bin", header)),
                   "safetensors header: JSON nested deeper than 64 levels")


def test_a_deep_config_is_refused(tmp_path):
    config = '{"architecture": ' + DEEP_ARRAY + "}"
    header = json.dumps({"__metadata__": {"barellm.format": "1", "barellm.config": config}})
    assert_refused(barellm("info", write_raw_header(tmp_path / "deep.bin", header)),
                   "barellm.config: JSON nested deeper than 64 levels")


@pytest.mark.parametrize("section", ["normalizer", "pre_tokenizer", "decoder"])
def test_a_deep_tokenizer_is_refused(tmp_path, section):
    # Sequences inside Sequences: the components are built recursively.
    key = {"normalizer": "normalizers", "pre_tokenizer": "pretokenizers",
           "decoder": "decoders"}[section]
    opening = '{"type": "Sequence", "%s": [' % key
    deep = opening * DEPTH + "]}" * DEPTH
    document = json.dumps(tiny_tokenizer_json()).replace('"%s": ' % section,
                                                         '"%s": %s, "unused": ' % (section, deep),
                                                         1)
    path = write_model(tmp_path / "deep.bin", tokenizer=document)
    assert_refused(barellm("tokenize", path, "-p", "abc"),
                   "tokenizer.json: JSON nested deeper than 64 levels")


def test_a_deep_detokenize_argument_is_refused(model):
    assert_refused(barellm("detokenize", model, "-p", "[" * 50_000 + "]" * 50_000),
                   "detokenize: -p: JSON nested deeper than 64 levels")


def test_messages_quote_only_an_excerpt_of_a_value(tmp_path, model):
    huge = "x" * 1_000_000
    config = dict(CONFIG, architecture=huge)
    result = barellm("info", write_model(tmp_path / "arch.bin", config=config))
    assert_refused(result, '"xxxx')
    assert len(result.stderr) < 400
    result = barellm("detokenize", model, "-p", json.dumps([[huge[:100_000]]]))
    assert_refused(result, "is not a token id")
    assert len(result.stderr) < 400


# ------------------------------------------------------------------ ids outside the vocabulary

@pytest.mark.parametrize("token_id", [2**31 - 1, 2**31 - 2, 50_000_000, 40])
def test_tokenizer_ids_beyond_the_vocab_size_are_refused(tmp_path, token_id):
    tokenizer = tiny_tokenizer_json()
    tokenizer["model"]["vocab"]["z"] = token_id
    path = write_model(tmp_path / "ids.bin", tokenizer=tokenizer)
    assert_refused(barellm("tokenize", path, "-p", "abc"),
                   f"vocab entry 'z' has id {token_id}, outside the vocabulary of 40 ids")


def test_added_tokens_beyond_the_vocab_size_are_refused(tmp_path):
    tokenizer = tiny_tokenizer_json()
    tokenizer["added_tokens"].append({"id": 40, "content": "<extra>", "special": True})
    path = write_model(tmp_path / "added.bin", tokenizer=tokenizer)
    assert_refused(barellm("run", path, "-p", "abc"),
                   "added token '<extra>' has id 40, outside the vocabulary of 40 ids")


# ------------------------------------------------------------------ standard output

def ppl_text(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("a bc def " * 100)
    return path


@pytest.mark.parametrize("args", [
    ["tokenize", "MODEL", "-p", "abc"],
    ["detokenize", "MODEL", "-p", "[5, 6]"],
    ["info", "MODEL"],
    ["run", "MODEL", "-p", "abc", "-n", "4", "--temp", "0"],
    ["ppl", "MODEL", "-f", "TEXT", "--ctx", "16", "--chunks", "2"],
    ["bench", "MODEL", "-p", "8", "-n", "4", "-r", "1"],
    ["ladder", "MODEL", "-n", "4"],
    ["--help"],
])
def test_a_full_standard_output_is_an_error(tmp_path, model, args):
    args = [str(model) if a == "MODEL" else str(ppl_text(tmp_path)) if a == "TEXT" else a
            for a in args]
    with open("/dev/full", "w") as full:
        result = subprocess.run([BARELLM, *args], stdout=full, stderr=subprocess.PIPE,
                                text=True, timeout=120)
    message = "barellm: cannot write to standard output: No space left on device"
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == message, result.stderr
    assert result.stderr.count("cannot write") == 1


# ------------------------------------------------------------------ files that are not files

def refused_at_once(*args):
    """barellm's result, failing the test if it takes more than a few seconds (a hang)."""
    return subprocess.run([BARELLM, *map(str, args)], capture_output=True, text=True,
                          timeout=20)


def test_a_fifo_as_the_model_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert_refused(refused_at_once("info", fifo), "not a regular file")


@pytest.mark.parametrize("name", ["directory", "/dev/zero", "fifo"])
def test_texts_must_be_regular_files(tmp_path, model, name):
    path = tmp_path / name
    if name == "directory":
        path.mkdir()
    elif name == "fifo":
        os.mkfifo(path)
    else:
        path = name
    assert_refused(refused_at_once("tokenize", model, "-f", path), f"{path}: not a regular file")
    assert_refused(refused_at_once("ppl", model, "-f", path), f"{path}: not a regular file")


def test_a_dash_reads_the_text_from_standard_input(model):
    from_stdin = barellm("tokenize", model, "-f", "-", input_text="a bc def")
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert from_stdin.stdout == barellm("tokenize", model, "-p", "a bc def").stdout


def test_a_text_longer_than_the_limit_is_refused(tmp_path, model):
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate(2**30 + 1)  # sparse: no disk space used
    assert_refused(barellm("tokenize", model, "-f", huge),
                   "longer than 1073741824 bytes, the most barellm reads as a text")


# ------------------------------------------------------------------ memory

def test_ppl_counts_the_logits_of_every_position_before_allocating(tmp_path):
    # A 2 MB model with a 256k vocabulary: ppl over 512k positions wants 512 GiB of logits.
    config = dict(CONFIG, dim=2, hidden_dim=2, heads=1, kv_heads=1, head_dim=2,
                  vocab_size=2**18, max_context=2**20)
    path = write_model(tmp_path / "wide.bin", config=config)
    text = tmp_path / "text.txt"
    text.write_text("c " * 300_000)
    assert_refused(barellm("ppl", path, "-f", text, "--ctx", str(2**19)),
                   "the KV cache, activations and logits of every position for a context of "
                   "524288 needs")


# ------------------------------------------------------------------ overflow in the forward pass

@pytest.mark.parametrize("simd", ["scalar", None])
@pytest.mark.parametrize("args, position", [
    (["run", "MODEL", "-p", "abc", "-n", "4", "--temp", "0"], 2),  # BOS, "▁ab", "c"
    (["run", "MODEL", "-p", "abc", "-n", "4", "--chat"], None),
    (["chat", "MODEL", "-n", "4"], None),
    (["ppl", "MODEL", "-f", "TEXT", "--ctx", "16", "--chunks", "2"], 8),
    (["bench", "MODEL", "-p", "8", "-n", "4", "-r", "1"], 7),
    (["bench", "MODEL", "-p", "0", "-n", "4", "-r", "1"], 0),
])
def test_weights_that_overflow_in_the_forward_pass_are_refused(tmp_path, args, position, simd):
    """Finite weights of 3e38: every product overflows to Inf, then NaN. The logits are not
    finite, and the command says so (at the position whose logits they are) instead of
    sampling from them; the RMSNorm must not turn the overflow into zeros either."""
    path = write_model(tmp_path / "overflow.bin", weight=3e38,
                       metadata={"barellm.chat_template": LLAMA2_CHAT})
    args = [str(path) if a == "MODEL" else str(ppl_text(tmp_path)) if a == "TEXT" else a
            for a in args] + ["--device", "cpu"] + (["--simd", simd] if simd else [])
    result = subprocess.run([BARELLM, *args], input="abc\n", capture_output=True, text=True,
                            timeout=120)
    where = r"\d+" if position is None else str(position)
    assert_refused(result, "")
    assert re.fullmatch(rf"barellm: logits at position {where} are not finite \(NaN or Inf\): "
                        r"the weights or the computation are broken\n", result.stderr), \
        result.stderr
    assert args[0] != "run" or result.stdout in ("", "abc")  # the prompt, and nothing drawn


# ------------------------------------------------------------------ threads

def limit_address_space():
    """1 GiB of address space and 8 MiB stacks: 1024 threads' stacks do not fit."""
    resource.setrlimit(resource.RLIMIT_STACK, (8 << 20, 8 << 20))
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.skipif("san" in os.path.basename(BUILD),
                    reason="AddressSanitizer reserves more address space than the limit")
@pytest.mark.parametrize("how", ["--threads", "OMP_NUM_THREADS"])
def test_more_threads_than_the_process_may_start_are_one_line(model, how):
    def barellm_limited(threads):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads)) if how != "--threads" else None
        return subprocess.run([BARELLM, "run", model, "-p", "abc", "-n", "2", "--temp", "0",
                               *(["--threads", str(threads)] if how == "--threads" else [])],
                              capture_output=True, text=True, timeout=120, env=env,
                              preexec_fn=limit_address_space)

    assert barellm_limited(2).returncode == 0  # the limit leaves room for a few threads
    result = barellm_limited(1024)
    assert "libgomp" not in result.stderr
    assert_refused(result, f"of the 1024 threads asked for ({how}) could be started: "
                           "Resource temporarily unavailable; ask for fewer with --threads")

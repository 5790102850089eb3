"""Gemma 3's tokenizer: the real 262,144-piece vocabulary of ../shared/tokenizers/gemma3
(a vocabulary-only GGUF), turned into tokenizer.json by the converter from the GGUF's
tokenizer.ggml.* keys and from a SentencePiece tokenizer.model, and run by barellm
(build/tokenize_json). References, computed during the test:
- the pip `sentencepiece` package, on a ModelProto built here from the GGUF's pieces, scores
  and types (BPE, byte fallback, no dummy prefix; user-defined pieces written with U+2581
  where llama.cpp writes spaces, as Gemma's tokenizer.model has them);
- llama.cpp's llama-tokenize on the GGUF itself, where it is built (LLAMA_TOKENIZE, else
  /work/llama/bin/llama-tokenize).
Checked: ids of the whole eval files and of slices and edge cases, the text decoded back, the
end-of-turn id, and hostile vocabularies refused."""

import json
import os
import subprocess
import sys

import pytest

from convert_testlib import BUILD, CONVERT, SHARED, need_shared

sys.path.insert(0, os.path.dirname(CONVERT))
from common import ConvertError  # noqa: E402  (convert/)
import gguf_file  # noqa: E402
import gguf_in  # noqa: E402
import gguf_tokenizer  # noqa: E402
import spm  # noqa: E402

VOCAB = os.path.join(SHARED, "tokenizers", "gemma3", "gemma3-vocab.gguf")
TOOL = os.path.join(BUILD, "tokenize_json")
LLAMA_TOKENIZE = os.environ.get("LLAMA_TOKENIZE", "/work/llama/bin/llama-tokenize")
EVAL_FILES = ["wiki.test.raw", "tinyshakespeare.txt", "tinystories_valid_sample.txt"]
VOCAB_SIZE = 262144
BOS, EOS, END_OF_TURN = 2, 1, 106

# Runs of spaces, tabs and newlines (user-defined pieces), HTML tags (user-defined), byte
# fallback (characters outside the vocabulary), U+2581 written in the text, no dummy prefix.
EDGE_TEXTS = [
    "", " ", "  ", "   leading", "trailing   ", "x   y    z", "a\tb\t\tc\t\t\t\td",
    "\n", "a\n\nb\n\n\nc" + "\n" * 40 + "d", " " * 70 + "|", "\t" * 40,
    "<table><tr><td>cell</td></tr></table>", "<h1>Title</h1>\n<p>text</p>",
    "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f600\U0001f917 \u0000\u0001\u007f",
    "\U0001d11e\U00010348 \u0fff\ue000 \U000e0001", "Hello world", " Hello", "\r\n\r\n",
    "\u2581already \u2581\u2581marked", "don't 3.14159 1,000,000 ..!?",
]


def need_tool():
    if not os.path.exists(TOOL):
        pytest.fail(f"{TOOL} is missing: run `make`")


@pytest.fixture(scope="module")
def keys():
    need_shared(VOCAB)
    return gguf_in.Keys(gguf_file.read_header(VOCAB).keys).tokenizer_keys()


@pytest.fixture(scope="module")
def gguf_json(keys, tmp_path_factory):
    """The converter's tokenizer.json of the GGUF vocabulary, as a file."""
    vocabulary = gguf_tokenizer.vocabulary(keys, VOCAB_SIZE)
    path = tmp_path_factory.mktemp("gemma") / "gguf_tokenizer.json"
    path.write_text(json.dumps(vocabulary.tokenizer, ensure_ascii=False), encoding="utf-8")
    return path


def sentencepiece_model(keys):
    """Bytes of Gemma's tokenizer.model as the GGUF describes it."""
    pb2 = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    proto = pb2.ModelProto()
    proto.trainer_spec.model_type = 2  # BPE
    proto.trainer_spec.byte_fallback = True
    tokens = keys["tokenizer.ggml.tokens"]
    proto.trainer_spec.unk_id = tokens.index("<unk>")
    proto.trainer_spec.bos_id = keys["tokenizer.ggml.bos_token_id"]
    proto.trainer_spec.eos_id = keys["tokenizer.ggml.eos_token_id"]
    proto.trainer_spec.pad_id = tokens.index("<pad>")
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = keys["tokenizer.ggml.add_space_prefix"]
    proto.normalizer_spec.remove_extra_whitespaces = False
    proto.normalizer_spec.escape_whitespaces = True
    for i, (token, score, kind) in enumerate(zip(tokens, keys["tokenizer.ggml.scores"],
                                                  keys["tokenizer.ggml.token_type"])):
        piece = proto.pieces.add()
        # llama.cpp writes user-defined spaces as spaces ("pre-normalized"), and <unk> as a
        # control token; SentencePiece has U+2581 and one piece of type UNKNOWN.
        piece.piece = token.replace(" ", "\u2581") if kind == spm.USER_DEFINED else token
        piece.score = score
        piece.type = spm.UNKNOWN if i == proto.trainer_spec.unk_id else kind
    return proto.SerializeToString()


@pytest.fixture(scope="module")
def sentencepiece_pair(keys, tmp_path_factory):
    """(sentencepiece processor, the converter's tokenizer.json of that tokenizer.model)."""
    sentencepiece = pytest.importorskip("sentencepiece")
    data = sentencepiece_model(keys)
    built = spm.tokenizer_json(spm.parse_model(data))
    path = tmp_path_factory.mktemp("gemma") / "model_tokenizer.json"
    path.write_text(json.dumps(built, ensure_ascii=False), encoding="utf-8")
    return sentencepiece.SentencePieceProcessor(model_proto=data), path


def eval_texts():
    """The whole eval files, then windows of each (starting anywhere, also mid-line)."""
    whole, windows = [], []
    for name in EVAL_FILES:
        path = os.path.join(SHARED, "eval", name)
        need_shared(path)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        whole.append(text)
        windows += [text[i:i + 700] for i in range(0, len(text), len(text) // 60)]
    return whole, windows


def barellm_encode(tokenizer_json, texts, tmp_path, special=True):
    need_tool()
    batch = tmp_path / "texts.json"
    batch.write_text(json.dumps(texts), encoding="utf-8")
    args = [TOOL, "--batch", *([] if special else ["--no-special"]), tokenizer_json, batch]
    result = subprocess.run(args, capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def barellm_decode(tokenizer_json, id_lists, tmp_path):
    batch = tmp_path / "ids.json"
    batch.write_text(json.dumps(id_lists), encoding="utf-8")
    result = subprocess.run([TOOL, "--decode", "--batch", tokenizer_json, batch],
                            capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def first_difference(ours, theirs):
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
              min(len(ours), len(theirs)))
    return f"at token {at}: ours {ours[at:at + 6]}, reference {theirs[at:at + 6]}"


def test_gguf_vocabulary_as_barellm_holds_it(keys):
    vocabulary = gguf_tokenizer.vocabulary(keys, VOCAB_SIZE)
    assert vocabulary.add_bos and vocabulary.bos_id == BOS
    assert vocabulary.eos_ids == [EOS, END_OF_TURN]
    tokenizer = vocabulary.tokenizer
    assert tokenizer["model"]["vocab"]["<end_of_turn>"] == END_OF_TURN
    assert tokenizer["model"]["byte_fallback"] and tokenizer["pre_tokenizer"] is None
    assert [n["type"] for n in tokenizer["normalizer"]["normalizers"]] == ["Replace"]
    added = {token["content"]: token for token in tokenizer["added_tokens"]}
    assert added["<start_of_turn>"]["special"] and not added["<start_of_turn>"]["normalized"]
    # User-defined pieces: matched in the raw text as llama.cpp does, never skipped.
    for piece in ("  ", "\n\n", "\t\t", "<table>"):
        assert not added[piece]["special"] and not added[piece]["normalized"], piece
    assert len(added) == 6249 + 165


def test_tokenizer_model_user_defined_pieces_are_normalized(sentencepiece_pair, keys):
    processor, path = sentencepiece_pair
    built = json.loads(path.read_text(encoding="utf-8"))
    added = {token["content"]: token for token in built["added_tokens"]}
    assert added["\u2581\u2581"]["normalized"] and not added["\u2581\u2581"]["special"]
    assert processor.piece_to_id("\u2581\u2581") == keys["tokenizer.ggml.tokens"].index("  ")


def test_gguf_vocabulary_matches_sentencepiece(gguf_json, sentencepiece_pair, tmp_path):
    """Except for U+2581 written in the text: llama.cpp (and so barellm on a GGUF) matches
    the user-defined runs of spaces in the raw text, where SentencePiece matches them after
    spaces became U+2581, so "\u2581\u2581" in the text is one piece for SentencePiece only
    (test_matches_llama_tokenize has such texts)."""
    processor, _ = sentencepiece_pair
    whole, windows = eval_texts()
    texts = whole + windows + [text for text in EDGE_TEXTS if "\u2581" not in text]
    ours = barellm_encode(gguf_json, texts, tmp_path)
    for text, ids in zip(texts, ours):
        want = processor.encode(text)
        assert ids == want, (text[:80], first_difference(ids, want))
    # Decoding gives back the text, as SentencePiece decodes it.
    decoded = barellm_decode(gguf_json, ours, tmp_path)
    for text, ids, back in zip(texts, ours, decoded):
        assert back == processor.decode(ids) == text


def test_tokenizer_model_matches_sentencepiece(sentencepiece_pair, tmp_path):
    processor, path = sentencepiece_pair
    _, windows = eval_texts()
    texts = windows + EDGE_TEXTS
    for special in (True, False):
        ours = barellm_encode(path, texts, tmp_path, special)
        for text, ids in zip(texts, ours):
            want = processor.encode(text)
        assert ids == want, (text[:80], first_difference(ids, want))


def test_known_difference_control_token_text(gguf_json, sentencepiece_pair, tmp_path):
    """Control tokens written in the text are tokens for barellm (as for Hugging Face and
    llama.cpp); SentencePiece spells them out."""
    processor, _ = sentencepiece_pair
    text = "<start_of_turn>user\nHi<end_of_turn>"
    [ours] = barellm_encode(gguf_json, [text], tmp_path)
    assert ours[0] == 105 and ours[-1] == END_OF_TURN
    assert END_OF_TURN not in processor.encode(text)


def llama_tokenize(path):
    """llama-tokenize's ids of the file at `path` (BOS first, special tokens parsed)."""
    result = subprocess.run([LLAMA_TOKENIZE, "-m", VOCAB, "-f", path, "--ids", "--log-disable"],
                            capture_output=True, timeout=600)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    return json.loads(result.stdout.decode().strip().splitlines()[-1])


def test_matches_llama_tokenize(gguf_json, tmp_path):
    if not os.access(LLAMA_TOKENIZE, os.X_OK):
        pytest.skip(f"{LLAMA_TOKENIZE} is not built (scripts/build_llamacpp.sh builds it)")
    whole, windows = eval_texts()
    texts = whole + windows[::8] + [t for t in EDGE_TEXTS if t] + [
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"]
    ours = barellm_encode(gguf_json, texts, tmp_path)
    for i, (text, ids) in enumerate(zip(texts, ours)):
        path = tmp_path / f"text{i}.txt"
        path.write_bytes(text.encode("utf-8"))
        theirs = llama_tokenize(path)
        assert [BOS] + ids == theirs, (text[:80], first_difference([BOS] + ids, theirs))


@pytest.mark.parametrize("change,message", [
    (lambda k: k["tokenizer.ggml.tokens"].__setitem__(5, "<eos>"), "is both id 1 and id 5"),
    (lambda k: k.__setitem__("tokenizer.ggml.scores", k["tokenizer.ggml.scores"][:-1]),
     "tokenizer.ggml.scores has 262143 entries for 262144 tokens"),
    (lambda k: k.__setitem__("tokenizer.ggml.token_type", [1, 3]),
     "tokenizer.ggml.token_type has 2 entries"),
    (lambda k: k.__setitem__("tokenizer.ggml.bos_token_id", VOCAB_SIZE),
     "bos_token_id 262144 is not below"),
    (lambda k: k.__setitem__("tokenizer.ggml.model", "t5"), "tokenizer.ggml.model 't5'"),
])
def test_hostile_vocabularies_are_refused(keys, change, message):
    hostile = {key: list(value) if isinstance(value, list) else value
               for key, value in keys.items()}
    change(hostile)
    with pytest.raises(ConvertError, match=message):
        gguf_tokenizer.vocabulary(hostile, VOCAB_SIZE)
    with pytest.raises(ConvertError, match="but the model only"):
        gguf_tokenizer.vocabulary(keys, VOCAB_SIZE - 1)

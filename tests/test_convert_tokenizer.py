"""Tests of the tokenizer side of the converter: the hand-written SentencePiece
protobuf reader, the tokenizer.json it builds (checked against the `sentencepiece` and
`tokenizers` packages), the supported-feature check and the add_bos rule."""

import json
import os
import random
import struct
import sys

import pytest

from convert_testlib import (CONVERT, LLAMA2_TOKENIZER, SHARED, SMOLLM2_TOKENIZER, STORIES,
                             need_shared)

sys.path.insert(0, os.path.dirname(CONVERT))
from common import ConvertError  # noqa: E402  (convert/)
import hf_tokenizer  # noqa: E402
import spm  # noqa: E402

SP_MODELS = [os.path.join(STORIES, "tokenizer.model"),
             os.path.join(LLAMA2_TOKENIZER, "tokenizer.model")]

FIXED_TEXTS = [
    "", " ", "  ", "\n", "Once upon a time, there was a little girl named Lily.",
    "Hello  world", "   three leading spaces", "trailing spaces   ", "tab\there\r\nCRLF",
    "a\n\nb", "日本語のテキスト", "émoji 🤗 and 😀😀", "123456 3.14159 1,000,000",
    "don't stop -- ok?!", "ℌ𝔢𝔩𝔩𝔬 Ω≈ç√", "\u00a0non-breaking\u2009thin", "▁already▁marked",
    "<unk-like> </not special>", "x" * 300, "Ünïcödé ÅÆØ ǅ ﬁ",
    "\u0000\u0001 control",
]


def corpus_texts():
    """Fixed edge cases, random strings, and lines/windows of the shared eval texts."""
    texts = list(FIXED_TEXTS)
    rng = random.Random(0)
    alphabet = list(" \t\n  abcXYZ019.,!?'\"-_éüß漢字かな😀🤗\u00a0▁<>/\\\r")
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
              for _ in range(500)]
    for name in ("wiki.test.raw", "tinyshakespeare.txt", "tinystories_valid_sample.txt"):
        path = os.path.join(SHARED, "eval", name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                raw = f.read(200000)
            texts += raw.split("\n")[:300]
            texts += [raw[i:i + 400] for i in range(0, len(raw), 1999)]
    return texts


def load_pair(model_path):
    """(sentencepiece processor, tokenizers.Tokenizer built from our tokenizer.json)."""
    sentencepiece = pytest.importorskip("sentencepiece")
    tokenizers = pytest.importorskip("tokenizers")
    need_shared(model_path)
    with open(model_path, "rb") as f:
        built = spm.tokenizer_json(spm.parse_model(f.read()))
    hf_tokenizer.check_supported(built)
    return (sentencepiece.SentencePieceProcessor(model_file=model_path),
            tokenizers.Tokenizer.from_str(json.dumps(built)))


@pytest.mark.parametrize("model_path", SP_MODELS)
def test_protobuf_reader_matches_protobuf(model_path):
    need_shared(model_path)
    pb2 = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    with open(model_path, "rb") as f:
        data = f.read()
    ours = spm.parse_model(data)
    proto = pb2.ModelProto()
    proto.ParseFromString(data)
    assert ours["pieces"] == [(p.piece, p.score, p.type) for p in proto.pieces]
    assert ours["model_type"] == proto.trainer_spec.model_type
    assert ours["unk_piece"] == proto.trainer_spec.unk_piece
    assert ours["add_dummy_prefix"] == proto.normalizer_spec.add_dummy_prefix


@pytest.mark.parametrize("model_path", SP_MODELS)
def test_encoding_matches_sentencepiece(model_path):
    processor, tokenizer = load_pair(model_path)
    mismatches = []
    for text in corpus_texts():
        ids = tokenizer.encode(text).ids
        if ids != processor.encode(text):
            mismatches.append(text)
        elif tokenizer.decode(ids) != processor.decode(ids):
            mismatches.append(("decode", text))
    assert mismatches == []


def test_stories260k_json_matches_shipped():
    need_shared(STORIES)
    tokenizers = pytest.importorskip("tokenizers")
    with open(os.path.join(STORIES, "tokenizer.model"), "rb") as f:
        built = spm.tokenizer_json(spm.parse_model(f.read()))
    with open(os.path.join(STORIES, "tokenizer.json"), encoding="utf-8") as f:
        shipped = json.load(f)
    # The shipped file was saved by LlamaTokenizerFast, which adds a BOS
    # TemplateProcessing post-processor; the converter itself leaves it null.
    assert {k: v for k, v in built.items() if k != "post_processor"} == \
        {k: v for k, v in shipped.items() if k != "post_processor"}
    ours = tokenizers.Tokenizer.from_str(json.dumps(built))
    theirs = tokenizers.Tokenizer.from_file(os.path.join(STORIES, "tokenizer.json"))
    for text in corpus_texts()[:800]:
        assert ours.encode(text, add_special_tokens=False).ids == \
            theirs.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("model_path", SP_MODELS)
def test_known_difference_special_token_text(model_path):
    """Hugging Face matches control tokens written in the text; SentencePiece does
    not. barellm follows Hugging Face."""
    processor, tokenizer = load_pair(model_path)
    text = "<s> hi </s>"
    ids = tokenizer.encode(text).ids
    assert ids[0] == 1 and ids[-1] == 2
    assert 1 not in processor.encode(text)


def test_llama2_json_shape():
    need_shared(LLAMA2_TOKENIZER)
    with open(os.path.join(LLAMA2_TOKENIZER, "tokenizer.model"), "rb") as f:
        built = spm.tokenizer_json(spm.parse_model(f.read()))
    model = built["model"]
    assert len(model["vocab"]) == 32000 and model["vocab"]["<0x0A>"] == 13
    assert model["byte_fallback"] and model["fuse_unk"] and model["unk_token"] == "<unk>"
    assert [t["content"] for t in built["added_tokens"]] == ["<unk>", "<s>", "</s>"]
    assert all(t["special"] for t in built["added_tokens"])
    assert model["merges"][0] == ["\u2581", "t"]
    assert hf_tokenizer.vocab_size(built) == 32000


def encode_field(number, wire, payload):
    """Protobuf-encode one field (varint payloads as int, others as bytes)."""
    def varint(value):
        out = b""
        while True:
            byte, value = value & 0x7F, value >> 7
            out += bytes([byte | (0x80 if value else 0)])
            if not value:
                return out
    key = varint(number << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    if wire == 2:
        return key + varint(len(payload)) + payload
    return key + payload


def piece_message(piece, score, kind):
    """An encoded ModelProto.SentencePiece."""
    return (encode_field(1, 2, piece.encode()) + encode_field(2, 5, struct.pack("<f", score))
            + encode_field(3, 0, kind))


def tiny_model(model_type, add_dummy_prefix, extra_pieces=()):
    """Bytes of a hand-built ModelProto with a few pieces."""
    pieces = [("<unk>", 0.0, spm.UNKNOWN), ("<s>", 0.0, spm.CONTROL),
              ("</s>", 0.0, spm.CONTROL), ("\u2581", -1.0, spm.NORMAL), ("a", -2.0, spm.NORMAL),
              ("\u2581a", -0.5, spm.NORMAL), *extra_pieces]
    data = b"".join(encode_field(1, 2, piece_message(*p)) for p in pieces)
    data += encode_field(2, 2, encode_field(3, 0, model_type) + encode_field(45, 2, b"<unk>"))
    data += encode_field(3, 2, encode_field(3, 0, int(add_dummy_prefix)))
    return data


def test_hand_built_model_options():
    built = spm.tokenizer_json(spm.parse_model(
        tiny_model(2, False, [("<user>", 0.0, spm.USER_DEFINED)])))
    assert built["model"]["merges"] == [["\u2581", "a"]]
    assert [n["type"] for n in built["normalizer"]["normalizers"]] == ["Replace"]
    assert [d["type"] for d in built["decoder"]["decoders"]] == \
        ["Replace", "ByteFallback", "Fuse"]
    assert built["added_tokens"][-1]["content"] == "<user>"
    assert built["added_tokens"][-1]["special"] is False
    with pytest.raises(ConvertError, match="SentencePiece model type Unigram"):
        spm.tokenizer_json(spm.parse_model(tiny_model(1, True)))
    with pytest.raises(ConvertError, match="truncated"):
        spm.parse_model(tiny_model(2, True)[:-3])


def test_smollm2_tokenizer_is_supported():
    need_shared(SMOLLM2_TOKENIZER)
    tokenizer, from_sentencepiece = hf_tokenizer.load_tokenizer(SMOLLM2_TOKENIZER)
    hf_tokenizer.check_supported(tokenizer)
    assert not from_sentencepiece and hf_tokenizer.vocab_size(tokenizer) == 49152
    assert hf_tokenizer.add_bos({"tokenizer_class": "GPT2Tokenizer"}, tokenizer, False) is False


def test_add_bos_rule():
    llama3_like = {"post_processor": {"type": "Sequence", "processors": [
        {"type": "ByteLevel"},
        {"type": "TemplateProcessing", "single": [
            {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}}]}]}}
    plain = {"post_processor": None}
    assert hf_tokenizer.add_bos({"add_bos_token": False}, llama3_like, False) is False
    assert hf_tokenizer.add_bos({"add_bos_token": True}, plain, False) is True
    assert hf_tokenizer.add_bos({"tokenizer_class": "LlamaTokenizerFast"}, plain, False)
    assert hf_tokenizer.add_bos(None, plain, True) is True
    assert hf_tokenizer.add_bos({"tokenizer_class": "PreTrainedTokenizerFast"},
                                llama3_like, False) is True
    assert hf_tokenizer.add_bos(None, plain, False) is False

"""SentencePiece `tokenizer.model` -> Hugging Face `tokenizer.json`, without protobuf.

The ModelProto is decoded with a minimal protobuf wire-format reader. The output is
what transformers' LlamaConverter (legacy=True) produces from a BPE model: a BPE model
with byte fallback whose merges come from SentencePieceExtractor (transformers 4.40),
a Prepend/Replace normalizer, no pre-tokenizer and a Replace/ByteFallback/Fuse/Strip
decoder. Control and unknown pieces become special added tokens, user-defined pieces
(Gemma's runs of spaces, tabs and newlines, HTML tags) plain added tokens: SentencePiece
matches them before BPE and never merges them.
"""

import struct

from common import ConvertError

# SentencePiece.Type values (sentencepiece_model.proto).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# TrainerSpec.ModelType values.
MODEL_TYPES = {1: "Unigram", 2: "BPE", 3: "Word", 4: "Char"}

# TrainerSpec.bos_id when the model does not set it.
DEFAULT_BOS_ID = 1

_WIRE_VARINT, _WIRE_FIXED64, _WIRE_BYTES, _WIRE_FIXED32 = 0, 1, 2, 5


def _varint(buf, pos):
    """Decode the varint at buf[pos]; return (value, next position)."""
    value, shift = 0, 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ConvertError("tokenizer.model: truncated or not a SentencePiece model")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def _fields(buf):
    """Yield (field number, wire type, value) for each field of a protobuf message.

    Varints yield an int, fixed32/fixed64 yield their raw bytes, length-delimited
    fields yield a bytes slice.
    """
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == _WIRE_VARINT:
            value, pos = _varint(buf, pos)
        elif wire in (_WIRE_FIXED64, _WIRE_FIXED32, _WIRE_BYTES):
            if wire == _WIRE_BYTES:
                size, pos = _varint(buf, pos)
            else:
                size = 8 if wire == _WIRE_FIXED64 else 4
            if pos + size > len(buf):
                raise ConvertError("tokenizer.model: truncated or not a SentencePiece model")
            value, pos = bytes(buf[pos:pos + size]), pos + size
        else:
            raise ConvertError(f"tokenizer.model: unsupported protobuf wire type {wire}")
        yield number, wire, value


def _text(value):
    """Decode a protobuf string field."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise ConvertError("tokenizer.model: a string field is not valid UTF-8") from None


def _piece(buf):
    """Decode a ModelProto.SentencePiece message into (piece, score, type)."""
    piece, score, kind = "", 0.0, NORMAL
    for number, wire, value in _fields(buf):
        if number == 1 and wire == _WIRE_BYTES:
            piece = _text(value)
        elif number == 2 and wire == _WIRE_FIXED32:
            (score,) = struct.unpack("<f", value)
        elif number == 3 and wire == _WIRE_VARINT:
            kind = value
    return piece, score, kind


def parse_model(data):
    """Decode the bytes of a SentencePiece ModelProto.

    Returns a dict with `pieces` (list of (piece, score, type) in id order),
    `model_type`, `unk_piece`, `bos_id` (TrainerSpec; None when negative: no BOS) and
    `add_dummy_prefix` (NormalizerSpec).
    """
    model = {"pieces": [], "model_type": 1, "unk_piece": "<unk>", "bos_id": DEFAULT_BOS_ID,
             "add_dummy_prefix": True}
    for number, wire, value in _fields(data):
        if wire != _WIRE_BYTES:
            continue
        if number == 1:
            model["pieces"].append(_piece(value))
        elif number == 2:
            for sub, sub_wire, sub_value in _fields(value):
                if sub == 3 and sub_wire == _WIRE_VARINT:
                    model["model_type"] = sub_value
                elif sub == 41 and sub_wire == _WIRE_VARINT:
                    # int32 as a varint: a negative id (-1: none) is 2^64 - |id|.
                    model["bos_id"] = sub_value if sub_value < 2**63 else None
                elif sub == 45 and sub_wire == _WIRE_BYTES:
                    model["unk_piece"] = _text(sub_value)
        elif number == 3:
            for sub, sub_wire, sub_value in _fields(value):
                if sub == 3 and sub_wire == _WIRE_VARINT:
                    model["add_dummy_prefix"] = bool(sub_value)
    if not model["pieces"]:
        raise ConvertError("tokenizer.model: no pieces (not a SentencePiece model?)")
    return model


def bpe_merges(pieces):
    """Merges as transformers' SentencePieceExtractor builds them.

    For every vocabulary piece, each split into two pieces that are both in the
    vocabulary is a merge (ordered by the ids of the parts); all merges are then
    stably sorted by the score of the merged piece, highest first. LlamaConverter
    scores the first three pieces 0.0.
    """
    vocab = {piece: i for i, (piece, _, _) in enumerate(pieces)}
    scores = {}
    for i, (piece, score, _) in enumerate(pieces):
        scores[piece] = 0.0 if i < 3 else score
    merges = []
    for piece, score in scores.items():
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2], reverse=True)
    return [[left, right] for left, right, _ in merges]


def _added_token(token_id, content, special, normalized):
    """One `added_tokens` entry of tokenizer.json."""
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": normalized, "special": special}


def tokenizer_json(model, user_defined_in_raw_text=False):
    """Build the tokenizer.json dict for a parsed SentencePiece BPE model.

    SentencePiece matches user-defined pieces in the normalized text, where a piece of
    spaces is written with the space marker ("\u2581\u2581"): they become `normalized`
    added tokens. llama.cpp's GGUF files write those pieces with spaces ("  ") and match
    every user-defined piece in the raw text: with `user_defined_in_raw_text` they are
    matched there too."""
    if model["model_type"] != 2:
        kind = MODEL_TYPES.get(model["model_type"], str(model["model_type"]))
        raise ConvertError(
            f"tokenizer.model: SentencePiece model type {kind} is not supported (only BPE)")
    pieces = model["pieces"]
    added = [_added_token(i, piece, kind != USER_DEFINED,
                          kind == USER_DEFINED and not user_defined_in_raw_text)
             for i, (piece, _, kind) in enumerate(pieces)
             if kind in (UNKNOWN, CONTROL, USER_DEFINED)]
    unk = next((piece for piece, _, kind in pieces if kind == UNKNOWN), model["unk_piece"])
    prefix = model["add_dummy_prefix"]
    normalizers = [{"type": "Prepend", "prepend": "\u2581"}] if prefix else []
    normalizers.append({"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"})
    decoders = [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                {"type": "ByteFallback"}, {"type": "Fuse"}]
    if prefix:
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": unk,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": True,
            "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {piece: i for i, (piece, _, _) in enumerate(pieces)},
            "merges": bpe_merges(pieces),
        },
    }

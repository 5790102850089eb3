"""A SentencePiece `tokenizer.model` (ModelProto, protobuf wire format) written from a
vocabulary of pieces, scores and types, without protobuf, for synthetic checkpoints whose
tokenizer comes from a GGUF file (synth.py): programs that read tokenizer.model, the
sentencepiece package or llama.cpp's converter, find the vocabulary there.

The model is BPE with byte fallback; its normalizer is the identity with whitespace
escaped to U+2581, no dummy prefix unless asked, and extra whitespace kept, which is how
SentencePiece encodes such a vocabulary (Gemma's, a GGUF's `tokenizer.ggml.*` of model
`llama`). convert/spm.py reads the fields written here.
"""

import struct

from common import ConvertError
import spm

BPE_MODEL_TYPE = 2  # TrainerSpec.ModelType
# Field numbers of sentencepiece_model.proto.
MODEL_PIECES, MODEL_TRAINER_SPEC, MODEL_NORMALIZER_SPEC = 1, 2, 3
PIECE_TEXT, PIECE_SCORE, PIECE_TYPE = 1, 2, 3
TRAINER_MODEL_TYPE, TRAINER_VOCAB_SIZE, TRAINER_BYTE_FALLBACK = 3, 4, 35
TRAINER_UNK_ID, TRAINER_BOS_ID, TRAINER_EOS_ID, TRAINER_PAD_ID = 40, 41, 42, 43
# The special pieces' texts, by which SentencePiece finds their ids.
TRAINER_UNK_PIECE, TRAINER_BOS_PIECE, TRAINER_EOS_PIECE, TRAINER_PAD_PIECE = 45, 46, 47, 48
NORMALIZER_NAME, NORMALIZER_ADD_DUMMY_PREFIX = 1, 3
NORMALIZER_REMOVE_EXTRA_WHITESPACES, NORMALIZER_ESCAPE_WHITESPACES = 4, 5
NO_ID = -1  # TrainerSpec's value for an id the model does not have
SPACE = "\u2581"  # what SentencePiece's normalizer makes of a space

_WIRE_VARINT, _WIRE_BYTES, _WIRE_FIXED32 = 0, 2, 5


def _varint(value):
    """The varint of a non-negative int, or of a negative int32 as protobuf writes it
    (its 64-bit two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number, wire):
    return _varint(number << 3 | wire)


def _integer(number, value):
    return _key(number, _WIRE_VARINT) + _varint(value)


def _message(number, payload):
    return _key(number, _WIRE_BYTES) + _varint(len(payload)) + payload


PIECE_TYPES = (spm.NORMAL, spm.UNKNOWN, spm.CONTROL, spm.USER_DEFINED, spm.UNUSED, spm.BYTE)


def _piece(text, score, kind):
    if kind not in PIECE_TYPES:
        raise ConvertError(f"token {text!r} has type {kind}, not a SentencePiece piece type")
    return (_message(PIECE_TEXT, text.encode("utf-8"))
            + _key(PIECE_SCORE, _WIRE_FIXED32) + struct.pack("<f", score)
            + _integer(PIECE_TYPE, kind))


def model_bytes(pieces, unk_id, bos_id, eos_id, pad_id, add_dummy_prefix=False):
    """The bytes of a tokenizer.model holding `pieces` ([(text, score, type)] in id order,
    types as spm.NORMAL .. spm.BYTE) and the special ids given (None: none).

    SentencePiece matches user-defined pieces in the normalized text, where a space is
    U+2581: their spaces are written so (llama.cpp's converter turns them back)."""
    pieces = [(text.replace(" ", SPACE) if kind == spm.USER_DEFINED else text, score, kind)
              for text, score, kind in pieces]
    trainer = (_integer(TRAINER_MODEL_TYPE, BPE_MODEL_TYPE)
               + _integer(TRAINER_VOCAB_SIZE, len(pieces))
               + _integer(TRAINER_BYTE_FALLBACK, 1))
    for id_field, piece_field, value in ((TRAINER_UNK_ID, TRAINER_UNK_PIECE, unk_id),
                                         (TRAINER_BOS_ID, TRAINER_BOS_PIECE, bos_id),
                                         (TRAINER_EOS_ID, TRAINER_EOS_PIECE, eos_id),
                                         (TRAINER_PAD_ID, TRAINER_PAD_PIECE, pad_id)):
        trainer += _integer(id_field, NO_ID if value is None else value)
        if value is not None:
            trainer += _message(piece_field, pieces[value][0].encode("utf-8"))
    normalizer = (_message(NORMALIZER_NAME, b"identity")
                  + _integer(NORMALIZER_ADD_DUMMY_PREFIX, int(add_dummy_prefix))
                  + _integer(NORMALIZER_REMOVE_EXTRA_WHITESPACES, 0)
                  + _integer(NORMALIZER_ESCAPE_WHITESPACES, 1))
    return (b"".join(_message(MODEL_PIECES, _piece(*piece)) for piece in pieces)
            + _message(MODEL_TRAINER_SPEC, trainer)
            + _message(MODEL_NORMALIZER_SPEC, normalizer))


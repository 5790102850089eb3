"""A GGUF file's `tokenizer.ggml.*` keys -> the Hugging Face tokenizer.json barellm reads.

Two tokenizer models:
- `llama` (SentencePiece-style BPE with byte fallback): tokens, scores and token types
  are a SentencePiece model's pieces, turned into tokenizer.json as for a checkpoint that
  ships only tokenizer.model (convert/spm.py).
- `gpt2` (byte-level BPE): tokens and merges, with the normalizer, pre-tokenizer and
  `ignore_merges` of the Hugging Face tokenizer that `tokenizer.ggml.pre` names
  (PRE_TOKENIZERS: the names whose tokenizer.json is known exactly); another name is
  refused.
Token types CONTROL, USER_DEFINED and UNKNOWN become added tokens (CONTROL ones special);
in a `llama` vocabulary all of them are matched in the raw text, as llama.cpp does.
Generation ends at the EOS, EOT and EOM ids the file names, and at Gemma's <end_of_turn>
control token, which llama.cpp recognises by its text.
"""

from typing import NamedTuple

from common import ConvertError
import spm

# llama.cpp's token types (gguf.TokenType), the same values as SentencePiece's piece types.
# (llama.cpp writes the USER_DEFINED ones with spaces where SentencePiece has U+2581.)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = spm.NORMAL, spm.UNKNOWN, spm.CONTROL, spm.USER_DEFINED
ADDED_TYPES = (UNKNOWN, CONTROL, USER_DEFINED)
# Control tokens that end a turn although no tokenizer.ggml.*_token_id names them.
END_OF_TURN_TOKENS = ("<end_of_turn>",)

GPT2_REGEX = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
# GPT-4o's (o200k; Phi-4-mini's tokenizer): a word's upper-case letters go with its
# lower-case ones, and a contraction with its word.
_WORD_CASES = (r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]")
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O_REGEX = (rf"[^\r\n\p{{L}}\p{{N}}]?{_WORD_CASES[0]}*{_WORD_CASES[1]}+{_CONTRACTION}|"
               rf"[^\r\n\p{{L}}\p{{N}}]?{_WORD_CASES[0]}+{_WORD_CASES[1]}*{_CONTRACTION}|"
               r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level(use_regex, trim_offsets=True):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": trim_offsets,
            "use_regex": use_regex}


def _split(regex):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated",
            "invert": False}


def _sequence(*parts):
    return {"type": "Sequence", "pretokenizers": list(parts)}


class PreTokenizer(NamedTuple):
    """What a byte-level BPE tokenizer.json holds besides its vocabulary and merges."""

    normalizer: object
    pre_tokenizer: dict
    ignore_merges: bool
    add_bos: bool  # when the GGUF does not say (tokenizer.ggml.add_bos_token)


# tokenizer.ggml.pre -> the Hugging Face tokenizer of that family (GPT-2, Llama 3, SmolLM,
# Qwen2, GPT-4o tokenizer.json files).
_LLAMA3 = PreTokenizer(None, _sequence(_split(LLAMA3_REGEX), _byte_level(False)), True, True)
PRE_TOKENIZERS = {
    "gpt-2": PreTokenizer(None, _byte_level(True), False, False),
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "smollm": PreTokenizer(None, _sequence({"type": "Digits", "individual_digits": True},
                                           _byte_level(True)), False, False),
    "qwen2": PreTokenizer({"type": "NFC"},
                          _sequence(_split(QWEN2_REGEX), _byte_level(False, False)), False,
                          False),
    "gpt-4o": PreTokenizer(None, _sequence(_split(GPT4O_REGEX), _byte_level(False)), False,
                           False),
}
BYTE_LEVEL_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                      "use_regex": True}


class Vocabulary(NamedTuple):
    """The tokenizer of a GGUF file, in barellm's terms."""

    tokenizer: dict  # tokenizer.json
    add_bos: bool
    bos_id: object  # int or None
    eos_ids: list


def _token_types(keys, count):
    types = keys.get("tokenizer.ggml.token_type", [NORMAL] * count)
    if len(types) != count:
        raise ConvertError(f"tokenizer.ggml.token_type has {len(types)} entries for "
                           f"{count} tokens")
    return types


def _check_unique(tokens):
    seen = {}
    for i, token in enumerate(tokens):
        if token in seen:
            raise ConvertError(f"tokenizer.ggml.tokens: {token!r} is both id {seen[token]} "
                               f"and id {i}")
        seen[token] = i


def _added_tokens(tokens, types):
    return [{"id": i, "content": token, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": kind != CONTROL, "special": kind == CONTROL}
            for i, (token, kind) in enumerate(zip(tokens, types)) if kind in ADDED_TYPES]


def _sentencepiece(keys, tokens, types):
    """tokenizer.json of a `llama` (SentencePiece) vocabulary."""
    scores = keys.get("tokenizer.ggml.scores", [0.0] * len(tokens))
    if len(scores) != len(tokens):
        raise ConvertError(f"tokenizer.ggml.scores has {len(scores)} entries for "
                           f"{len(tokens)} tokens")
    model = {"pieces": list(zip(tokens, scores, types)), "model_type": 2,
             "unk_piece": "<unk>",
             "add_dummy_prefix": bool(keys.get("tokenizer.ggml.add_space_prefix", True))}
    return spm.tokenizer_json(model, user_defined_in_raw_text=True), True


def _byte_level_bpe(keys, tokens, types):
    """tokenizer.json of a `gpt2` (byte-level BPE) vocabulary."""
    pre_name = keys.get("tokenizer.ggml.pre", "default")
    pre = PRE_TOKENIZERS.get(pre_name)
    if pre is None:
        raise ConvertError(f"tokenizer.ggml.pre '{pre_name}' is not supported (known: "
                           f"{', '.join(sorted(PRE_TOKENIZERS))})")
    merges = keys.get("tokenizer.ggml.merges")
    if merges is None:
        raise ConvertError("tokenizer.ggml.merges is missing (a gpt2 tokenizer needs it)")
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": _added_tokens(tokens, types),
        "normalizer": pre.normalizer, "pre_tokenizer": pre.pre_tokenizer,
        "post_processor": None, "decoder": BYTE_LEVEL_DECODER,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": pre.ignore_merges,
                  "vocab": {token: i for i, token in enumerate(tokens)},
                  "merges": merges},
    }
    return tokenizer, pre.add_bos


def _special_id(keys, name, vocab_size):
    token_id = keys.get(f"tokenizer.ggml.{name}_token_id")
    if token_id is not None and not 0 <= token_id < vocab_size:
        raise ConvertError(f"tokenizer.ggml.{name}_token_id {token_id} is not below the "
                           f"vocabulary size {vocab_size}")
    return token_id


def vocabulary(keys, vocab_size):
    """The Vocabulary of the `tokenizer.ggml.*` entries of `keys` (a dict of the GGUF's
    keys, values already type-checked) for a model of `vocab_size` ids."""
    tokens = keys.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ConvertError("GGUF key 'tokenizer.ggml.tokens' is missing")
    if not tokens:
        raise ConvertError("GGUF key 'tokenizer.ggml.tokens' is empty")
    if len(tokens) > vocab_size:
        raise ConvertError(f"the tokenizer has {len(tokens)} tokens but the model only "
                           f"{vocab_size} embeddings")
    _check_unique(tokens)
    types = _token_types(keys, len(tokens))
    kind = keys.get("tokenizer.ggml.model")
    if kind == "llama":
        tokenizer, default_add_bos = _sentencepiece(keys, tokens, types)
    elif kind == "gpt2":
        tokenizer, default_add_bos = _byte_level_bpe(keys, tokens, types)
    else:
        raise ConvertError(f"tokenizer.ggml.model '{kind}' is not supported (llama or gpt2)")
    add_bos = bool(keys.get("tokenizer.ggml.add_bos_token", default_add_bos))
    bos_id = _special_id(keys, "bos", len(tokens))
    if add_bos and bos_id is None:
        raise ConvertError("the tokenizer adds BOS (tokenizer.ggml.add_bos_token) but "
                           "tokenizer.ggml.bos_token_id is missing")
    eos_ids = []
    for name in ("eos", "eot", "eom"):
        token_id = _special_id(keys, name, len(tokens))
        if token_id is not None and token_id not in eos_ids:
            eos_ids.append(token_id)
    for token_id, (token, kind) in enumerate(zip(tokens, types)):
        if kind == CONTROL and token in END_OF_TURN_TOKENS and token_id not in eos_ids:
            eos_ids.append(token_id)
    return Vocabulary(tokenizer, add_bos, bos_id, eos_ids)

"""Parity of barellm's tokenizer with Hugging Face `tokenizers`.

Every reference is computed during the test with the pip `tokenizers` package from the same
tokenizer.json that build/tokenize_json reads. Covered: the real tokenizers in ../shared
(stories260K, SmolLM2, and Llama 2's tokenizer.model turned into tokenizer.json by
convert/spm.py), plus variants of them that switch on the features those lack (the Split
regexes of Llama 3, Qwen2, GPT-2, Mistral-Nemo (Tekken), GPT-4o (o200k), DeepSeek LLM and
DeepSeek-V3, and others that use anchors, lookahead, empty matches and every Split
behaviour; NFC, Digits runs, Metaspace, Split behaviours, added-token flags, ignore_merges,
no decoder). Checked: ids of whole eval files, of a multilingual text and of generated text
(with and without special-token parsing), decode of those ids and of random ids (with and
without skipping special tokens), the stream decoder, and decode(encode(text)) == text.
Each \\p{..} category, class and case-insensitive letter of the regexes is also checked on
every code point of the planes that hold assigned characters.
"""

import copy
import json
import os
import random
import subprocess
import sys

import pytest

tokenizers = pytest.importorskip("tokenizers")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(REPO), "shared")
# The build to test: `make test` sets BARELLM_BUILD (build/san for SAN=1).
BUILD = os.path.join(REPO, os.environ.get("BARELLM_BUILD", "build"))
TOOL = os.path.join(BUILD, "tokenize_json")
EVAL_FILES = ["tinystories_valid_sample.txt", "tinyshakespeare.txt", "wiki.test.raw"]

GPT2_REGEX = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
# Mistral-Nemo's Tekken, and GPT-4o's o200k (which adds contractions and digit triples).
TEKKEN_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
                r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
                r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
O200K_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
               r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
               r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
               r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|"
               r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def line_break_characters(pattern):
    """The pattern with the escapes \\r and \\n written as the characters themselves, as many
    tokenizer.json files have them (JSON decodes "\\n" to the character)."""
    return pattern.replace(r"\r", "\r").replace(r"\n", "\n")


# DeepSeek LLM: letters of cased scripts, ASCII and full-width punctuation, CJK and Hangul,
# numbers, each split off by its own Split (Isolated). The escaped characters are those that
# NFC would change (U+1F7D, U+1FBE, U+1FD3, U+1FDB, U+2126, U+212A): an editor must not.
DEEPSEEK_LETTERS = (
    "[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅ"
    "ὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄ"
    "Ⰰ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]")
DEEPSEEK_LLM_REGEXES = [line_break_characters(r"[\r\n]"), r"\s?" + DEEPSEEK_LETTERS + "+",
                        r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", "[一-龥ࠀ-一가-퟿]+", r"\p{N}+"]
# DeepSeek-V3 (and DeepSeek-Coder): digit triples, CJK and kana, then a GPT-4-like pattern.
DEEPSEEK_V3_REGEXES = [
    r"\p{N}{1,3}", r"[一-龥\u3040-ゟ゠-ヿ]+",
    line_break_characters(
        r'''[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|'''
        r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"),
]

SHARED_TOKENIZERS = {
    "stories260K": ("models", "stories260K", "tokenizer.json"),
    "smollm2": ("tokenizers", "smollm2-135m", "tokenizer.json"),
}
# Tokenizers whose decode(encode(text)) gives back the text (no special tokens parsed), and
# the character each cannot give back: SentencePiece's space marker decodes as a space.
LOSSLESS = {"stories260K": "\u2581", "smollm2": None, "llama2": "\u2581"}


def need_shared():
    if not os.path.isdir(SHARED):
        pytest.skip(f"shared data folder {SHARED} is absent")


def need_tool():
    if not os.path.exists(TOOL):
        pytest.skip(f"{TOOL} is not built (run make)")


# --------------------------------------------------------------------------- tokenizers


def byte_level_variant(base, pre_tokenizer, normalizer=None):
    variant = copy.deepcopy(base)
    variant["pre_tokenizer"] = pre_tokenizer
    variant["normalizer"] = normalizer
    return variant


def split(regex_or_string, behavior="Isolated", invert=False, regex=True):
    kind = "Regex" if regex else "String"
    return {"type": "Split", "pattern": {kind: regex_or_string}, "behavior": behavior,
            "invert": invert}


def byte_level(add_prefix_space=False, use_regex=True):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True,
            "use_regex": use_regex}


def sequence(*pre_tokenizers):
    return {"type": "Sequence", "pretokenizers": list(pre_tokenizers)}


def smollm2_variants(smollm2):
    return {
        "llama3-split": byte_level_variant(
            smollm2, sequence(split(LLAMA3_REGEX), byte_level(use_regex=False))),
        "qwen2-split-nfc": byte_level_variant(
            smollm2, sequence(split(QWEN2_REGEX), byte_level(use_regex=False)),
            normalizer={"type": "NFC"}),
        "gpt2-split-prefix-space": byte_level_variant(
            smollm2, sequence(split(GPT2_REGEX), byte_level(add_prefix_space=True,
                                                            use_regex=False))),
        "digit-runs-prefix-space": byte_level_variant(
            smollm2, sequence({"type": "Digits", "individual_digits": False},
                              byte_level(add_prefix_space=True))),
        "tekken-split": byte_level_variant(
            smollm2, sequence(split(TEKKEN_REGEX), byte_level(use_regex=False))),
        "o200k-split-nfc": byte_level_variant(
            smollm2, sequence(split(O200K_REGEX), byte_level(use_regex=False)),
            normalizer={"type": "NFC"}),
        "deepseek-llm-splits": byte_level_variant(
            smollm2, sequence(*map(split, DEEPSEEK_LLM_REGEXES), byte_level(use_regex=False))),
        "deepseek-v3-splits": byte_level_variant(
            smollm2, sequence(*map(split, DEEPSEEK_V3_REGEXES), byte_level(use_regex=False))),
        # Anchors, lookahead, {n,}, \P{..}, negated classes with ranges, each behaviour.
        "regex-behaviors": byte_level_variant(smollm2, sequence(
            split(r"^\s+|\s+$", "Removed"),
            split(r"[^a-zA-Z0-9\s]{2,}", "MergedWithPrevious"),
            split(r"\p{Lu}(?=\p{Ll})", "MergedWithNext"),
            split(r"\d+", "Contiguous", invert=True),
            split(r"\P{L}\p{^L}|\n^.", "Isolated"),
            byte_level(use_regex=False))),
        # Patterns that match the empty string, which splits too.
        "regex-empty-matches": byte_level_variant(smollm2, sequence(
            split(r"(?=\p{Lu})|$", "Isolated"),
            split(r"q*(?=\d)", "MergedWithNext"),
            split(r"(?!\p{L}|\s)", "Contiguous"),
            split(r"\Z|y{0,2}(?=,)", "MergedWithPrevious", invert=True),
            byte_level(use_regex=True))),
    }


def metaspace(scheme, split_pieces):
    return {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme,
            "split": split_pieces}


def added_token(content, special=False, normalized=False, **flags):
    token = {"id": 0, "content": content, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": normalized, "special": special}
    token.update(flags)
    return token


def stories_variants(stories):
    def variant(**changes):
        result = copy.deepcopy(stories)
        result.update(copy.deepcopy(changes))
        return result

    def with_model(**model_changes):
        result = copy.deepcopy(stories)
        result["model"].update(model_changes)
        return result

    def strip(content, start, stop):
        return {"type": "Strip", "content": content, "start": start, "stop": stop}

    # Strips that Hugging Face does not panic on (it does when a token is all stripped
    # characters and shorter than start + stop).
    per_token_strips = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, strip("e", 0, 1), strip(" ", 2, 0),
        {"type": "Replace", "pattern": {"String": "th"}, "content": "<TH>"}, {"type": "Fuse"},
        {"type": "Replace", "pattern": {"String": "ee"}, "content": "[E]"}]}
    metaspace_decoder = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "\u2581",
                                   "prepend_scheme": "always", "split": True}]}
    return {
        "metaspace-always": variant(normalizer=None, pre_tokenizer=metaspace("always", True),
                                    decoder=metaspace_decoder),
        "metaspace-first-unsplit": variant(normalizer=None,
                                           pre_tokenizer=metaspace("first", False)),
        "metaspace-never": variant(normalizer=None, pre_tokenizer=metaspace("never", True),
                                   decoder=metaspace("never", True)),
        "split-behaviors": variant(pre_tokenizer=sequence(
            split("e", "MergedWithPrevious", regex=False),
            split("o", "MergedWithNext", regex=False),
            split("\u2581", "Contiguous", regex=False),
            split("t", "Removed", invert=True, regex=False))),
        "split-isolated-inverted": variant(pre_tokenizer=sequence(
            split("an", "Isolated", invert=True, regex=False),
            split("s", "MergedWithNext", invert=True, regex=False))),
        "added-token-flags": variant(added_tokens=stories["added_tokens"] + [
            added_token("<mask>", special=True, lstrip=True, rstrip=True),
            added_token("cat", single_word=True),
            added_token("dog", normalized=True),
            added_token("<a>", special=True),
            added_token("<a><b>", special=True),
            added_token("Lily"),
        ]),
        "ignore-merges-no-decoder": variant(model=dict(stories["model"], ignore_merges=True),
                                            decoder=None),
        # A token with a character before the space marker: whole words are merged at once.
        "unsegmented": with_model(vocab=dict(stories["model"]["vocab"], **{"x\u2581": 512})),
        "strips-and-replaces": variant(decoder=per_token_strips),
        "unk-fused": with_model(byte_fallback=False),
        "unk-unfused": with_model(byte_fallback=False, fuse_unk=False),
    }


def llama2_tokenizer():
    """Llama 2's tokenizer.json, made from tokenizer.model by the converter's spm module."""
    model_path = os.path.join(SHARED, "tokenizers", "llama2", "tokenizer.model")
    if not os.path.exists(model_path):
        return None, f"{model_path} is absent"
    sys.path.insert(0, os.path.join(REPO, "convert"))
    try:
        import spm  # noqa: E402  (convert/)
        with open(model_path, "rb") as f:
            return spm.tokenizer_json(spm.parse_model(f.read())), None
    except Exception as e:  # noqa: BLE001  (any failure of the converter means: skip)
        return None, f"convert/spm.py cannot build Llama 2's tokenizer.json: {e}"
    finally:
        sys.path.pop(0)


@pytest.fixture(scope="session")
def tokenizer_files(tmp_path_factory):
    """name -> (path of a tokenizer.json, or None and why it is missing)."""
    need_shared()
    folder = tmp_path_factory.mktemp("tokenizers")
    documents = {}
    for name, parts in SHARED_TOKENIZERS.items():
        with open(os.path.join(SHARED, *parts), encoding="utf-8") as f:
            documents[name] = json.load(f)
    documents.update(smollm2_variants(documents["smollm2"]))
    documents.update(stories_variants(documents["stories260K"]))
    llama2, why = llama2_tokenizer()
    files = {"llama2": (None, why)}
    if llama2 is not None:
        documents["llama2"] = llama2
    for name, document in documents.items():
        path = folder / f"{name}.json"
        path.write_text(json.dumps(document), encoding="utf-8")
        files[name] = (str(path), None)
    return files


REAL = ["stories260K", "smollm2", "llama2"]
# The variants that split with regular expressions (ByteLevel's own included).
REGEX_VARIANTS = ["llama3-split", "qwen2-split-nfc", "gpt2-split-prefix-space",
                  "digit-runs-prefix-space", "tekken-split", "o200k-split-nfc",
                  "deepseek-llm-splits", "deepseek-v3-splits", "regex-behaviors",
                  "regex-empty-matches"]
VARIANTS = REGEX_VARIANTS + ["metaspace-always", "metaspace-first-unsplit",
            "metaspace-never", "split-behaviors", "split-isolated-inverted",
            "added-token-flags", "ignore-merges-no-decoder", "unsegmented",
            "strips-and-replaces", "unk-fused", "unk-unfused"]


def tokenizer_path(tokenizer_files, name):
    path, why = tokenizer_files[name]
    if path is None:
        pytest.skip(why)
    return path


# --------------------------------------------------------------------------- text


def generated_texts():
    """Varied text: code, scripts, emoji, marks, spaces, numbers, contractions, specials."""
    texts = [
        "", " ", "  ", "\t", "\n", "\r\n", "a", "Once upon a time, there was a little girl.",
        "def f(x):\n    return x * 2  # double\n\n\tif x:\n\t\tpass\n",
        "int main() {\n  printf(\"%d\\n\", a[i] >> 2);\n  return 0;\n}\r\n",
        "for (auto& [k, v] : map) { std::cout << k << '=' << v; }",
        "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
        "中文文本测试，包含标点。日本語のテキストとカタカナ。한국어 텍스트입니다.",
        "Ελληνικά κείμενα, русский текст, עברית, العربية, हिन्दी भाषा, ไทย",
        "emoji 😀 🤗 👍🏽 🇫🇷 1️⃣ 👩‍👩‍👧‍👦 🧑🏿‍🚀 ❤️‍🔥 🏳️‍🌈",
        "e\u0301 a\u0308\u0301 o\u0323\u0302 \u0301start Z\u0351\u0362\u0315a\u0337\u0328lgo",
        "\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af \uac00\u11a8 \u212b \u2126",
        "A\u030a \u00c5 \u0041\u0301\u0327 \u1e0b\u0323 \u0071\u0307\u0323 \u0fb2\u0f80",
        # Marks newer than Unicode 9.0, which Hugging Face's NFC does not reorder.
        "a\u08cd\u0316 a\u1de7\U00010f4b \ufa51\u1de7\U00010f4b a\u0300\u0316",
        "a   b", "  leading", "trailing   ", "\t\tx", "x\u00a0y\u3000z\u2009w",
        "\n\n\n", " \n ", "a \n\n  b", "line1\r\nline2\r\n\r\nline3", "\r\r\n\n\r",
        "tabs\tand  spaces \t mixed\t \n", "   \n\t  \u2028 \u2029 end",
        "3.14159 1,000,000 -42 +7 1e10 0x1F 2024-01-01 12:34:56",
        "\u0663\u0664\u0665 \u00bd \u00b2 \u2163 \u0f33 \U0001d7d9 \u2460\u2461",
        "don't DON'T I'm I'M we're WE'RE they've THEY'VE he'll HE'LL she'd SHE'D it's IT'S",
        "'s 'S 'sand 't 're 'Re 'rE 've 'VE 'm 'll 'LL 'Ll 'd x'\u017fx '\u017f ''s '''",
        "<s>hello</s> <unk> <s><s>", "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
        "a<|endoftext|>b<|im_start|><|im_end|>c", "<s> <mask> cat catalog a cat. dog Lily",
        "x <mask>  y\t<mask>\nz", "<a><b><a><b><a>", "concat dogs hotdog Lily's",
        "\ufffd \ufeff \uffff \U0010ffff \ue000 \x00\x01\x7f \u200b\u200d \u2028",
        "<0xE4> \u2581 \u2581\u2581x \u0120 \u010a literal markers",
        "\u00e9t\u00e9 na\u00efve caf\u00e9 \u00c5ngstr\u00f6m \ufb01 \u01c5",
        "mixed123abc 456def 7890 1 12 123 1234 12345 a1b2c3",
        "email: someone@example.com, url: https://example.org/path?q=1&r=2#frag",
        "x" * 300, "ab" * 200 + " " * 50 + "\u4e2d" * 100,
    ]
    texts += ["9" * n for n in range(1, 25)]
    texts += [" " * n + "x" + " " * n for n in range(1, 12)]
    texts += ["\n" * n + " " * n + "y" for n in range(1, 6)]
    rng = random.Random(1234)
    pool = (list("abcXYZ019 \t\n\r.,!?'\"-_<>/\\") +
            ["\u00e9", "\u00df", "\u4e2d", "\u6587", "\u304b", "\ud55c", "\u0301", "\u0308",
             "\U0001f600", "\U0001f917", "\u200d", "\u00a0", "\u3000", "\u2581", "\u0663",
             "\u00bd", "\u017f", "\ufffd", "\U0001f3fd", "'s", "'LL", "<s>", "</s>",
             "<|im_end|>", "<mask>", "cat", "Lily", "\r\n", "  "])
    texts += ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(300)]
    return texts


def eval_text(name):
    with open(os.path.join(SHARED, "eval", name), encoding="utf-8") as f:
        return f.read()


def multilingual_text(size=500_000, seed=99):
    """About `size` characters of words in many scripts, with code, emoji, combining marks,
    numbers, runs of spaces and tabs, CRLF and other line breaks between them."""
    rng = random.Random(seed)
    alphabets = ["abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "αβγδεζηθικλμνξοπρσςτΑΒΓΔ",
                 "абвгдежзийклмнопрстАБВГД", "中文字符测试语言模型的分词器一龥", "ひらがなカタカナゟ゠ヿ",
                 "한국어텍스트가힣", "עבריתשלום", "العربيةمرحبا", "हिन्दीभाषा", "ไทยภาษา",
                 "ÀÉÎÕÜßÆŒǅǈǋ", "ＡＢＣａｂｃ", "\U0001d400\U0001d41a\U00010400\U00010428"]
    marks = ["\u0301", "\u0308", "\u0323", "\u093f", "\u0e31", "\u200d", "\ufe0f"]
    others = ["😀", "🤗", "👍🏽", "🇫🇷", "1️⃣", "€", "£", "±", "→", "…", "—", "«", "»", "“", "”",
              "'s", "'LL", "'\u017f", "\u212a", "'re", "!", "?", ".", ",", ";", "::", "->", "{}",
              "()", "[]", "/*", "*/", "#", "@", "\\", "/", "=="]
    numbers = ["0", "7", "42", "123", "2024", "3.14159", "1,000", "\u0663\u0664", "\u00bd",
               "\u2163", "\uff11\uff12", "\U0001d7d9"]
    spaces = [" ", " ", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n", "\u00a0", "\u3000",
              "\u2028", "\x85", "\r", "\x0b", "\x0c", "    \n\t"]
    parts, length = [], 0
    while length < size:
        kind = rng.random()
        if kind < 0.55:
            letters = rng.choice(alphabets)
            word = "".join(rng.choice(letters) for _ in range(rng.randint(1, 9)))
            if rng.random() < 0.15:
                word += rng.choice(marks)
            part = word
        elif kind < 0.7:
            part = rng.choice(others)
        elif kind < 0.8:
            part = rng.choice(numbers)
        else:
            part = rng.choice(spaces)
        parts.append(part)
        length += len(part)
    return "".join(parts)


# --------------------------------------------------------------------------- running


def run_tool(tmp_path, tokenizer, payload, *options):
    """Runs build/tokenize_json on `payload` (a str, or JSON-encoded when not a str)."""
    input_path = tmp_path / "input"
    if isinstance(payload, str):
        input_path.write_bytes(payload.encode("utf-8"))
    else:
        input_path.write_text(json.dumps(payload), encoding="utf-8")
    result = subprocess.run([TOOL, *options, tokenizer, str(input_path)], capture_output=True)
    assert result.returncode == 0, result.stderr.decode()
    if "--decode" in options and "--batch" not in options and "--stream" not in options:
        return result.stdout.decode("utf-8")
    return json.loads(result.stdout)


def hf_tokenizer(path, parse_special=True):
    tokenizer = tokenizers.Tokenizer.from_file(path)
    tokenizer.encode_special_tokens = not parse_special
    return tokenizer


def hf_ids(tokenizer, texts):
    return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


def first_difference(ours, theirs):
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return i
    return min(len(ours), len(theirs))


def assert_same_ids(ours, theirs, text):
    if ours != theirs:
        i = first_difference(ours, theirs)
        pytest.fail(f"ids differ at {i} for {text[:80]!r}: ours {ours[max(0, i - 3):i + 5]}, "
                    f"Hugging Face {theirs[max(0, i - 3):i + 5]}")


def is_byte_token(token):
    return len(token) == 6 and token.startswith("<0x") and token.endswith(">")


def valid_utf8(data):
    try:
        data.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def streams_like_decode(tokenizer, ids, skip_special):
    """False where the documented exception applies: a run of byte-fallback tokens that
    starts with a complete character and is invalid as a whole (Hugging Face turns the whole
    run into U+FFFD; the stream has already shown the character)."""
    tokens = [tokenizer.id_to_token(i) for i in ids]
    if skip_special:
        special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
        tokens = [t for t in tokens if t not in special]
    runs, run = [], b""
    for token in tokens + [""]:
        if is_byte_token(token):
            run += bytes([int(token[3:5], 16)])
        elif run:
            runs.append(run)
            run = b""
    return not any(not valid_utf8(run) and any(valid_utf8(run[:k]) for k in range(1, 5))
                   for run in runs)


def random_id_sequences(tokenizer, count, seed):
    """Random ids, and random runs of byte tokens mixed with a few other tokens."""
    rng = random.Random(seed)
    size = tokenizer.get_vocab_size()
    byte_ids = [i for i in (tokenizer.token_to_id(f"<0x{b:02X}>") for b in range(256))
                if i is not None]
    special_ids = sorted(tokenizer.get_added_tokens_decoder())
    sequences = [[rng.randrange(size) for _ in range(rng.randint(1, 20))] for _ in range(count)]
    if byte_ids:
        utf8 = [list("é中😀".encode("utf-8")), list("\ufffd".encode("utf-8"))]
        for _ in range(count):
            sequence = []
            for _ in range(rng.randint(1, 12)):
                choice = rng.random()
                if choice < 0.4:
                    sequence += [byte_ids[b] for b in rng.choice(utf8)]
                elif choice < 0.7:
                    sequence.append(rng.choice(byte_ids))
                elif choice < 0.8 and special_ids:
                    sequence.append(rng.choice(special_ids))
                else:
                    sequence.append(rng.randrange(size))
            sequences.append(sequence)
    return sequences


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", REAL)
def test_eval_files_encode_decode_and_round_trip(name, tokenizer_files, tmp_path):
    need_tool()
    path = tokenizer_path(tokenizer_files, name)
    tokenizer = hf_tokenizer(path)
    for file_name in EVAL_FILES:
        text = eval_text(file_name)
        ours = run_tool(tmp_path, path, text)
        assert_same_ids(ours, tokenizer.encode(text, add_special_tokens=False).ids, text)
        decoded = run_tool(tmp_path, path, ours, "--decode")
        assert decoded == tokenizer.decode(ours, skip_special_tokens=False)
        assert decoded == text, f"{file_name} does not survive encode + decode"


@pytest.mark.parametrize("name", REGEX_VARIANTS)
def test_regex_splits_of_long_texts(name, tokenizer_files, tmp_path):
    """The eval files and a multilingual megabyte, through each regex variant."""
    need_tool()
    path = tokenizer_path(tokenizer_files, name)
    tokenizer = hf_tokenizer(path)
    for text in [eval_text(f) for f in EVAL_FILES] + [multilingual_text()]:
        ours = run_tool(tmp_path, path, text)
        assert_same_ids(ours, tokenizer.encode(text, add_special_tokens=False).ids, text)


def test_whole_word_merging_of_a_long_text(tokenizer_files, tmp_path):
    """A long text as one BPE word (no segmenting at space markers): the merge queue path."""
    need_tool()
    path = tokenizer_path(tokenizer_files, "unsegmented")
    text = eval_text("wiki.test.raw")[:200_000]
    ours = run_tool(tmp_path, path, text)
    assert_same_ids(ours, hf_tokenizer(path).encode(text, add_special_tokens=False).ids, text)


@pytest.mark.parametrize("parse_special", [True, False], ids=["special", "no-special"])
@pytest.mark.parametrize("name", REAL + VARIANTS)
def test_generated_texts_encode(name, parse_special, tokenizer_files, tmp_path):
    need_tool()
    path = tokenizer_path(tokenizer_files, name)
    texts = generated_texts()
    options = ["--batch"] + ([] if parse_special else ["--no-special"])
    ours = run_tool(tmp_path, path, texts, *options)
    theirs = hf_ids(hf_tokenizer(path, parse_special), texts)
    for text, our_ids, their_ids in zip(texts, ours, theirs):
        assert_same_ids(our_ids, their_ids, text)


@pytest.mark.parametrize("name", REAL + VARIANTS)
def test_decode_and_stream_decode(name, tokenizer_files, tmp_path):
    need_tool()
    path = tokenizer_path(tokenizer_files, name)
    tokenizer = hf_tokenizer(path)
    sequences = hf_ids(tokenizer, generated_texts()) + random_id_sequences(tokenizer, 150, 7)
    for skip in (False, True):
        options = ["--decode", "--batch"] + (["--skip-special"] if skip else [])
        decoded = run_tool(tmp_path, path, sequences, *options)
        streamed = run_tool(tmp_path, path, sequences, *options, "--stream")
        for ids, text, pieces in zip(sequences, decoded, streamed):
            assert text == tokenizer.decode(ids, skip_special_tokens=skip), ids
            if streams_like_decode(tokenizer, ids, skip):
                assert "".join(pieces) == text, ids


@pytest.mark.parametrize("name", sorted(LOSSLESS))
def test_round_trip_of_generated_texts(name, tokenizer_files, tmp_path):
    need_tool()
    path = tokenizer_path(tokenizer_files, name)
    texts = [t for t in generated_texts() if LOSSLESS[name] is None or LOSSLESS[name] not in t]
    ids = run_tool(tmp_path, path, texts, "--batch", "--no-special")
    assert run_tool(tmp_path, path, ids, "--decode", "--batch") == texts


# --------------------------------------------------------------------------- regex classes
#
# Each class a pre-tokenizer regex may use, checked on every code point: a tokenizer removes
# the characters the pattern matches (Split, Removed) and keeps the others as byte tokens
# (no merges), so that the ids show which characters matched.

GENERAL_CATEGORIES = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc",
                      "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl",
                      "Zp", "Cc", "Cf", "Cs", "Co", "Cn"]
# The other names \p{..} accepts, each with a short name whose set it must match.
CATEGORY_NAMES = {
    "L": "Letter", "LC": "Cased_Letter", "Lu": "Uppercase_Letter", "Ll": "Lowercase_Letter",
    "Lt": "Titlecase_Letter", "Lm": "Modifier_Letter", "Lo": "Other_Letter", "M": "Mark",
    "Mn": "Nonspacing_Mark", "Mc": "Spacing_Mark", "Me": "Enclosing_Mark", "N": "Number",
    "Nd": "Decimal_Number", "Nl": "Letter_Number", "No": "Other_Number", "P": "Punctuation",
    "Pc": "Connector_Punctuation", "Pd": "Dash_Punctuation", "Ps": "Open_Punctuation",
    "Pe": "Close_Punctuation", "Pi": "Initial_Punctuation", "Pf": "Final_Punctuation",
    "Po": "Other_Punctuation", "S": "Symbol", "Sm": "Math_Symbol", "Sc": "Currency_Symbol",
    "Sk": "Modifier_Symbol", "So": "Other_Symbol", "Z": "Separator", "Zs": "Space_Separator",
    "Zl": "Line_Separator", "Zp": "Paragraph_Separator", "C": "Other", "Cc": "Control",
    "Cf": "Format", "Cs": "Surrogate", "Co": "Private_Use", "Cn": "Unassigned",
}
CLASSES = [r"\s", r"\S", r"\d", r"\D", ".", r"[^\s\p{L}\p{N}]", r"[^\r\n\p{L}\p{N}]",
           r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]",
           r"[^\r\n\p{L}\p{P}\p{S}]", r"[\p{P}\p{S}]", r"[\p{L}\p{M}]", r"\P{L}", r"\p{^N}",
           r"\P{^Zs}", DEEPSEEK_LETTERS, "[一-龥ࠀ-一가-퟿]", r"[一-龥\u3040-ゟ゠-ヿ]",
           r"[!-/:-~！-／：-～‘-‟　-。]", r"[^\x{0}-\x{7F}\u00e9]", r"[\-a-z\]\\]"]


def byte_level_alphabet():
    """GPT-2's bytes_to_unicode: the character that stands for each byte."""
    printable = [b for b in range(256) if ord("!") <= b <= ord("~") or 0xA1 <= b <= 0xAC or b >= 0xAE]
    extra = iter(range(0x100, 0x200))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def removing_tokenizer(regex):
    """A byte-level tokenizer without merges that drops what `regex` matches."""
    return {"version": "1.0", "added_tokens": [], "normalizer": None, "post_processor": None,
            "pre_tokenizer": sequence(split(regex, "Removed"), byte_level(use_regex=False)),
            "decoder": None,
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {c: i for i, c in enumerate(byte_level_alphabet())},
                      "merges": []}}


def code_points_text(planes):
    """Every code point of `planes` but surrogates. Planes 0-3 and 14 hold every assigned
    character that is not for private use."""
    return "".join(chr(cp) for plane in planes for cp in range(plane << 16, (plane + 1) << 16)
                   if not 0xD800 <= cp <= 0xDFFF)


@pytest.fixture(scope="module")
def code_point_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("code_points")
    texts = {"assigned": code_points_text([0, 1, 2, 3, 14]), "bmp": code_points_text([0]),
             # private use (planes 15 and 16), one in 17
             "private": "".join(chr(cp) for cp in range(0xF0000, 0x110000, 17))}
    files = {}
    for name, text in texts.items():
        path = folder / name
        path.write_bytes(text.encode("utf-8"))
        files[name] = (text, str(path))
    return files


def assert_same_removal(regex, text_file, tmp_path):
    """Our tokenizer keeps the characters that Hugging Face's Split (Removed) keeps."""
    text, text_path = text_file
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(removing_tokenizer(regex)), encoding="utf-8")
    result = subprocess.run([TOOL, str(path), text_path], capture_output=True)
    assert result.returncode == 0, result.stderr.decode()
    ours = bytes(json.loads(result.stdout)).decode("utf-8")  # each id is a byte
    split_regex = tokenizers.pre_tokenizers.Split(tokenizers.Regex(regex), "removed")
    theirs = "".join(piece for piece, _ in split_regex.pre_tokenize_str(text))
    if ours != theirs:
        i = first_difference(ours, theirs)
        pytest.fail(f"{regex!r} keeps other characters than Hugging Face's: ours "
                    f"{ours[max(0, i - 3):i + 5]!r}, Hugging Face {theirs[max(0, i - 3):i + 5]!r}")


@pytest.mark.parametrize("regex", [rf"\p{{{c}}}" for c in GENERAL_CATEGORIES] + CLASSES)
def test_regex_classes_on_every_code_point(regex, code_point_files, tmp_path):
    need_tool()
    assert_same_removal(regex, code_point_files["assigned"], tmp_path)
    assert_same_removal(regex, code_point_files["private"], tmp_path)


@pytest.mark.parametrize("short", sorted(CATEGORY_NAMES))
def test_regex_category_names(short, code_point_files, tmp_path):
    """Short and long names, in Oniguruma's loose spelling, negated or not."""
    need_tool()
    long = CATEGORY_NAMES[short]
    for regex in [rf"\p{{{short}}}", rf"\p{{{long}}}", rf"\p{{ {long.upper().replace('_', '-')} }}",
                  rf"\P{{{short.lower()}}}", rf"\p{{^{long.lower().replace('_', ' ')}}}"]:
        assert_same_removal(regex, code_point_files["bmp"], tmp_path)


def test_regex_case_insensitive_letters(code_point_files, tmp_path):
    """(?i:x) for each printable ASCII character x, and all pairs of letters that are
    supported (not those that Unicode folds from one character, such as "ss")."""
    need_tool()
    for letter in "abcdefghijklmnopqrstuvwxyzK":
        assert_same_removal(f"(?i:{letter})", code_point_files["bmp"], tmp_path)
    others = [c if c.isalnum() or c in " '\"" else "\\" + c
              for c in map(chr, range(0x20, 0x7F)) if not c.isalpha()]
    assert_same_removal("(?i:" + "|".join(others) + ")", code_point_files["bmp"], tmp_path)
    letters = "abcdefghijklmnopqrstuvwxyz"
    pairs = [a + b for a in letters for b in letters if a + b not in ("ss", "st", "ff", "fi", "fl")]
    assert_same_removal("(?i:" + "|".join(pairs) + ")", code_point_files["bmp"], tmp_path)


# --------------------------------------------------------------------------- refusals

# Constructs that Oniguruma (and so Hugging Face) accepts, and barellm refuses, with the
# words that must name them. The last one is refused by both, as ill-formed.
REFUSED_REGEXES = [
    (r"(a)\1", "backreference"),
    (r"(?<=a)b", "lookbehind"),
    (r"\p{Han}+", "property"),
    (r"(?i)a", "option group"),
    (r"\w+", "word characters"),
    (r"a*?", "lazy quantifier"),
    (r"(?i:ss)", "case-insensitive 'ss'"),
    (r"(?:a?)+", "can match the empty string"),
    ("[\r\n", "without a matching ']'"),
]


@pytest.mark.parametrize("regex,construct", REFUSED_REGEXES)
def test_unsupported_regex_is_refused_in_one_line(regex, construct, tokenizer_files, tmp_path):
    need_tool()
    with open(tokenizer_path(tokenizer_files, "smollm2"), encoding="utf-8") as f:
        document = json.load(f)
    document["pre_tokenizer"] = split(regex)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    (tmp_path / "text").write_text("Hello", encoding="utf-8")
    result = subprocess.run([TOOL, str(path), str(tmp_path / "text")], capture_output=True,
                            text=True)
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1
    quoted = regex.replace("\r", r"\r").replace("\n", r"\n")
    assert f"regex '{quoted}' is not supported: " in result.stderr
    assert construct in result.stderr

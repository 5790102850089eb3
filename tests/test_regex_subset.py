"""The converter's regex check (convert/regex_subset.py) against barellm's regex compiler
(src/tokenizer/regex.cpp, through build/regex_check): the same verdict and the same message for the
patterns of real tokenizers, every string of tests/test_regex.cpp, each kind of construct
that src/tokenizer/regex.h lists as refused, and thousands of generated patterns. Also: conversion
refuses a Split regex outside the subset with the message barellm gives at load."""

import json
import os
import random
import re
import subprocess
import sys

import pytest

from convert_testlib import BUILD, CONVERT, REPO, make_checkpoint, run, tiny_tokenizer_json

sys.path.insert(0, os.path.dirname(CONVERT))
from common import ConvertError  # noqa: E402  (convert/)
import regex_subset  # noqa: E402


def need_tool(name):
    path = os.path.join(BUILD, name)
    if not os.path.exists(path):
        pytest.skip(f"{path} is not built (run make)")
    return path


def compiler_verdicts(patterns):
    """[(compiles, message or None)] of src/tokenizer/regex.cpp for `patterns`."""
    lines = "".join(json.dumps(p) + "\n" for p in patterns)
    result = subprocess.run([need_tool("regex_check")], input=lines.encode(),
                            capture_output=True, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    verdicts = [json.loads(line) for line in result.stdout.decode().splitlines()]
    assert len(verdicts) == len(patterns)
    return [(v["ok"], v.get("error")) for v in verdicts]


def checker_verdict(pattern):
    """(accepted, message or None) of convert/regex_subset.py for `pattern`."""
    try:
        regex_subset.check_regex(pattern)
    except ConvertError as e:
        return False, str(e)
    return True, None


def assert_agree(patterns):
    """Both accept, or both refuse with the same message, each of `patterns`."""
    disagreements = []
    for pattern, ours in zip(patterns, compiler_verdicts(patterns)):
        theirs = checker_verdict(pattern)
        if ours != theirs:
            disagreements.append(f"{pattern!r}:\n  src/tokenizer/regex.cpp: {ours[1] or 'accepted'}"
                                 f"\n  regex_subset:  {theirs[1] or 'accepted'}")
    assert not disagreements, (f"{len(disagreements)} of {len(patterns)} patterns differ:\n"
                               + "\n".join(disagreements[:20]))


# --------------------------------------------------------------------------- the patterns


def split_regexes(node):
    """The Regex patterns of the Split pre-tokenizers anywhere in a tokenizer.json tree."""
    if isinstance(node, dict):
        pattern = node.get("pattern")
        if node.get("type") == "Split" and isinstance(pattern, dict) and "Regex" in pattern:
            yield pattern["Regex"]
        for value in node.values():
            yield from split_regexes(value)
    elif isinstance(node, list):
        for value in node:
            yield from split_regexes(value)


def parity_patterns():
    """The patterns of tests/test_tokenizer_parity.py: real tokenizers' Split regexes, the
    classes, category names and case-insensitive letters, and the refused ones."""
    parity = pytest.importorskip("test_tokenizer_parity")
    patterns = list(split_regexes(parity.smollm2_variants({})))
    patterns += [parity.GPT2_REGEX] + parity.CLASSES  # GPT-2's: ByteLevel's own
    patterns += [regex for regex, _ in parity.REFUSED_REGEXES]
    for short, long in parity.CATEGORY_NAMES.items():
        patterns += [rf"\p{{{short}}}", rf"\p{{ {long.upper().replace('_', '-')} }}",
                     rf"\P{{{short.lower()}}}", rf"\p{{^{long.lower().replace('_', ' ')}}}"]
    letters = "abcdefghijklmnopqrstuvwxyz"
    patterns += [f"(?i:{c})" for c in letters + "K"]
    patterns.append("(?i:" + "|".join(a + b for a in letters for b in letters) + ")")
    return patterns


def cpp_string_literals(path):
    """Every string literal of a C++ file (adjacent ones joined), as text; those that are
    not valid UTF-8, which a JSON string cannot carry, are left out."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    token = re.compile(r'//[^\n]*|/\*.*?\*/|R"([^(]*)\((.*?)\)\1"|"((?:[^"\\\n]|\\.)*)"'
                       r"|'(?:[^'\\\n]|\\.)+'|\s+|.", re.S)
    escapes = {"n": b"\n", "r": b"\r", "t": b"\t", "f": b"\f", "v": b"\v", "a": b"\a",
               "0": b"\0", "\\": b"\\", '"': b'"', "'": b"'", "?": b"?"}
    literals, joined = [], None  # joined: the literal being built, bytes
    for match in token.finditer(source):
        text, raw, plain = match.group(0), match.group(2), match.group(3)
        if raw is not None or plain is not None:
            if raw is not None:
                value = raw.encode()
            else:
                value = re.sub(rb"\\(x[0-9A-Fa-f]+|.)",
                               lambda m: (bytes([int(m.group(1)[1:], 16)])
                                          if m.group(1)[:1] == b"x" else
                                          escapes[m.group(1).decode()]),
                               plain.encode())
            joined = value if joined is None else joined + value
        elif not text.isspace() and not text.startswith(("//", "/*")):
            if joined is not None:
                literals.append(joined)
            joined = None
    texts = []
    for literal in literals:
        try:
            texts.append(literal.decode("utf-8"))
        except UnicodeDecodeError:
            pass
    return texts


# One example or more of each kind of construct src/tokenizer/regex.h lists as refused, and of each
# refusal of src/tokenizer/regex.cpp's parser, with supported neighbours of them.
REFUSED_KINDS = {
    "lookbehind": [r"(?<=a)b", r"(?<!a)b", r"x(?<=a|bc)"],
    "backreferences": [r"(a)\1", r"\9", r"\k<name>", r"\g<1>", r"\0", r"\01"],
    "atomic and named groups": [r"(?>a)", r"(?<name>a)", r"(?P<name>a)", r"(?'name'a)",
                                r"(?P=name)"],
    "lazy and possessive quantifiers": [r"a*?", r"a+?", r"a??", r"a{1,2}?", r"a*+", r"a++",
                                        r"a?+", r"a{2}+", r"a**", r"a{2}{3}", r"a?{2}"],
    "word, boundary and hex escapes": [r"\w", r"\W", r"\b", r"\B", r"\h", r"\H", r"\y",
                                       r"\K", r"\G", r"\R", r"\X", r"\Q.\E", r"\N", r"\é",
                                       r"[\w]", r"[\b]", "a\\"],
    "scripts and other properties": [r"\p{Han}", r"\p{Greek}", r"\p{Alphabetic}", r"\p{Any}",
                                     r"\p{^Latin}", r"\P{Nonsense}", r"\pL", r"\p{L",
                                     r"\p{}", r"[\p{Han}]", r"\p{Lu}\p{L&}", r"\p{is_L}"],
    "nested classes and class operators": [r"[a[b]]", r"[[:alpha:]]", r"[a&&b]",
                                           r"[a-c&&[^b]]", r"[^[a]]", r"[a&b]", r"[&&]"],
    "class rules": [r"[]a]", r"[^]a]", r"[]", r"[z-a]", r"[\s-z]", r"[a-\d]", r"[a-c-e]",
                    r"[ab", r"[", r"[\\", "[a-", r"[a-\w]", r"[-a]", r"[a-]", r"[\x{41}-\x40]",
                    r"[^-]", r"[a\-z]", r"[\]-a]", r"[é-a]"],
    "inline options": [r"(?i)a", r"(?m:a)", r"(?x)", r"(?-i:a)", r"(?im:a)", r"(?s:.)",
                       r"(?i:a(?-i)b)", r"(?", r"(?i", r"(?#comment)", r"(?~abs)",
                       r"(?(1)a|b)"],
    "quantifiers on what can match the empty string": [
        r"(?:a?)+", r"(?:)*", r"()+", r"(a|)*", r"(?:a*){2}", r"(?=a)*", r"(?!a)+", r"^*",
        r"$+", r"\A?", r"\z{2}", r"\Z*", r"(?:^)*", r"(^)*", r"(?:^$)+", r"(?:a|^)*",
        r"(?:a{0,2})+", r"(?:a{0})*", r"(?:ab?)+", r"(?:(?=a)b)+"],
    "(?i:...)": [r"(?i:ss)", r"(?i:ST)", r"(?i:fi|x)", r"(?i:a|Ff)", r"(?i:s\\s)", r"(?i:s\ t)",
                 r"(?i:é)", r"(?i:[a])", r"(?i:a+)", r"(?i:a{2})", r"(?i:\d)", r"(?i:.)",
                 r"(?i:(a))", r"(?i:^)", r"(?i:\n)", r"(?i:*)", r"(?i:\.|\-|'s)", r"(?i:)",
                 r"(?i:a", r"(?i:a)+", r"(?i:a|)*"],
    "character escapes": [r"\xE9", r"\xFF", r"\x7F", r"\x{110000}", r"\x{D800}", r"\x{}",
                          r"\x{41", r"\xG", r"\x", r"\u12", r"\uD800", r"\uDFFF", r"\u00e9",
                          r"\x{000000041}", r"\x{00000041}", r"\u{41}", r"\x4", r"[\xE9]",
                          r"\cA", r"\C-a", r"\M-a", r"\o{101}"],
    "structure": [r"(a", r"a)", r"*a", r"+a", r"?a", r"{2}a", r"a{", r"a{1,x}", r"a{3,2}",
                  r"a{100001}", r"a{100000}", r"a{,}", r"a{}", r"a{,5}", r"a{ 2}", r"a{٣}",
                  r"a{1,٣}", r"a|*", r"(|)", r"()", r"a|", r"|", "", r"(?:a|b|)", "\n^.",
                  "a\0b"],
    # At most 10000 instructions: (?:ab){4999} is 9998 and a Match, (?:a|b){2499} 9996
    # and a Match, 3315 alternatives "ab" 9945 with 53 Branches and a Match, 3333 (?:ab)?
    # 9999 and a Match, 1666 (?:ab)+ 9996 and a Match, 2499 (?=ab) 9996 and a Match.
    "size": [r"(?:ab){4999}", r"(?:ab){5000}", r"(?:ab){60000}", r"(?:(?:ab){100}){100}",
             r"(?:a|b){2499}", r"(?:a|b){2500}", r"(?:ab)+" * 1666, r"(?:ab)+" * 1667,
             "|".join(["ab"] * 3315), "|".join(["ab"] * 3316), r"(?:ab)?" * 3333,
             r"(?:ab)?" * 3334, r"(?=ab)" * 2499, r"(?=ab)" * 2500, "(" * 64 + ")" * 64,
             "(" * 65 + ")" * 65, "(?:" * 64 + "a" + ")" * 64, "(?=" * 65 + ")" * 65],
}


# A grammar of patterns, in which each construct is mostly well-formed and sometimes not,
# and supported and refused constructs mix.
CHARACTERS = list("abskftilxK09_ -,'\"#~<>=!:&}]é漢😀ß\n\t\0") + ["\u212a"]
ESCAPES = [r"\s", r"\S", r"\d", r"\D", r"\p{L}", r"\p{N}", r"\P{Lu}", r"\p{^Ll}",
           r"\p{ Letter }", r"\p{Han}", r"\p{Nonsense}", r"\n", r"\r", r"\t", r"\e", r"\.",
           r"\-", r"\]", r"\\", r"\ ", r"\u00e9", r"\uD800", r"\x41", r"\xE9", r"\x{4E2D}",
           r"\x{110000}", r"\A", r"\z", r"\Z", r"\w", r"\b", r"\h", r"\1", r"\0", r"\k<a>",
           r"\y", r"\é"]
CLASS_ITEMS = ["a", "z", "0", "é", "-", "^", "&", "a-z", "z-a", "0-9", "\0-\x7f", "é-ü",
               r"\s", r"\d", r"\p{L}", r"\P{N}", r"\w", r"\x41", r"\u00e9", r"\-", r"\]",
               r"\\", r"\n", "[", "&&", r"\s-z", "a-", "[:alpha:]"]
QUANTIFIERS = ["?", "*", "+", "{2}", "{1,3}", "{2,}", "{,2}", "{0}", "{0,1}", "{0,0}",
               "{100}", "{1000}", "*?", "+?", "??", "*+", "++", "{3,2}", "{", "{x}", "{,}",
               "{1,2}{3}", "**", "{100001}"]
GROUP_OPENERS = ["(", "(?:", "(?=", "(?!"]
REFUSED_GROUP_OPENERS = ["(?<=", "(?<!", "(?>", "(?<a>", "(?P<a>", "(?#", "(?m:", "(?i)",
                         "(?-i:", "(?~", "(?("]
CASE_INSENSITIVE_TEXT = list("abcdefghijklmnopqrstuvwxyzSFIT0'") + [
    r"\.", r"\-", r"\ ", r"\\", "é", "[a]", "+", r"\d", "(", ".", "^"]


def random_pattern(rng, depth=0):
    alternatives = rng.choice([1, 1, 1, 2, 3])
    return "|".join(random_sequence(rng, depth) for _ in range(alternatives))


def random_sequence(rng, depth):
    items = []
    for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 4])):
        item = random_atom(rng, depth)
        if rng.random() < 0.3:
            item += rng.choice(QUANTIFIERS)
        items.append(item)
    return "".join(items)


def random_atom(rng, depth):
    kind = rng.random()
    if kind < 0.2 and depth < 3:
        if rng.random() < 0.15:
            body = "|".join("".join(rng.choice(CASE_INSENSITIVE_TEXT)
                                    for _ in range(rng.randint(0, 3)))
                            for _ in range(rng.randint(1, 3)))
            opener = "(?i:"
        else:
            body = random_pattern(rng, depth + 1)
            opener = rng.choice(GROUP_OPENERS if rng.random() < 0.85 else REFUSED_GROUP_OPENERS)
        return opener + body + (")" if rng.random() < 0.97 else "")
    if kind < 0.35:
        items = [rng.choice(CLASS_ITEMS) for _ in range(rng.randint(0, 3))]
        start = rng.choice(["[", "[", "[^"])
        return start + "".join(items) + ("]" if rng.random() < 0.95 else "")
    if kind < 0.5:
        return rng.choice(ESCAPES)
    if kind < 0.53:
        return rng.choice(["^", "$", ".", ")", "{", "?", "\\"])
    return rng.choice(CHARACTERS)


# --------------------------------------------------------------------------- the tests


def test_real_tokenizer_patterns_agree():
    assert_agree(parity_patterns())


def test_patterns_of_the_regex_unit_tests_agree():
    patterns = cpp_string_literals(os.path.join(REPO, "tests", "test_regex.cpp"))
    assert len(patterns) > 100 and r"(?<=a)b" in patterns
    assert_agree(patterns)


@pytest.mark.parametrize("kind", sorted(REFUSED_KINDS))
def test_each_kind_of_refused_construct_agrees(kind):
    assert_agree(REFUSED_KINDS[kind])


def test_generated_patterns_agree():
    rng = random.Random(20261122)
    patterns = [random_pattern(rng) for _ in range(6000)]
    accepted = sum(checker_verdict(p)[0] for p in patterns)
    assert 0.2 < accepted / len(patterns) < 0.8  # the grammar mixes both well
    assert_agree(patterns)


def test_text_that_is_not_utf8_is_refused():
    """JSON can hold a lone surrogate ("\\uD800"), which is not UTF-8 (barellm's JSON
    reader refuses the whole file)."""
    with pytest.raises(ConvertError, match=r"'a\\ud800' is not supported: text that is not "
                                           r"valid UTF-8 \(at offset 0\)"):
        regex_subset.check_regex("a\ud800")


@pytest.mark.parametrize("nested", [False, True])
def test_conversion_refuses_like_loading(tmp_path, nested):
    """A Split regex outside the subset, alone or inside a Sequence, is refused at
    conversion with the message barellm gives when it loads the tokenizer.json."""
    split = {"type": "Split", "pattern": {"Regex": r"(?<=a)b"}, "behavior": "Isolated",
             "invert": False}
    tokenizer = tiny_tokenizer_json()
    tokenizer["pre_tokenizer"] = ({"type": "Sequence", "pretokenizers": [
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always"}, split]}
        if nested else split)
    hf = make_checkpoint(tmp_path / "hf", tokenizer=tokenizer)
    out = tmp_path / "model.barellm"
    result = run(CONVERT, hf, "-o", out)
    assert result.returncode == 1 and not out.exists()
    message = ("tokenizer.json: pre_tokenizer Split regex '(?<=a)b' is not supported: "
               "lookbehind '(?<=' (at offset 0)")
    assert result.stderr == f"convert: {message}\n"
    (tmp_path / "text").write_text("ab", encoding="utf-8")
    loaded = subprocess.run([need_tool("tokenize_json"), hf / "tokenizer.json",
                             tmp_path / "text"], capture_output=True, text=True)
    assert loaded.returncode == 1 and loaded.stderr == f"tokenize_json: {message}\n"

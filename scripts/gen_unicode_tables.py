#!/usr/bin/env python3
"""Generates src/tokenizer/unicode_tables.h and src/tokenizer/unicode_tables.cpp for barellm's tokenizer.

The data comes from `unicodedataplus`, Python's `unicodedata` module with a newer Unicode
database and a few more properties (among them the age of each character), pinned to
Unicode 16.0: the version Hugging Face `tokenizers` 0.23 uses through Oniguruma (`\p{L}`,
`\p{N}` in pre-tokenizer regexes) and Rust's standard library (`char::is_numeric`).
Python's own `unicodedata` is older (3.11 ships Unicode 14) and would misclassify ~9000
letters.

Its NFC, however, comes from the `unicode-normalization-alignments` crate, whose tables
are Unicode 9.0 (verified: it does not reorder the combining marks added since). The NFC
tables below therefore hold only characters assigned by Unicode 9.0; the normalization
data of a character never changes once assigned, so this is Unicode 9.0's NFC.

    pip install unicodedataplus==16.0.0.post1
    python3 scripts/gen_unicode_tables.py

Tables written:
  - general category (two-letter, such as Lu or Nd) of every code point, as ranges;
  - canonical combining class, as ranges (Unicode 9.0);
  - full canonical decompositions (Hangul syllables excluded: they are algorithmic) (9.0);
  - canonical compositions of primary composites (what NFC may recompose) (9.0);
  - code points NFC may change (quick check No/Maybe, or non-zero combining class) (9.0).
"""

import os
import sys

import unicodedataplus as ud

UNICODE_VERSION = "16.0.0"
NFC_UNICODE_VERSION = (9, 0)
MAX_CODE_POINT = 0x10FFFF
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3
HANGUL_V_FIRST, HANGUL_V_LAST = 0x1161, 0x1175  # jamo vowels compose with a leading L
HANGUL_T_FIRST, HANGUL_T_LAST = 0x11A8, 0x11C2  # jamo trailers compose with an LV syllable

# The general categories in the order of the generated enum: the groups L, M, N, P, S, Z and
# C (whose first letter they share) each occupy consecutive values, and there are fewer than
# 32 so that a set of them fits in a 32-bit mask. Cn is every unassigned code point.
GENERAL_CATEGORIES = ["Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No",
                      "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So",
                      "Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"]

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def code_points():
    return range(MAX_CODE_POINT + 1)


def char(cp):
    return chr(cp)


def category_ranges():
    ranges = []
    for cp in code_points():
        category = ud.category(char(cp))
        if not ranges or ranges[-1][1] != category:
            ranges.append((cp, category))
    return ranges


def in_nfc_version(cp):
    """Whether the code point was assigned by NFC_UNICODE_VERSION."""
    age = ud.age(char(cp))
    if age == "Unassigned":
        return False
    return tuple(int(part) for part in age.split(".")) <= NFC_UNICODE_VERSION


def combining_class(cp):
    return ud.combining(char(cp)) if in_nfc_version(cp) else 0


def combining_class_ranges():
    """(first, last, class) for every run of code points with a non-zero class."""
    ranges = []
    for cp in code_points():
        ccc = combining_class(cp)
        if ccc == 0:
            continue
        if ranges and ranges[-1][1] == cp - 1 and ranges[-1][2] == ccc:
            ranges[-1] = (ranges[-1][0], cp, ccc)
        else:
            ranges.append((cp, cp, ccc))
    return ranges


def is_surrogate(cp):
    return 0xD800 <= cp <= 0xDFFF


def decompositions():
    """(code point, full canonical decomposition) for every decomposable non-Hangul code point."""
    result = []
    for cp in code_points():
        if is_surrogate(cp) or HANGUL_FIRST <= cp <= HANGUL_LAST or not in_nfc_version(cp):
            continue
        nfd = ud.normalize("NFD", char(cp))
        if nfd != char(cp):
            result.append((cp, [ord(c) for c in nfd]))
    return result


def compositions():
    """(first, second, composite) for every primary composite: a canonical pair decomposition
    that NFC recomposes (composition exclusions and non-starter decompositions drop out)."""
    result = []
    for cp in code_points():
        if is_surrogate(cp) or HANGUL_FIRST <= cp <= HANGUL_LAST or not in_nfc_version(cp):
            continue
        mapping = ud.decomposition(char(cp))
        if not mapping or mapping.startswith("<"):
            continue
        parts = [int(p, 16) for p in mapping.split()]
        if len(parts) == 2 and ud.normalize("NFC", char(cp)) == char(cp):
            result.append((parts[0], parts[1], cp))
    result.sort()
    return result


def nfc_sensitive_ranges(composition_table):
    """Runs of code points that NFC may change or that may change their neighbours."""
    second_elements = {second for _, second, _ in composition_table}
    sensitive = []
    for cp in code_points():
        if is_surrogate(cp) or not in_nfc_version(cp):
            continue
        c = char(cp)
        hangul_joiner = (HANGUL_V_FIRST <= cp <= HANGUL_V_LAST
                         or HANGUL_T_FIRST <= cp <= HANGUL_T_LAST)
        if (combining_class(cp) != 0 or ud.normalize("NFC", c) != c or cp in second_elements
                or hangul_joiner):
            if sensitive and sensitive[-1][1] == cp - 1:
                sensitive[-1] = (sensitive[-1][0], cp)
            else:
                sensitive.append((cp, cp))
    return sensitive


def rows(items, width=100):
    """The items, indented and packed into lines of at most `width` characters."""
    lines = []
    for item in items:
        if lines and len(lines[-1]) + 1 + len(item) <= width:
            lines[-1] += " " + item
        else:
            lines.append("    " + item)
    return "\n".join(lines)


HEADER = """// Generated by scripts/gen_unicode_tables.py from Unicode {version}. Do not edit.
// Unicode character data for the tokenizer: general categories (Unicode {version}),
// and for NFC canonical combining classes, decompositions and compositions (of the
// characters of Unicode {nfc_version}, as Hugging Face's NFC has them).
#pragma once
#include <cstddef>
#include <cstdint>

namespace barellm::unicode {{

// The two-letter general categories. Those of one group (L, M, N, P, S, Z, C) are
// consecutive, from the first listed to the last; Cn is every unassigned code point.
enum class GeneralCategory : uint8_t {{
{categories}
}};
constexpr int kGeneralCategoryCount = {category_count};

// The category of code points [first, next range's first).
struct CategoryRange {{
    char32_t first;
    GeneralCategory category;
}};
extern const CategoryRange kCategoryRanges[];
extern const size_t kCategoryRangeCount;

// Code points [first, last] have canonical combining class `combining_class`; all others 0.
struct CombiningClassRange {{
    char32_t first;
    char32_t last;
    uint8_t combining_class;
}};
extern const CombiningClassRange kCombiningClassRanges[];
extern const size_t kCombiningClassRangeCount;

// `code_point` decomposes canonically (fully, recursively) into
// kDecompositionData[offset .. offset + length). Sorted by code point.
struct Decomposition {{
    char32_t code_point;
    uint16_t offset;
    uint8_t length;
}};
extern const Decomposition kDecompositions[];
extern const size_t kDecompositionCount;
extern const char32_t kDecompositionData[];

// `first` followed by `second` composes to `composite`. Sorted by (first, second).
struct Composition {{
    char32_t first;
    char32_t second;
    char32_t composite;
}};
extern const Composition kCompositions[];
extern const size_t kCompositionCount;

// Code points [first, last] may be changed by NFC or change their neighbours; text without
// any of them is already in NFC.
struct CodePointRange {{
    char32_t first;
    char32_t last;
}};
extern const CodePointRange kNfcSensitiveRanges[];
extern const size_t kNfcSensitiveRangeCount;

}}  // namespace barellm::unicode
"""

SOURCE = """// Generated by scripts/gen_unicode_tables.py from Unicode {version}. Do not edit.
#include "unicode_tables.h"

// clang-format off
namespace barellm::unicode {{

const CategoryRange kCategoryRanges[] = {{
{category_ranges}
}};
const size_t kCategoryRangeCount = sizeof(kCategoryRanges) / sizeof(kCategoryRanges[0]);

const CombiningClassRange kCombiningClassRanges[] = {{
{ccc_ranges}
}};
const size_t kCombiningClassRangeCount =
    sizeof(kCombiningClassRanges) / sizeof(kCombiningClassRanges[0]);

const Decomposition kDecompositions[] = {{
{decompositions}
}};
const size_t kDecompositionCount = sizeof(kDecompositions) / sizeof(kDecompositions[0]);

const char32_t kDecompositionData[] = {{
{decomposition_data}
}};

const Composition kCompositions[] = {{
{compositions}
}};
const size_t kCompositionCount = sizeof(kCompositions) / sizeof(kCompositions[0]);

const CodePointRange kNfcSensitiveRanges[] = {{
{nfc_sensitive}
}};
const size_t kNfcSensitiveRangeCount =
    sizeof(kNfcSensitiveRanges) / sizeof(kNfcSensitiveRanges[0]);

}}  // namespace barellm::unicode
// clang-format on
"""


def main():
    if ud.unidata_version != UNICODE_VERSION:
        sys.exit(f"need unicodedataplus for Unicode {UNICODE_VERSION}, found "
                 f"{ud.unidata_version} (pip install unicodedataplus=={UNICODE_VERSION}.post1)")
    composition_table = compositions()
    decomposition_table = decompositions()

    data, index = [], []
    for cp, parts in decomposition_table:
        index.append(f"{{0x{cp:X}, {len(data)}, {len(parts)}}},")
        data.extend(parts)

    header = HEADER.format(
        version=UNICODE_VERSION,
        nfc_version=".".join(map(str, NFC_UNICODE_VERSION)),
        categories="\n".join(f"    {name}," for name in GENERAL_CATEGORIES),
        category_count=len(GENERAL_CATEGORIES))
    source = SOURCE.format(
        version=UNICODE_VERSION,
        category_ranges=rows([f"{{0x{cp:X}, GeneralCategory::{cat}}},"
                              for cp, cat in category_ranges()]),
        ccc_ranges=rows([f"{{0x{a:X}, 0x{b:X}, {c}}}," for a, b, c in combining_class_ranges()]),
        decompositions=rows(index),
        decomposition_data=rows([f"0x{cp:X}," for cp in data]),
        compositions=rows([f"{{0x{a:X}, 0x{b:X}, 0x{c:X}}}," for a, b, c in composition_table]),
        nfc_sensitive=rows([f"{{0x{a:X}, 0x{b:X}}},"
                            for a, b in nfc_sensitive_ranges(composition_table)]))

    with open(os.path.join(ROOT, "src", "unicode_tables.h"), "w") as f:
        f.write(header)
    with open(os.path.join(ROOT, "src", "unicode_tables.cpp"), "w") as f:
        f.write(source)


if __name__ == "__main__":
    main()

"""The part of Oniguruma's regex syntax that barellm's tokenizer runs, checked at conversion.

barellm matches the Regex patterns of Split pre-tokenizers with its own engine, which
compiles a subset of the syntax (listed in src/tokenizer/regex.h) and refuses any other construct
when it loads the tokenizer. check_regex() refuses the same patterns here, with the same
message, so that such a tokenizer is refused at conversion already.

This mirrors the parser of src/tokenizer/regex.cpp, decision for decision, but only parses: it builds
no character sets and matches nothing. tests/test_regex_subset.py keeps the two in agreement
(through build/regex_check) on the patterns of real tokenizers and on thousands of generated
ones: a change to what src/tokenizer/regex.cpp accepts is made here too.
"""

import math
import string

from common import ConvertError

MAX_CODE_POINT = 0x10FFFF
MAX_REPEAT_COUNT = 100000  # Oniguruma refuses larger repeat counts too
UNBOUNDED = math.inf
# src/tokenizer/regex.cpp's limits that keep a hostile pattern from exhausting the stack or memory.
MAX_GROUP_NESTING = 64
MAX_INSTRUCTIONS = 10000
MAX_ALTERNATIVES = 64  # of one Branch instruction; more take a Branch each 63

# The general categories \p{...} accepts, short and long names, as Oniguruma compares them:
# lower case, without spaces, '-' and '_'.
GENERAL_CATEGORIES = {
    "l", "letter", "lc", "casedletter", "lu", "uppercaseletter", "ll", "lowercaseletter",
    "lt", "titlecaseletter", "lm", "modifierletter", "lo", "otherletter",
    "m", "mark", "mn", "nonspacingmark", "mc", "spacingmark", "me", "enclosingmark",
    "n", "number", "nd", "decimalnumber", "nl", "letternumber", "no", "othernumber",
    "p", "punctuation", "pc", "connectorpunctuation", "pd", "dashpunctuation",
    "ps", "openpunctuation", "pe", "closepunctuation", "pi", "initialpunctuation",
    "pf", "finalpunctuation", "po", "otherpunctuation",
    "s", "symbol", "sm", "mathsymbol", "sc", "currencysymbol", "sk", "modifiersymbol",
    "so", "othersymbol",
    "z", "separator", "zs", "spaceseparator", "zl", "lineseparator",
    "zp", "paragraphseparator",
    "c", "other", "cc", "control", "cf", "format", "cs", "surrogate", "co", "privateuse",
    "cn", "unassigned",
}
CONTROL_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f", "v": "\v", "a": "\a",
                   "e": "\x1b"}
ASCII_PUNCTUATION_OR_SPACE = frozenset(string.punctuation + " ")
HEX_DIGITS = frozenset(string.hexdigits)
# Case-insensitive text that Unicode case folding also matches as one character.
MULTI_CHAR_FOLDS = ("ss", "st", "ff", "fi", "fl")


def check_regex(pattern):
    """Raise ConvertError when barellm cannot compile `pattern` (a str); the message, as
    src/tokenizer/regex.cpp words it, names the pattern and its first unsupported construct."""
    try:
        pattern.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, which JSON's \\uD800 can produce
        printable = pattern.encode("utf-8", "backslashreplace").decode("utf-8")
        raise ConvertError(f"regex {quoted(printable)} is not supported: text that is not "
                           "valid UTF-8 (at offset 0)") from None
    root = _Parser(pattern).parse()
    if _instruction_count(root) + 1 > MAX_INSTRUCTIONS:  # + 1: the final Match
        raise ConvertError(f"regex {quoted(pattern)} is not supported: it is too large once "
                           "its counted repeats are written out (more than "
                           f"{MAX_INSTRUCTIONS} instructions)")


def quoted(text):
    """`text` in quotes, control characters escaped, as barellm quotes it in messages."""
    escaped = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return "'" + "".join(
        escaped.get(c) or (f"\\x{ord(c):02X}" if ord(c) < 0x20 or c == "\x7f" else c)
        for c in text) + "'"


# ---------------------------------------------------------------------------- syntax tree


class _Node:
    """A node of src/tokenizer/regex.cpp's syntax tree, without its characters: its kind (empty,
    char, sequence, alternation, repeat, anchor or lookahead), children and repeat bounds."""

    def __init__(self, kind, children=(), low=0, high=0):
        self.kind, self.children, self.low, self.high = kind, list(children), low, high


def _list_node(kind, children):
    """A sequence or alternation of `children`, or the only child itself."""
    if len(children) == 1:
        return children[0]
    return _Node(kind if children else "empty", children)


def _can_be_empty(node):
    if node.kind == "char":
        return False
    if node.kind == "sequence":
        return all(map(_can_be_empty, node.children))
    if node.kind == "alternation":
        return any(map(_can_be_empty, node.children))
    if node.kind == "repeat":
        return node.low == 0 or _can_be_empty(node.children[0])
    return True  # empty, anchors and lookaheads


def _instruction_count(node):
    """How many instructions src/tokenizer/regex.cpp's compiler writes for `node`."""
    if node.kind == "empty":
        return 0
    if node.kind in ("char", "anchor"):
        return 1
    sizes = [_instruction_count(child) for child in node.children]
    if node.kind == "sequence":
        return sum(sizes)
    if node.kind == "lookahead":
        return sizes[0] + 2  # LookAhead ... Match
    if node.kind == "alternation":
        # A Branch of up to 64 alternatives, whose last is a Branch of the rest past 64,
        # and a Jump to the end after each alternative but the last.
        branches, rest = 1, len(sizes)
        while rest > MAX_ALTERNATIVES:
            branches, rest = branches + 1, rest - (MAX_ALTERNATIVES - 1)
        return branches + sum(sizes) + len(sizes) - 1
    child, size = node.children[0], sizes[0]  # a repeat
    if child.kind == "char":
        return 1  # one CharRepeat
    if node.high == UNBOUNDED:
        return node.low * size + size + 2  # min copies, then Branch, a copy, Jump
    return node.low * size + (node.high - node.low) * (size + 1)  # then Branch, copy


# ---------------------------------------------------------------------------- the parser


class _Parser:
    """src/tokenizer/regex.cpp's Parser, method for method. Positions are indices into the str;
    messages give them as byte offsets into its UTF-8, as barellm does."""

    def __init__(self, pattern):
        self.pattern = pattern
        self.pos = 0

    def parse(self):
        root = self.parse_alternation(0, False)
        if self.pos < len(self.pattern):
            self.refuse("')' without a matching '('", self.pos)
        return root

    def refuse(self, construct, at):
        offset = len(self.pattern[:at].encode("utf-8"))
        raise ConvertError(f"regex {quoted(self.pattern)} is not supported: {construct} "
                           f"(at offset {offset})")

    def at_end(self):
        return self.pos >= len(self.pattern)

    def peek(self, ahead=0):
        """The character `ahead` characters on; "\\0" past the end, as in barellm."""
        at = self.pos + ahead
        return self.pattern[at] if at < len(self.pattern) else "\0"

    def accept(self, text):
        if not self.pattern.startswith(text, self.pos):
            return False
        self.pos += len(text)
        return True

    def text_from(self, start):
        """The pattern's text from `start` to here, quoted, for messages."""
        return quoted(self.pattern[start:self.pos])

    # ------------------------------------------------------------------ structure

    def parse_alternation(self, depth, ignore_case):
        alternatives = [self.parse_sequence(depth, ignore_case)]
        while self.accept("|"):
            alternatives.append(self.parse_sequence(depth, ignore_case))
        return _list_node("alternation", alternatives)

    def parse_sequence(self, depth, ignore_case):
        start = self.pos
        items = []
        while not self.at_end() and self.peek() not in "|)":
            item_start = self.pos
            item = self.parse_case_insensitive_char() if ignore_case else self.parse_atom(depth)
            items.append(self.parse_quantifier(item, item_start, ignore_case))
        if ignore_case:
            self.refuse_multi_char_folds(start)
        return _list_node("sequence", items)

    def parse_atom(self, depth):
        start = self.pos
        c = self.peek()
        if c == "(":
            return self.parse_group(depth)
        if c == "[":
            self.pos += 1
            self.parse_class(start)
            return _Node("char")
        if c in "^$":
            self.pos += 1
            return _Node("anchor")
        if c == "\\":
            return self.parse_escape()
        if c in "?*+":
            self.refuse(f"quantifier '{c}' with nothing to repeat", start)
        if c == "{":
            self.refuse("'{' that is not a quantifier after something to repeat (write \\{)",
                        start)
        self.pos += 1  # '.' or a literal character
        return _Node("char")

    def parse_group(self, depth):
        start = self.pos
        if depth + 1 > MAX_GROUP_NESTING:
            self.refuse(f"groups nested deeper than {MAX_GROUP_NESTING}", start)
        if self.accept("(?:"):
            node = self.parse_alternation(depth + 1, False)
        elif self.accept("(?i:"):
            node = self.parse_alternation(depth + 1, True)
        elif self.accept("(?=") or self.accept("(?!"):
            node = _Node("lookahead", [self.parse_alternation(depth + 1, False)])
        elif self.accept("(?"):
            self.refuse_group_kind(start)
        else:
            self.pos += 1  # a capturing group, which is (?:...) here
            node = self.parse_alternation(depth + 1, False)
        if not self.accept(")"):
            self.refuse("'(' without a matching ')'", start)
        return node

    def refuse_group_kind(self, start):
        if self.accept("<=") or self.accept("<!"):
            self.refuse("lookbehind " + self.text_from(start), start)
        if self.peek() in "<P'":
            self.refuse("named group " + self.text_from(start), start)
        kinds = {">": "atomic group", "#": "comment group", "~": "absence operator",
                 "(": "conditional group"}
        if self.peek() in kinds:
            self.refuse(f"{kinds[self.peek()]} '(?{self.peek()}'", start)
        while not self.at_end() and self.peek() not in ":)":
            self.pos += 1
        if not self.at_end():
            self.pos += 1
        self.refuse(f"option group {self.text_from(start)} (only (?i: holding alternatives "
                    "of ASCII text is supported)", start)

    # ------------------------------------------------------------------ quantifiers

    def parse_quantifier_bounds(self):
        """(min, max) of a quantifier at the current position, consumed; None when there
        is no quantifier."""
        start = self.pos
        if self.accept("?"):
            return 0, 1
        if self.accept("*"):
            return 0, UNBOUNDED
        if self.accept("+"):
            return 1, UNBOUNDED
        if not self.accept("{"):
            return None
        low = self.parse_count(start)
        if self.accept("}"):
            if low is None:
                self.refuse_brace(start)
            return low, low
        if not self.accept(","):
            self.refuse_brace(start)
        high = self.parse_count(start)
        if not self.accept("}") or (low is None and high is None):
            self.refuse_brace(start)
        low = low or 0
        high = UNBOUNDED if high is None else high
        if low > high:
            self.refuse(f"quantifier {self.text_from(start)} with n > m", start)
        return low, high

    def parse_count(self, quantifier_start):
        if not "0" <= self.peek() <= "9":
            return None
        count = 0
        while "0" <= self.peek() <= "9":
            count = count * 10 + int(self.peek())
            self.pos += 1
            if count > MAX_REPEAT_COUNT:
                self.refuse(f"repeat count above {MAX_REPEAT_COUNT}", quantifier_start)
        return count

    def refuse_brace(self, start):
        self.refuse("'{' that is not a quantifier {n}, {n,}, {n,m} or {,m} (write \\{)", start)

    def parse_quantifier(self, item, item_start, ignore_case):
        """`item`, or `item` repeated by the quantifier at the current position."""
        start = self.pos
        bounds = self.parse_quantifier_bounds()
        if bounds is None:
            return item
        if ignore_case:
            self.refuse(f"quantifier {self.text_from(start)} inside (?i:...)", start)
        second = self.pos
        quantifier = quoted(self.pattern[start:second])
        if self.pattern[start] != "{" and self.peek() in "?+":
            kind = "lazy" if self.peek() == "?" else "possessive"
            self.pos += 1
            self.refuse(f"{kind} quantifier {self.text_from(start)}", start)
        if self.parse_quantifier_bounds() is not None:
            self.refuse(f"quantifier {self.text_from(second)} after the quantifier "
                        f"{quantifier}", second)
        if item.kind in ("anchor", "lookahead"):
            self.refuse(f"quantifier {quantifier} on an assertion", start)
        if _can_be_empty(item):
            self.refuse(f"quantifier on {quoted(self.pattern[item_start:start])}, which can "
                        "match the empty string", start)
        return _Node("repeat", [item], *bounds)

    # ------------------------------------------------------------------ (?i:...)

    def parse_case_insensitive_char(self):
        start = self.pos
        c = self.peek()
        if c == "\\" and self.peek(1) in ASCII_PUNCTUATION_OR_SPACE:
            self.pos += 2
        elif c in "\\([.^$?*+{":
            self.refuse(f"'{c}' inside (?i:...) (only ASCII text is supported there)", start)
        else:
            self.pos += 1
            if ord(c) >= 0x80:
                self.refuse(f"non-ASCII character {self.text_from(start)} inside (?i:...)",
                            start)
        return _Node("char")

    def refuse_multi_char_folds(self, start):
        """Oniguruma folds the text of an alternative as a whole, so that (?i:ss) also
        matches U+00DF; barellm does not, and refuses it."""
        text = self.pattern[start:self.pos].replace("\\", "").lower()  # ASCII only here
        for fold in MULTI_CHAR_FOLDS:
            if fold in text:
                self.refuse(f"case-insensitive '{fold}', which Unicode case folding also "
                            "matches as one character", start)

    # ------------------------------------------------------------------ escapes

    def parse_char_escape(self):
        """The code point of an escape that stands for one character (\\n, \\u00E9, \\.),
        consumed; None when the escape is not one."""
        start = self.pos
        c = self.peek(1)
        if c in CONTROL_ESCAPES:
            self.pos += 2
            return ord(CONTROL_ESCAPES[c])
        if c in ASCII_PUNCTUATION_OR_SPACE:
            self.pos += 2
            return ord(c)
        if c == "u":
            self.pos += 2
            return self.checked_code_point(self.parse_hex(4, 4, start), start)
        if c == "x":
            self.pos += 2
            if self.accept("{"):
                cp = self.parse_hex(1, 8, start)
                if not self.accept("}"):
                    self.refuse("unterminated '\\x{'", start)
                return self.checked_code_point(cp, start)
            cp = self.parse_hex(1, 2, start)
            if cp >= 0x80:
                self.refuse(f"{self.text_from(start)} (a byte, not a character, in Oniguruma)",
                            start)
            return cp
        return None

    def parse_hex(self, min_digits, max_digits, start):
        value = digits = 0
        while digits < max_digits and self.peek() in HEX_DIGITS:
            value = value * 16 + int(self.peek(), 16)
            self.pos += 1
            digits += 1
        if digits < min_digits:
            self.refuse(f"escape {self.text_from(start)} without hex digits", start)
        return value

    def checked_code_point(self, cp, start):
        if cp > MAX_CODE_POINT or 0xD800 <= cp <= 0xDFFF:
            self.refuse(f"escape {self.text_from(start)}, which is not a character", start)
        return cp

    def parse_set_escape(self):
        """Consumes an escape that stands for a set of characters (\\s \\S \\d \\D \\p{..}
        \\P{..}); False when the escape is not one."""
        if self.peek(1) in "sSdD":
            self.pos += 2
            return True
        if self.peek(1) in "pP":
            self.parse_property()
            return True
        return False

    def parse_property(self):
        start = self.pos
        self.pos += 2
        if not self.accept("{"):
            self.refuse(f"property {self.text_from(start)} without {{name}}", start)
        self.accept("^")
        name = ""
        while not self.at_end() and self.peek() != "}":
            if self.peek() not in " -_":
                name += self.peek().lower() if "A" <= self.peek() <= "Z" else self.peek()
            self.pos += 1
        if not self.accept("}"):
            self.refuse(f"unterminated property {self.text_from(start)}", start)
        if name not in GENERAL_CATEGORIES:
            self.refuse(f"property {self.text_from(start)} (only general categories are "
                        "supported)", start)

    def refuse_escape(self, start):
        if self.pos + 1 >= len(self.pattern):
            self.refuse("'\\' at the end of the pattern", start)
        c = self.peek(1)
        self.pos += 2
        if "1" <= c <= "9":
            self.refuse(f"backreference {self.text_from(start)}", start)
        kinds = {"0": "octal escape", "k": "group reference", "g": "group reference",
                 "w": "word characters", "W": "word characters", "b": "word boundary",
                 "B": "word boundary", "h": "hexadecimal digits", "H": "hexadecimal digits"}
        self.refuse(f"{kinds.get(c, 'escape')} {self.text_from(start)}", start)

    def parse_escape(self):
        start = self.pos
        if self.parse_char_escape() is not None or self.parse_set_escape():
            return _Node("char")
        if self.peek(1) in "AzZ":  # \A, \z, \Z
            self.pos += 2
            return _Node("anchor")
        self.refuse_escape(start)

    # ------------------------------------------------------------------ classes [...]

    def parse_class_item(self, first, class_start):
        """The code point of a class member that is one character, or None for a set."""
        start = self.pos
        if self.at_end():
            self.refuse("'[' without a matching ']'", class_start)
        c = self.peek()
        if c == "[":
            self.refuse("nested class or POSIX bracket '['", start)
        if c == "&" and self.peek(1) == "&":
            self.refuse("class intersection '&&'", start)
        if c == "-" and not first and self.peek(1) != "]" and self.pos + 1 < len(self.pattern):
            self.refuse("'-' that neither forms a range nor starts or ends the class "
                        "(write \\-)", start)
        if c == "\\":
            cp = self.parse_char_escape()
            if cp is not None:
                return cp
            if self.parse_set_escape():
                return None
            self.refuse_escape(start)
        self.pos += 1
        return ord(c)

    def parse_class(self, class_start):
        """A class, from after its '['."""
        self.accept("^")
        if self.peek() == "]":
            self.refuse("']' at the start of a class (empty class, or write \\])", self.pos)
        first = True
        while not self.accept("]"):
            item_start = self.pos
            low = self.parse_class_item(first, class_start)
            first = False
            if self.peek() != "-" or self.peek(1) == "]" or self.pos + 1 >= len(self.pattern):
                continue
            self.pos += 1  # '-'
            high = self.parse_class_item(False, class_start)
            if low is None or high is None:
                self.refuse(f"range {self.text_from(item_start)} with a set at one end",
                            item_start)
            if high < low:
                self.refuse(f"range {self.text_from(item_start)} out of order", item_start)

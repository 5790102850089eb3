"""The code links of docs/TOUR.md: where each names a definition, and on which line.

A code link is a markdown link whose text is one identifier in backticks, possibly
qualified, and whose target is a source file relative to docs/, with a line anchor:

    [`cpu::rope`](../src/cpu/dispatch.cpp#L250)    [`CudaBackend::forward`](../kernels/forward.cu#L812)

The file must exist and define the identifier: a function definition (a body follows the
parameter list: a call, a declaration or a mention in a comment does not count), a
class/struct/enum, a constant, or a member of the named class. Each qualifier must be a
namespace opened in that file or a class/struct defined there (then the member must be
defined inside it), unless the definition itself is written qualified (`void
scalar::matvec_rows(...) {`). Python files: `def name` or `class name`.

The anchor `#Lnn` is the line of that definition where the name is written (the first
definition, when there are several). Line numbers move as the code changes:
scripts/update_tour_links.py rewrites every anchor to the current line, and
tests/test_tour.py fails, naming that script, when one is stale. Every other relative link
must point to an existing file, and a link to a markdown heading (`BENCHMARKS.md#anchor`,
`#anchor`) to an existing heading."""

import os
import re

CODE_EXTENSIONS = (".cpp", ".h", ".cu", ".cuh", ".py")
LINK = re.compile(r"\[([^\]\n]+)\]\(([^)\s]+)\)")
IDENTIFIER = re.compile(r"^[A-Za-z_]\w*(::[A-Za-z_]\w*)*$")
LINE_ANCHOR = re.compile(r"^L([1-9]\d*)$")
UPDATE_COMMAND = "python3 scripts/update_tour_links.py"

# String literals (raw ones first) are kept; comments become blanks of the same length,
# so offsets and line breaks survive.
_CPP_TOKENS = re.compile(r'R"([^(\s]*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\''
                         r"|//[^\n]*|/\*.*?\*/", re.S)
_AFTER_PARAMETERS = re.compile(
    r"\s*(?:(?:const|override|final|noexcept|mutable|volatile|&|&&)\s*)*(?:->[^;{}]*)?$")


def strip_cpp_comments(text):
    def blank(match):
        token = match.group(0)
        if token.startswith("//") or token.startswith("/*"):
            return re.sub(r"[^\n]", " ", token)
        return token
    return _CPP_TOKENS.sub(blank, text)


def matching(text, open_index, opener, closer):
    """Index just past the bracket that closes text[open_index], or None."""
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == opener:
            depth += 1
        elif text[i] == closer:
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def function_definition(code, name, prefix=""):
    """Offset of `name` where `code` defines function `prefix + name` (`name(...)` followed
    by a body), or None."""
    pattern = re.compile(r"(?<![\w.>])" + re.escape(prefix) + r"(" + re.escape(name) + r")\s*\(")
    if not prefix:  # unqualified: not preceded by `x::` either (a call like cpu::rope(...))
        pattern = re.compile(r"(?<![\w.>:])(" + re.escape(name) + r")\s*\(")
    for match in pattern.finditer(code):
        close = matching(code, match.end() - 1, "(", ")")
        if close is None:
            continue
        rest = code[close:close + 2000]
        end = re.search(r"[;{}]", rest)
        if not end or end.group(0) != "{":
            continue
        between = rest[:end.start()]
        # A constructor's member-initializer list (`: a_(x), b_(y) {`) or trailing qualifiers.
        if between.lstrip().startswith(":") and not between.lstrip().startswith("::"):
            return match.start(1)
        if _AFTER_PARAMETERS.match(between):
            return match.start(1)
    return None


def type_definitions(code, name):
    """(offset of the name, body start, body end) of every class/struct/union/enum `name`
    defined in code."""
    found = []
    pattern = re.compile(r"\b(?:class|struct|union|enum(?:\s+class)?)\s+(?:\w+::)*("
                         + re.escape(name) + r")\b[^;{()]*\{")
    for match in pattern.finditer(code):
        end = matching(code, match.end() - 1, "{", "}")
        if end is not None:
            found.append((match.start(1), match.end(), end))
    return found


def variable_definition(code, name):
    """Offset of `name` in a constant or a member/variable declaration (not a use), or None."""
    constant = re.compile(r"\b(?:constexpr|const|static)\b[^;(){}]*?[\w>*&\]]\s+("
                          + re.escape(name) + r")\s*(?:=|\{|\[|;)")
    declaration = re.compile(r"^[ \t]*(?!(?:return|throw|delete|case|else|goto)\b)"
                             r"(?:[\w:<>,*&]+[ \t*&]+)+(" + re.escape(name)
                             + r")\s*(?:=[^=]|\{|\[|;|,)", re.M)
    alias = re.compile(r"\busing\s+(" + re.escape(name) + r")\s*=")
    offsets = [m.start(1) for p in (constant, declaration, alias) for m in [p.search(code)] if m]
    return min(offsets) if offsets else None


def any_definition(code, name, prefix=""):
    """Offset of the first definition of `name` of any kind, or None."""
    offsets = [function_definition(code, name, prefix)]
    if not prefix:
        offsets += [start for start, _, _ in type_definitions(code, name)[:1]]
        offsets.append(variable_definition(code, name))
    offsets = [offset for offset in offsets if offset is not None]
    return min(offsets) if offsets else None


def opened_namespaces(code):
    names = set()
    for match in re.finditer(r"\bnamespace\s+([\w:]+)\s*\{", code):
        names.update(match.group(1).split("::"))
    return names


def locate_cpp(code, identifier):
    """(offset of the definition of `identifier`, None) or (None, why it is not defined)."""
    parts = identifier.split("::")
    name, qualifiers = parts[-1], parts[:-1]
    # Written qualified at the definition: `Tokenizer::encode(...) {`, `struct Tokenizer::Impl {`.
    for i in range(len(qualifiers)):
        prefix = "::".join(qualifiers[i:]) + "::"
        offset = function_definition(code, name, prefix)
        if offset is not None:
            return offset, None
        match = re.search(r"\b(?:class|struct)\s+" + re.escape(prefix) + r"(" + re.escape(name)
                          + r")\b[^;{()]*\{", code)
        if match:
            return match.start(1), None
    namespaces = opened_namespaces(code)
    for qualifier in qualifiers[:-1]:
        if qualifier not in namespaces and not type_definitions(code, qualifier):
            return None, (f"'{identifier}' is not defined there ('{qualifier}' is neither a "
                          "namespace nor a class in the file)")
    if qualifiers:
        owner = qualifiers[-1]
        bodies = type_definitions(code, owner)
        if bodies:
            for _, start, end in bodies:
                offset = any_definition(code[start:end], name)
                if offset is not None:
                    return start + offset, None
                # A method whose body is outside: `Owner::name(...) {` was tried above.
            return None, f"'{owner}' defines no '{name}'"
        if owner not in namespaces:
            return None, (f"'{identifier}' is not defined there ('{owner}' is neither a "
                          "namespace nor a class in the file)")
    offset = any_definition(code, name)
    if offset is not None:
        return offset, None
    return None, f"'{name}' is not defined there (mentioned or declared only, or absent)"


def check_cpp(code, identifier):
    """None when `identifier` (possibly qualified) is defined in `code`, else why not."""
    return locate_cpp(code, identifier)[1]


def locate_python(code, identifier):
    name = identifier.split("::")[-1]
    match = re.search(r"^\s*(?:def|class)\s+(" + re.escape(name) + r")\b", code, re.M)
    if match:
        return match.start(1), None
    return None, f"'{name}' is not defined there"


def definition_line(identifier, path):
    """(1-based line of the definition of `identifier` in the file at `path`, None) or
    (None, why it is not defined there)."""
    with open(path, encoding="utf-8") as f:
        code = f.read()
    if path.endswith(".py"):
        offset, why = locate_python(code, identifier)
    else:
        offset, why = locate_cpp(strip_cpp_comments(code), identifier)
    if offset is None:
        return None, why
    return code.count("\n", 0, offset) + 1, None


def code_links(text, base_dir):
    """Every relative link of a markdown text: (match, label, path part, anchor, file path)."""
    for match in LINK.finditer(text):
        label, target = match.group(1), match.group(2)
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in this page
        path_part, _, anchor = target.partition("#")
        yield match, label, path_part, anchor, os.path.normpath(os.path.join(base_dir, path_part))


def heading_anchors(text):
    """The anchors GitHub gives the headings of a markdown text: lower case, punctuation
    dropped, spaces as hyphens, a repeated heading's anchor suffixed -1, -2... Lines in
    fenced code blocks are not headings."""
    anchors, seen, in_code = set(), {}, False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        heading = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if not heading:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))  # a link's text
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def markdown_anchor_problem(anchor, path):
    """None when the markdown file at `path` has a heading whose anchor is `anchor`."""
    with open(path, encoding="utf-8") as f:
        if anchor in heading_anchors(f.read()):
            return None
    return f"no heading of {os.path.basename(path)} has the anchor #{anchor}"


def check_document(text, base_dir):
    """(references checked, problems) for a markdown text whose links are relative to
    base_dir. A link to a heading (`FILE.md#anchor`, or `#anchor` in the same text) must
    name an existing heading."""
    problems, references = [], 0
    own_anchors = heading_anchors(text)
    for match in LINK.finditer(text):
        if match.group(2).startswith("#") and match.group(2)[1:] not in own_anchors:
            problems.append(f"{match.group(0)}: no heading here has the anchor {match.group(2)}")
    for match, label, path_part, anchor, path in code_links(text, base_dir):
        where = match.group(0)
        if not os.path.isfile(path):
            problems.append(f"{where}: {path_part} does not exist")
            continue
        if path.endswith(".md") and anchor:
            why = markdown_anchor_problem(anchor, path)
            if why:
                problems.append(f"{where}: {why}")
            continue
        if not path.endswith(CODE_EXTENSIONS):
            continue
        if not (label.startswith("`") and label.endswith("`")):
            if anchor:
                problems.append(f"{where}: a line anchor on a link that names no identifier "
                                "(write [`name`](file#Lnn))")
            continue  # a plain link to a file: existence is all there is to check
        identifier = label[1:-1]
        if not IDENTIFIER.match(identifier):
            problems.append(f"{where}: `{identifier}` is not an identifier (write name or "
                            "a::b, without parentheses)")
            continue
        references += 1
        line, why = definition_line(identifier, path)
        if why:
            problems.append(f"{where}: {why}")
        elif not anchor:
            problems.append(f"{where}: no line anchor (its definition is on line {line}; "
                            f"run `{UPDATE_COMMAND}`)")
        elif not LINE_ANCHOR.match(anchor):
            problems.append(f"{where}: '#{anchor}' is not a line anchor (#L<line>)")
        elif int(anchor[1:]) != line:
            problems.append(f"{where}: line {anchor[1:]} is stale, the definition is on line "
                            f"{line} (run `{UPDATE_COMMAND}`)")
    return references, problems


def update_anchors(text, base_dir):
    """(text with every code link's anchor set to its definition's current line, links
    changed, links left alone because their identifier is not defined where they point)."""
    changed, broken = 0, []
    pieces, last = [], 0
    for match, label, path_part, anchor, path in code_links(text, base_dir):
        if not (path.endswith(CODE_EXTENSIONS) and os.path.isfile(path)
                and label.startswith("`") and label.endswith("`")
                and IDENTIFIER.match(label[1:-1])):
            continue
        line, why = definition_line(label[1:-1], path)
        if why:
            broken.append(f"{match.group(0)}: {why}")
            continue
        link = f"[{label}]({path_part}#L{line})"
        if link != match.group(0):
            changed += 1
        pieces += [text[last:match.start()], link]
        last = match.end()
    pieces.append(text[last:])
    return "".join(pieces), changed, broken

"""docs/TOUR.md cannot rot: every code reference in it names something defined where it
points.

A code reference is a markdown link whose text is one identifier in backticks, possibly
qualified, and whose target is a source file relative to docs/:

    [`cpu::rope`](../src/cpu/kernels.cpp)        [`CudaBackend::forward`](../kernels/forward.cu)

The file must exist and define the identifier: a function definition (a body follows the
parameter list: a call, a declaration or a mention in a comment does not count), a
class/struct/enum, a constant, or a member of the named class. Each qualifier must be a
namespace opened in that file or a class/struct defined there (then the member must be
defined inside it), unless the definition itself is written qualified (`void
scalar::matmul_rows(...) {`). Python files: `def name` or `class name`. Every other
relative link must point to an existing file, and code links carry no line anchors (line
numbers rot)."""

import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOUR = os.path.join(REPO, "docs", "TOUR.md")

CODE_EXTENSIONS = (".cpp", ".h", ".cu", ".cuh", ".py")
LINK = re.compile(r"\[([^\]\n]+)\]\(([^)\s]+)\)")
IDENTIFIER = re.compile(r"^[A-Za-z_]\w*(::[A-Za-z_]\w*)*$")

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


def defines_function(code, name, prefix=""):
    """Whether `code` defines function `prefix + name`: `name(...)` followed by a body."""
    pattern = re.compile(r"(?<![\w.>])" + re.escape(prefix + name) + r"\s*\(")
    if not prefix:  # unqualified: not preceded by `x::` either (a call like cpu::rope(...))
        pattern = re.compile(r"(?<![\w.>:])" + re.escape(name) + r"\s*\(")
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
            return True
        if _AFTER_PARAMETERS.match(between):
            return True
    return False


def type_bodies(code, name):
    """(start, end) of the body of every class/struct/union/enum `name` defined in code."""
    bodies = []
    pattern = re.compile(r"\b(?:class|struct|union|enum(?:\s+class)?)\s+(?:\w+::)*"
                         + re.escape(name) + r"\b[^;{()]*\{")
    for match in pattern.finditer(code):
        end = matching(code, match.end() - 1, "{", "}")
        if end is not None:
            bodies.append((match.end(), end))
    return bodies


def defines_variable(code, name):
    """A constant or a member/variable declaration of `name` (not a use)."""
    constant = re.compile(r"\b(?:constexpr|const|static)\b[^;(){}]*?[\w>*&\]]\s+"
                          + re.escape(name) + r"\s*(?:=|\{|\[|;)")
    declaration = re.compile(r"^[ \t]*(?!(?:return|throw|delete|case|else|goto)\b)"
                             r"(?:[\w:<>,*&]+[ \t*&]+)+" + re.escape(name)
                             + r"\s*(?:=[^=]|\{|\[|;|,)", re.M)
    alias = re.compile(r"\busing\s+" + re.escape(name) + r"\s*=")
    return any(p.search(code) for p in (constant, declaration, alias))


def defines_anything(code, name, prefix=""):
    return (defines_function(code, name, prefix) or
            (not prefix and (type_bodies(code, name) or defines_variable(code, name))))


def opened_namespaces(code):
    names = set()
    for match in re.finditer(r"\bnamespace\s+([\w:]+)\s*\{", code):
        names.update(match.group(1).split("::"))
    return names


def check_cpp(code, identifier):
    """None when `identifier` (possibly qualified) is defined in `code`, else why not."""
    parts = identifier.split("::")
    name, qualifiers = parts[-1], parts[:-1]
    # Written qualified at the definition: `Tokenizer::encode(...) {`, `struct Tokenizer::Impl {`.
    for i in range(len(qualifiers)):
        prefix = "::".join(qualifiers[i:]) + "::"
        if defines_function(code, name, prefix):
            return None
        if re.search(r"\b(?:class|struct)\s+" + re.escape(prefix + name) + r"\b[^;{()]*\{", code):
            return None
    namespaces = opened_namespaces(code)
    for qualifier in qualifiers[:-1]:
        if qualifier not in namespaces and not type_bodies(code, qualifier):
            return (f"'{identifier}' is not defined there ('{qualifier}' is neither a "
                    "namespace nor a class in the file)")
    if qualifiers:
        owner = qualifiers[-1]
        bodies = type_bodies(code, owner)
        if bodies:
            for start, end in bodies:
                if defines_anything(code[start:end], name):
                    return None
                # A method whose body is outside: `Owner::name(...) {` was tried above.
            return f"'{owner}' defines no '{name}'"
        if owner not in namespaces:
            return (f"'{identifier}' is not defined there ('{owner}' is neither a "
                    "namespace nor a class in the file)")
    if defines_anything(code, name):
        return None
    return f"'{name}' is not defined there (mentioned or declared only, or absent)"


def check_python(code, identifier):
    name = identifier.split("::")[-1]
    if re.search(r"^\s*(?:def|class)\s+" + re.escape(name) + r"\b", code, re.M):
        return None
    return f"'{name}' is not defined there"


def check_reference(identifier, path):
    with open(path, encoding="utf-8") as f:
        code = f.read()
    if path.endswith(".py"):
        return check_python(code, identifier)
    return check_cpp(strip_cpp_comments(code), identifier)


def check_document(text, base_dir):
    """(references checked, problems) for a markdown text whose links are relative to
    base_dir."""
    problems, references = [], 0
    for match in LINK.finditer(text):
        label, target = match.group(1), match.group(2)
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor in this page
        path_part, _, anchor = target.partition("#")
        path = os.path.normpath(os.path.join(base_dir, path_part))
        where = f"[{label}]({target})"
        if not os.path.isfile(path):
            problems.append(f"{where}: {path_part} does not exist")
            continue
        if not path.endswith(CODE_EXTENSIONS):
            continue
        if anchor:
            problems.append(f"{where}: no line anchors on code links (line numbers rot)")
        if not (label.startswith("`") and label.endswith("`")):
            continue  # a plain link to a file: existence is all there is to check
        identifier = label[1:-1]
        if not IDENTIFIER.match(identifier):
            problems.append(f"{where}: `{identifier}` is not an identifier (write name or "
                            "a::b, without parentheses)")
            continue
        references += 1
        why = check_reference(identifier, path)
        if why:
            problems.append(f"{where}: {why}")
    return references, problems


def read_tour():
    with open(TOUR, encoding="utf-8") as f:
        return f.read()


def test_every_code_reference_in_the_tour_is_defined_where_it_points():
    references, problems = check_document(read_tour(), os.path.dirname(TOUR))
    assert not problems, "docs/TOUR.md has broken references:\n" + "\n".join(problems)
    assert references >= 60, f"only {references} code references: did the link syntax change?"


def test_the_tour_covers_every_step_of_the_forward_pass():
    text = read_tour()
    for step in ["cpu::embedding_row", "cpu::rmsnorm", "cpu::matmul", "cpu::rope",
                 "cpu::kv_store", "cpu::attention", "cpu::swiglu", "Sampler::sample",
                 "Tokenizer::encode", "CudaBackend::forward", "matvec_kernel",
                 "rope_kv_kernel", "attention_split_kernel", "embedding_kernel",
                 # the GPU ladder's simple kernels
                 "matvec_thread_per_row_kernel", "matvec_warp_per_row_kernel",
                 "matvec_swiglu_warp_per_row_kernel", "rmsnorm_kernel", "rope_kernel",
                 "store_kv_row_kernel", "residual_add_kernel", "swiglu_kernel",
                 "attention_naive_kernel"]:
        assert f"[`{step}`]" in text, f"the tour does not link {step}"
    assert "Run on one GPU only" in text  # how far the CUDA path is verified


@pytest.mark.parametrize("link, reason", [
    ("[`cpu::no_such_kernel`](../src/cpu/kernels.cpp)", "is not defined"),
    ("[`cpu::rope`](../src/cpu/forward.cpp)", "neither a namespace"),  # called there only
    ("[`measure_read_bandwidth`](../src/ladder.cpp)", "is not defined"),  # called there only
    ("[`cpu::matmul`](../src/cpu/kernels.h)", "is not defined"),  # declared only
    ("[`rope`](../src/nowhere.cpp)", "does not exist"),
    ("[`CpuBackend::forward`](../kernels/forward.cu)", "neither a namespace nor a class"),
    ("[`CpuBackend::no_method`](../src/cpu/forward.cpp)", "defines no 'no_method'"),
    ("[`cpu::rope()`](../src/cpu/kernels.cpp)", "not an identifier"),
    ("[`cpu::rope`](../src/cpu/kernels.cpp#L10)", "no line anchors"),
    ("[`no_such_function`](../convert/dtypes.py)", "is not defined"),
    ("[FORMAT](MISSING.md)", "does not exist"),
])
def test_the_checker_catches_a_broken_reference(link, reason):
    references, problems = check_document(f"see {link} here", os.path.dirname(TOUR))
    assert len(problems) == 1 and reason in problems[0], problems


@pytest.mark.parametrize("link", [
    "[`cpu::rope`](../src/cpu/kernels.cpp)",
    "[`scalar::matmul_rows`](../src/cpu/kernels.cpp)",
    "[`Tokenizer::Impl`](../src/tokenizer/tokenizer.cpp)",
    "[`CudaBackend::forward`](../kernels/forward.cu)",
    "[`InferenceState::key_cache`](../src/cpu/forward.cpp)",
    "[`kMaxHeadDim`](../kernels/kernels.h)",
    "[`quantize_q8`](../convert/dtypes.py)",
    "[docs](FORMAT.md)",
])
def test_the_checker_accepts_a_good_reference(link):
    assert check_document(link, os.path.dirname(TOUR))[1] == []


def test_renaming_a_referenced_function_breaks_the_tour():
    """What happens when someone renames cpu::rope but not the tour: simulated on a copy
    of the source."""
    with open(os.path.join(REPO, "src", "cpu/kernels.cpp"), encoding="utf-8") as f:
        renamed = f.read().replace("void rope(", "void rotate_positions(")
    assert check_cpp(strip_cpp_comments(renamed), "cpu::rope") is not None
    assert check_cpp(strip_cpp_comments(renamed), "cpu::rotate_positions") is None

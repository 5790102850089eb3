"""docs/TOUR.md cannot rot: every code reference in it names something defined where it
points, on the line its anchor gives.

The rules are those of scripts/tour_links.py (which scripts/update_tour_links.py uses to
rewrite the anchors when code moves):

    [`cpu::rope`](../src/cpu/dispatch.cpp#L250)        [`CudaBackend::forward`](../kernels/forward.cu#L812)

names a definition of `cpu::rope` in src/cpu/dispatch.cpp whose name is written on line
250. Besides the checker's own reading, each anchored line is also read here as plain
text: it must contain the name."""

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "scripts"))

from tour_links import (CODE_EXTENSIONS, UPDATE_COMMAND, check_cpp,  # noqa: E402
                        check_document, code_links, definition_line, strip_cpp_comments)

TOUR = os.path.join(REPO, "docs", "TOUR.md")


def read_tour():
    with open(TOUR, encoding="utf-8") as f:
        return f.read()


def source_line(path, line):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    return lines[line - 1] if 0 < line <= len(lines) else ""


def test_every_code_reference_in_the_tour_is_defined_where_it_points():
    references, problems = check_document(read_tour(), os.path.dirname(TOUR))
    assert not problems, (f"docs/TOUR.md has broken references (a stale line: run "
                          f"`{UPDATE_COMMAND}`):\n" + "\n".join(problems))
    assert references >= 60, f"only {references} code references: did the link syntax change?"


def test_every_line_anchor_points_at_a_line_naming_its_symbol():
    """Plain text, independent of the checker's C++ reading: line nn of the file contains
    the last part of the identifier as a word."""
    wrong = []
    for match, label, _, anchor, path in code_links(read_tour(), os.path.dirname(TOUR)):
        if not anchor or not path.endswith(CODE_EXTENSIONS):
            continue
        name = label.strip("`").split("::")[-1]
        text = source_line(path, int(anchor[1:])) if anchor[1:].isdigit() else ""
        if not re.search(r"\b" + re.escape(name) + r"\b", text):
            wrong.append(f"{match.group(0)}: line {anchor[1:]} is {text.strip()!r}")
    assert not wrong, f"stale line anchors (run `{UPDATE_COMMAND}`):\n" + "\n".join(wrong)


def test_the_update_script_finds_nothing_to_change():
    result = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "update_tour_links.py"),
                             "--check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_tour_covers_every_step_of_the_forward_pass():
    text = read_tour()
    for step in ["cpu::embedding_row", "cpu::rmsnorm", "cpu::matvec", "cpu::rope",
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
    ("[`cpu::no_such_kernel`](../src/cpu/dispatch.cpp#L1)", "is not defined"),
    ("[`cpu::rope`](../src/cpu/forward.cpp#L1)", "neither a namespace"),  # called there only
    ("[`measure_read_bandwidth`](../src/commands/ladder.cpp#L1)", "is not defined"),  # called there only
    ("[`cpu::matvec`](../src/cpu/kernels.h#L1)", "is not defined"),  # declared only
    ("[`rope`](../src/nowhere.cpp#L1)", "does not exist"),
    ("[`CpuBackend::forward`](../kernels/forward.cu#L1)", "neither a namespace nor a class"),
    ("[`CpuBackend::no_method`](../src/cpu/forward.cpp#L1)", "defines no 'no_method'"),
    ("[`cpu::rope()`](../src/cpu/dispatch.cpp#L1)", "not an identifier"),
    ("[`cpu::rope`](../src/cpu/dispatch.cpp)", "no line anchor"),
    ("[`cpu::rope`](../src/cpu/dispatch.cpp#L1)", "is stale"),
    ("[`cpu::rope`](../src/cpu/dispatch.cpp#rope)", "not a line anchor"),
    ("[kernels](../src/cpu/dispatch.cpp#L1)", "names no identifier"),
    ("[`no_such_function`](../convert/dtypes.py#L1)", "is not defined"),
    ("[FORMAT](MISSING.md)", "does not exist"),
])
def test_the_checker_catches_a_broken_reference(link, reason):
    references, problems = check_document(f"see {link} here", os.path.dirname(TOUR))
    assert len(problems) == 1 and reason in problems[0], problems


@pytest.mark.parametrize("identifier, path, line_text", [
    ("cpu::rope", "../src/cpu/dispatch.cpp", "void rope("),
    ("scalar::matvec_rows", "../src/cpu/scalar.cpp", "scalar::matvec_rows("),
    ("Tokenizer::Impl", "../src/tokenizer/tokenizer.cpp", "struct Tokenizer::Impl"),
    ("CudaBackend::forward", "../kernels/forward.cu", "forward("),
    ("InferenceState::key_cache", "../src/cpu/forward.cpp", "key_cache"),
    ("kMaxHeadDim", "../kernels/kernels.h", "kMaxHeadDim ="),
    ("quantize_q8", "../convert/dtypes.py", "def quantize_q8("),
])
def test_the_checker_accepts_a_good_reference(identifier, path, line_text):
    """The anchor the checker computes is a line that, read as text, defines the name."""
    base = os.path.dirname(TOUR)
    line, why = definition_line(identifier, os.path.normpath(os.path.join(base, path)))
    assert why is None, why
    assert line_text in source_line(os.path.normpath(os.path.join(base, path)), line)
    assert check_document(f"[`{identifier}`]({path}#L{line})", base)[1] == []
    assert check_document("[docs](FORMAT.md)", base)[1] == []


def test_renaming_a_referenced_function_breaks_the_tour():
    """What happens when someone renames cpu::rope but not the tour: simulated on a copy
    of the source."""
    with open(os.path.join(REPO, "src", "cpu/dispatch.cpp"), encoding="utf-8") as f:
        renamed = f.read().replace("void rope(", "void rotate_positions(")
    assert check_cpp(strip_cpp_comments(renamed), "cpu::rope") is not None
    assert check_cpp(strip_cpp_comments(renamed), "cpu::rotate_positions") is None

"""The documentation cannot rot.

- README.md stays a three-minute read: at most 120 lines, no paragraph over 6 lines, and
  its test command is `make test` (.ci/run runs it).
- docs/USAGE.md is the reference: each option `barellm --help` lists (and each of
  convert/convert.py's and convert/synth.py's) has exactly one row in the table of its
  group there, and no row documents an option the program lacks. README.md documents no
  option of its own.
- Every `barellm` command line in a code block of README.md and the docs is accepted by the
  binary: it is run with the model replaced by a file that is not a model, so that the
  command line is parsed and checked (all of barellm's usage checks come before the model
  is loaded) and the run then stops at the model in one line; exit status 2, a wrong
  command line, fails.
- docs/CUDA.md documents every BARELLM_* environment switch the program reads and every
  CUDA build variable of the Makefile.
- Every relative link and heading anchor of these files exists (scripts/tour_links.py)."""

import os
import re
import shlex
import subprocess
import sys

import pytest

from convert_testlib import BUILD, REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))

from tour_links import check_document  # noqa: E402

BARELLM = os.path.join(BUILD, "barellm")
README = "README.md"
USAGE = "docs/USAGE.md"
CUDA = "docs/CUDA.md"
# The files whose links are checked; TOUR.md has tests/test_tour.py.
LINKED = [README, USAGE, CUDA, "docs/BENCHMARKS.md", "docs/benchmarks-history.md",
          "docs/FORMAT.md"]
# The files whose barellm command lines must parse (the history keeps old ones).
WITH_EXAMPLES = [README, USAGE, CUDA, "docs/BENCHMARKS.md"]
README_MAX_LINES = 120
README_MAX_PARAGRAPH_LINES = 6
USAGE_EXIT = 2  # barellm's exit status for a wrong command line

# docs/USAGE.md's heading of each group: the command's name in backticks, or these.
GROUP_HEADINGS = {"sampling": "Sampling options", "common": "Common options",
                  "convert.py": "`convert/convert.py`", "synth.py": "`convert/synth.py`"}
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")


def read(name):
    with open(os.path.join(REPO, name), encoding="utf-8") as f:
        return f.read()


def barellm_help():
    if not os.path.exists(BARELLM):
        pytest.fail(f"{BARELLM} is missing: run `make` first")
    result = subprocess.run([BARELLM, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def script_help(script):
    result = subprocess.run([sys.executable, os.path.join(REPO, "convert", script), "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


# --- what the programs list -------------------------------------------------------------

def help_groups(text):
    """{group: set of flags} of barellm's usage text. A group is a command (its heading
    line `  run MODEL -p PROMPT  ...` names flags too), "sampling" or "common". An option
    row is an indented line that starts with a flag and has its description after two
    spaces or on the next, deeper-indented line; a line such as `--stop TEXT, --color and
    the sampling options below` only refers to options defined elsewhere."""
    groups, group = {}, None
    lines = text.split("\n")
    for i, line in enumerate(lines):
        following = lines[i + 1] if i + 1 < len(lines) else ""
        command = re.match(r"^  ([a-z]+) MODEL\b(.*)$", line)
        if line.startswith("sampling options"):
            group = "sampling"
        elif line.startswith("common options"):
            group = "common"
        elif command:
            group = command.group(1)
            head = re.split(r"\s{2,}", command.group(2).strip())[0]
            groups.setdefault(group, set()).update(FLAG.findall(head))
        elif group and re.match(r"^\s+-", line):
            parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
            described = len(parts) == 2 or re.match(r"^\s{20,}\S", following)
            if described:
                groups.setdefault(group, set()).update(FLAG.findall(parts[0]))
    return groups


def argparse_flags(text):
    """The flags of an argparse --help text's options section."""
    flags, in_options = set(), False
    for line in text.split("\n"):
        if re.match(r"^(options|optional arguments):", line):
            in_options = True
        elif in_options and re.match(r"^  -", line):
            flags.update(FLAG.findall(re.split(r"\s{2,}", line.strip())[0]))
        elif line and not line.startswith(" "):
            in_options = False
    return flags


def program_groups():
    groups = help_groups(barellm_help())
    groups["convert.py"] = argparse_flags(script_help("convert.py"))
    groups["synth.py"] = argparse_flags(script_help("synth.py"))
    return groups


# --- what the documents say -------------------------------------------------------------

def option_rows(text):
    """[(heading, flags of the row)] for every table row of a markdown text whose first
    cell names options (`-n N`, `--top-p P`, `-h`, `--help`), under the nearest heading."""
    rows, heading, in_code = [], "", False
    for line in text.split("\n"):
        if line.startswith("```"):
            in_code = not in_code
        elif in_code:
            continue
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("| `-"):
            first_cell = re.split(r"(?<!\\)\|", line)[1]
            flags = sorted(set(re.findall(r"`(--?[A-Za-z][\w-]*)", first_cell)))
            rows.append((heading, flags))
    return rows


def usage_group(heading):
    """The group of a docs/USAGE.md heading: `run` for "`run`: complete a prompt"."""
    for group, title in GROUP_HEADINGS.items():
        if heading.startswith(title):
            return group
    command = re.match(r"^`([a-z]+)`", heading)
    return command.group(1) if command else None


def documentation_problems(usage_text, groups):
    """Each (group, flag) of the programs with exactly one row in its group's table of
    usage_text, and no row for a flag its group lacks."""
    documented = {}
    problems = []
    for heading, flags in option_rows(usage_text):
        group = usage_group(heading)
        if group not in groups:
            problems.append(f"options {flags} under '{heading}', which is no group of "
                            "`barellm --help`")
            continue
        for flag in flags:
            documented[(group, flag)] = documented.get((group, flag), 0) + 1
    for group, flags in sorted(groups.items()):
        for flag in sorted(flags):
            count = documented.get((group, flag), 0)
            if count != 1:
                problems.append(f"{group} {flag}: {count} rows in docs/USAGE.md (need one)")
    for (group, flag) in sorted(documented):
        if flag not in groups[group]:
            problems.append(f"{group} {flag}: documented, but the program has no such option")
    return problems


def command_lines(text):
    """Every `barellm ...` command of the fenced code blocks of a markdown text, as
    argument lists (continued lines joined, comments dropped, pipelines split)."""
    commands, block, in_code = [], [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if not in_code:
            continue
        block.append(line[:-1] if line.endswith("\\") else line + "\n")
    for line in "".join(block).split("\n"):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue  # not a shell line
        segment = []
        for word in words + ["|"]:
            if word != "|":
                segment.append(word)
                continue
            if segment and os.path.basename(segment[0]) == "barellm":
                commands.append(segment[1:])
            segment = []
    return commands


def command_line_problem(arguments, not_a_model, text_file):
    """None when barellm accepts the command line `arguments`; else why not."""
    arguments = list(arguments)
    if len(arguments) >= 2 and not arguments[1].startswith("-"):
        arguments[1] = not_a_model  # the docs write `barellm COMMAND MODEL [options]`
    for i, argument in enumerate(arguments[:-1]):
        if argument == "-f" and arguments[i + 1] != "-":
            arguments[i + 1] = text_file
    result = subprocess.run([BARELLM, *arguments], capture_output=True, text=True,
                            input="", timeout=60)
    lines = result.stderr.strip().split("\n")
    if result.returncode == 0:
        return None
    if result.returncode == 1 and len(lines) == 1 and lines[0].startswith("barellm: "):
        return None  # parsed; stopped at the model (or at the machine: no GPU)
    return f"exit status {result.returncode}: {result.stderr.strip()}"


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory):
    folder = tmp_path_factory.mktemp("docs")
    not_a_model = folder / "not-a-model.bin"
    not_a_model.write_text("this is not a barellm file\n")
    text_file = folder / "text.txt"
    text_file.write_text("Once upon a time\n")
    return str(not_a_model), str(text_file)


# --- the tests ----------------------------------------------------------------------------

def test_the_readme_is_short():
    text = read(README)
    lines = text.rstrip("\n").split("\n")
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    paragraph, in_code = [], False
    for line in lines + [""]:
        if line.startswith("```"):
            in_code = not in_code
        if in_code or line.startswith("```") or line.startswith("|") or not line.strip():
            assert len(paragraph) <= README_MAX_PARAGRAPH_LINES, (
                "a README.md paragraph longer than 6 lines:\n" + "\n".join(paragraph))
            paragraph = []
        else:
            paragraph.append(line)


def test_the_readme_test_command_is_make_test():
    assert "\nmake test" in read(README)  # .ci/run runs the README's test command


def test_every_option_is_documented_once_in_usage():
    problems = documentation_problems(read(USAGE), program_groups())
    assert not problems, "\n".join(problems)


def test_the_readme_documents_no_option_of_its_own():
    assert option_rows(read(README)) == [], "options are documented in docs/USAGE.md"


def test_the_help_groups_are_read_as_barellm_prints_them():
    groups = help_groups(barellm_help())
    assert {"run", "chat", "ppl", "bench", "ladder", "info", "tokenize", "detokenize",
            "sampling", "common"} <= set(groups)
    assert {"-p", "-f", "-n", "--stop", "--chat", "--no-think"} <= groups["run"]
    # chat's --stop and --color: referred to only
    assert groups["chat"] == {"--system", "--reasoning-effort", "-n"}
    assert {"--temp", "--top-p", "--min-p", "--seed"} <= groups["sampling"]
    assert {"--ctx", "--device", "--simd", "-h", "--help"} <= groups["common"]
    assert groups["tokenize"] == {"-p", "-f", "--bos", "--no-special"}


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_every_command_line_of_the_docs_is_accepted(name, stand_ins):
    commands = command_lines(read(name))
    if name in (README, USAGE):
        assert len(commands) >= 8, f"only {len(commands)} barellm command lines in {name}"
    problems = [f"barellm {shlex.join(c)}: {why}" for c in commands
                for why in [command_line_problem(c, *stand_ins)] if why]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("line", [
    "build/barellm run model.bin -p hi --bogus",
    "build/barellm run model.bin -p hi --top-p 2",
    "build/barellm chat model.bin -p hi",
    "echo hi | build/barellm run model.bin --no-think -p -",
    "build/barellm bench model.bin -o yaml",
])
def test_a_wrong_command_line_is_caught(line, stand_ins):
    [command] = command_lines(f"```sh\n{line}\n```\n")
    assert command_line_problem(command, *stand_ins) is not None


def test_an_undocumented_or_doubly_documented_option_is_caught():
    groups = program_groups()
    text = read(USAGE)
    row = next(line for line in text.split("\n") if line.startswith("| `--min-p"))
    assert documentation_problems(text.replace(row + "\n", ""), groups) == [
        "sampling --min-p: 0 rows in docs/USAGE.md (need one)"]
    assert documentation_problems(text.replace(row, row + "\n" + row), groups) == [
        "sampling --min-p: 2 rows in docs/USAGE.md (need one)"]
    bogus = text.replace(row, row + "\n| `--max-p P` | no such option |")
    assert documentation_problems(bogus, groups) == [
        "sampling --max-p: documented, but the program has no such option"]


def test_every_environment_switch_and_cuda_build_variable_is_in_cuda_md():
    rows = [line for line in read(CUDA).split("\n") if line.startswith("| `")]
    documented = {re.match(r"\| `([A-Z_0-9]+)`", line).group(1) for line in rows
                  if re.match(r"\| `([A-Z_0-9]+)`", line)}
    switches = set()
    for folder in ("src", "kernels"):
        for root, _, files in os.walk(os.path.join(REPO, folder)):
            for file in files:
                with open(os.path.join(root, file), encoding="utf-8", errors="replace") as f:
                    switches.update(re.findall(r'getenv\("(BARELLM_\w+)"\)', f.read()))
    assert switches, "no getenv(\"BARELLM_...\") found: did the code change?"
    variables = set(re.findall(r"^#\s+(CUDA\w*|NVCC)=", read("Makefile"), re.M))
    assert {"CUDA", "NVCC", "CUDA_ARCHS"} <= variables
    missing = (switches | variables) - documented
    assert not missing, f"not in docs/CUDA.md's tables: {sorted(missing)}"


@pytest.mark.parametrize("name", LINKED)
def test_every_link_and_anchor_holds(name):
    path = os.path.join(REPO, name)
    _, problems = check_document(read(name), os.path.dirname(path))
    assert not problems, f"{name}:\n" + "\n".join(problems)


def test_a_broken_anchor_is_caught():
    base = os.path.join(REPO, "docs")
    assert check_document("[x](USAGE.md#sampling-options)", base)[1] == []
    for link in ["[x](USAGE.md#no-such-heading)", "[x](#no-such-heading)",
                 "[x](BENCHMARKS.md#gpu-decode-before-b0e3489)"]:  # moved to the history
        assert len(check_document(link, base)[1]) == 1, link

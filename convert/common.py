"""Shared error type and small file, number and process helpers for the barellm
conversion tools."""

import argparse
import contextlib
import io
import json
import math
import os
import re
import signal
import struct
import sys

# Far deeper than any Hugging Face file nests (tokenizer.json: 4 to 6 levels), far below
# Python's recursion limit, which parsing, writing and checking the values all use.
MAX_JSON_NESTING = 100
# \uD800 to \uDFFF: a JSON escape of one half of a surrogate pair.
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# The signals that end a conversion: Ctrl-C, `kill`, a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class ConvertError(Exception):
    """A conversion failure with a message meant for the user (no traceback)."""


def read_bytes(path, required=True):
    """The bytes of the file at `path`; None when it is absent and not required."""
    if not os.path.exists(path):
        if required:
            raise ConvertError(f"{path}: file not found")
        return None
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ConvertError(f"{path}: cannot read ({e.strerror})") from None


def read_json(path, required=True):
    """Parse the JSON file at `path` (see parse_json); return None when it is absent and
    not required."""
    data = read_bytes(path, required)
    return None if data is None else parse_json(data, path)


def read_text(path, required=True):
    """The UTF-8 text of the file at `path` (see utf8_text); None when it is absent and not
    required."""
    data = read_bytes(path, required)
    return None if data is None else utf8_text(data, path)


def utf8_text(data, name):
    """The bytes `data` decoded as UTF-8, refused otherwise; `name` starts the message."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        byte = data[e.start]
        raise ConvertError(f"{name}: not UTF-8 text (byte {e.start} is {byte:#04x})") from None


def parse_json(data, name):
    """The JSON value in the bytes `data`, refused unless barellm can read it back once
    written: UTF-8 text, no NaN or Infinity, at most MAX_JSON_NESTING levels deep, no
    half of a surrogate pair. `name` starts the error messages."""
    text = utf8_text(data, name)

    def refuse_constant(literal):
        raise ConvertError(f"{name}: {literal} is not valid JSON")

    def finite_float(literal):
        value = float(literal)
        if math.isinf(value):
            raise ConvertError(f"{name}: the number {literal} is beyond the float64 range")
        return value

    too_deep = f"{name}: JSON nested more than {MAX_JSON_NESTING} levels deep"
    try:
        value = json.loads(text, parse_constant=refuse_constant, parse_float=finite_float)
    except json.JSONDecodeError as e:
        raise ConvertError(f"{name}: invalid JSON ({e})") from None
    except ValueError:  # int() refuses integers that long
        raise ConvertError(f"{name}: an integer has more than "
                           f"{sys.get_int_max_str_digits()} digits") from None
    except RecursionError:
        raise ConvertError(too_deep) from None
    if nesting_depth(value) > MAX_JSON_NESTING:
        raise ConvertError(too_deep)
    if SURROGATE_ESCAPE.search(text):
        try:
            compact_json(value).encode("utf-8")
        except UnicodeEncodeError as e:
            raise ConvertError(f"{name}: \\u{ord(e.object[e.start]):04x} is half of a "
                               "surrogate pair (not a character)") from None
    return value


def nesting_depth(value):
    """How many arrays and objects deep `value` nests (0 for a number or a string),
    counted level by level, without recursion."""
    depth, level = 0, [value]
    while True:
        level = [node for node in level if isinstance(node, (dict, list))]
        if not level:
            return depth
        depth += 1
        level = [child for node in level
                 for child in (node.values() if isinstance(node, dict) else node)]


def compact_json(value):
    """Serialize `value` as compact UTF-8 JSON text (no spaces, non-ASCII kept)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def float32(value):
    """`value` rounded to float32 as barellm stores it: inf where it overflows, 0 where
    it underflows."""
    try:
        return struct.unpack("<f", struct.pack("<f", float(value)))[0]
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def refuse_output_in_place_of(output, what="output"):
    """Refuse an output path whose replacement would destroy something other than a file:
    a directory, or anything that is not a regular file (a device such as /dev/null, a
    FIFO, a socket; a symbolic link to one), which os.replace would turn into a regular
    file. A symbolic link to a regular file is replaced as a link, its target untouched."""
    if os.path.isdir(output):
        raise ConvertError(f"cannot write {what} '{output}': it is a directory")
    if os.path.exists(output) and not os.path.isfile(output):
        raise ConvertError(f"cannot write {what} '{output}': it is not a regular file")


def refuse_output_among_inputs(output, inputs):
    """Refuse an output path that is one of the input files, however it is spelled
    (through a symbolic link, with '..', as another hard link)."""
    for path in inputs:
        try:
            same = os.path.samefile(output, path)
        except OSError:  # one of them does not exist
            continue
        if same:
            raise ConvertError(f"output '{output}' is the input file {path}")


def umask_applied(mode):
    """`mode` less the process's umask: the permissions a new file or folder gets, for one
    made by mkstemp or mkdtemp (which give the owner's alone) before it is put in place."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


class Interrupted(BaseException):
    """One of the STOP_SIGNALS arrived. A BaseException, as KeyboardInterrupt is: no
    handler of errors catches it, every `finally` (removing a temporary output) runs."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def stop_on_signals():
    """Raise Interrupted for any of the STOP_SIGNALS."""
    def stop(signum, _frame):
        for number in STOP_SIGNALS:  # a second signal must not cut the clean-up short
            signal.signal(number, signal.SIG_IGN)
        raise Interrupted(signum)

    for number in STOP_SIGNALS:
        signal.signal(number, stop)


@contextlib.contextmanager
def stop_signals_held():
    """Hold the STOP_SIGNALS back for the block: one that arrives meanwhile is delivered
    when the block ends, so that a step and the bookkeeping of its result (a temporary
    file created, and its name kept for the clean-up) are not torn apart."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class OneLineParser(argparse.ArgumentParser):
    """argparse that refuses a wrong command line in one line on stderr, naming --help for
    the options, with status 2 (argparse's own error prints its usage first)."""

    def error(self, message):
        print(f"{self.prog}: {message} ({self.prog} --help lists the options)", file=sys.stderr)
        sys.exit(2)


def run_main(main, prog):
    """Run a tool's main() and exit with its status, saying in one line on stderr why
    where it could not finish: a stop signal (status 128 + its number, as a shell
    reports it), or a standard output that cannot take the text, such as a full disk or
    a closed pipe (status 1). What main() prints is written once it returns, so that an
    error in writing it can only be the standard output's."""
    stop_on_signals()
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            status = main()
    except SystemExit as e:  # argparse, after --help or a usage error
        status = e.code
    except Interrupted as e:
        print(f"{prog}: interrupted by {signal.Signals(e.signum).name}", file=sys.stderr)
        status = 128 + e.signum
    try:
        if sys.stdout is not None:  # None: started with the standard output closed
            sys.stdout.write(printed.getvalue())
            sys.stdout.flush()
    except OSError as e:
        # The interpreter flushes again at exit: let that go nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"{prog}: cannot write the standard output ({e.strerror})", file=sys.stderr)
        status = 1
    sys.exit(status)

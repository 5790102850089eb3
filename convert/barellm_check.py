"""Loading a converted file with the barellm program before it is put in place, so that
the converter never writes a file that barellm refuses.

barellm alone decides what it can run (a Split regex outside its subset, a setting of a
tokenizer component, a tensor of the wrong shape): the converter runs
`barellm tokenize FILE -p ""`, which loads the whole file and builds its tokenizer, and
passes on barellm's message when it refuses.
"""

import os
import signal
import subprocess

from common import ConvertError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BINARY = os.path.join(REPO, "build", "barellm")
ENVIRONMENT_VARIABLE = "BARELLM"
# Loading maps the weights without reading them: seconds even for a large model.
TIMEOUT_SECONDS = 600
MESSAGE_PREFIX = "barellm: "  # how barellm starts its one-line error messages


def find_binary(option):
    """The barellm program to check with: `option` (--barellm), else $BARELLM, else
    build/barellm of this repository; None when that default is not built.

    A program named by --barellm or $BARELLM must exist: the check was asked for."""
    for given, source in ((option, "--barellm"), (os.environ.get(ENVIRONMENT_VARIABLE),
                                                  f"${ENVIRONMENT_VARIABLE}")):
        if given:
            if not os.path.isfile(given):
                raise ConvertError(f"{source} {given}: no such file")
            return os.path.abspath(given)  # a bare name is not looked up on $PATH
    return DEFAULT_BINARY if os.path.isfile(DEFAULT_BINARY) else None


def unchecked_warning(output):
    """The one line saying that `output` was written without the check, and how to get it."""
    return (f"convert: warning: {output} was not checked by barellm ({DEFAULT_BINARY} is "
            "not built: run `make`, or give --barellm PATH)")


def signal_name(number):
    """SIGSEGV for 11; "signal N" for a number without a name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def check_loads(binary, path, shown_as):
    """Raise ConvertError unless `binary` loads the barellm file `path` and builds its
    tokenizer. Messages name the file `shown_as` (the output `path` is written for)."""
    command = [binary, "tokenize", path, "-p", ""]
    try:
        result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, errors="replace", timeout=TIMEOUT_SECONDS)
    except OSError as e:
        raise ConvertError(f"cannot run barellm {binary} to check the output: "
                           f"{e.strerror}") from None
    except subprocess.TimeoutExpired:
        raise ConvertError(f"barellm {binary} did not finish loading the output within "
                           f"{TIMEOUT_SECONDS} s") from None
    if result.returncode == 0:
        return
    if result.returncode < 0:
        raise ConvertError(f"barellm {binary} was killed by {signal_name(-result.returncode)} "
                           "while loading the output")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    messages = [line[len(MESSAGE_PREFIX):] for line in lines
                if line.startswith(MESSAGE_PREFIX)]
    if not messages:  # not barellm's own refusal: a sanitizer's report, another program
        last = lines[-1] if lines else "no message"
        raise ConvertError(f"barellm {binary} failed with exit status {result.returncode} "
                           f"while loading the output: {last}")
    raise ConvertError("barellm refuses the output: " + messages[-1].replace(path, shown_as))

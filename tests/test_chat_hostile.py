"""Hostile input to `barellm chat`: /save aimed at the model being run, at a file that
exists, at a directory or a device; writes that fail; lines that are not UTF-8; and the exit
status of a conversation fed through a pipe. A refused line says why in one line and the
conversation goes on; nothing barellm was told to read is ever replaced."""

import json
import os
import resource
import signal
import socket
import subprocess

import pytest

from test_chat_command import Terminal, stats
from test_cli import BARELLM
from test_cli_hostile import LLAMA2_CHAT, write_model


@pytest.fixture
def model(tmp_path):
    """The tiny model of test_cli_hostile.py with Llama 2's chat template."""
    return write_model(tmp_path / "tiny-chat.bin",
                       metadata={"barellm.chat_template": LLAMA2_CHAT})


def chat(model, lines, *args, preexec_fn=None, input_tail=b""):
    """barellm chat on `model`, its standard input the bytes of `lines` (a pipe), each with
    a newline, then `input_tail`; stderr decoded with U+FFFD for bytes that are not UTF-8."""
    result = subprocess.run([BARELLM, "chat", str(model), "--temp", "0", "-n", "3",
                             *map(str, args)],
                            input=b"".join(line + b"\n" for line in lines) + input_tail,
                            capture_output=True, timeout=120, preexec_fn=preexec_fn,
                            cwd=os.path.dirname(model))  # a relative name lands there
    result.stderr = result.stderr.decode(errors="replace")
    return result


def last_line(result):
    return result.stderr.strip().splitlines()[-1]


def leftovers(directory, *expected):
    """What is in `directory` besides the `expected` names (a temporary file left behind)."""
    return sorted(set(os.listdir(directory)) - set(expected))


# ---- /save ---------------------------------------------------------------------------------

def test_save_refuses_an_existing_file_unless_told_with_save_bang(model, tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# my notes\n")
    result = chat(model, [b"ab", b"/save " + bytes(readme), b"ba"])
    assert f"barellm: /save: {readme} exists already; /save! {readme} replaces it" in \
        result.stderr
    assert readme.read_text() == "# my notes\n"
    assert len(stats(result.stderr)) == 2  # the turn after the refused /save ran
    assert result.returncode == 1
    assert last_line(result) == "barellm: 1 line of the input failed: line 2 (/save)"

    result = chat(model, [b"ab", b"/save! " + bytes(readme)])
    assert result.returncode == 0, result.stderr
    assert f"the conversation is in {readme}" in result.stderr
    assert [m["role"] for m in json.loads(readme.read_text())] == ["user", "assistant"]
    assert leftovers(tmp_path, "README.md", "tiny-chat.bin") == []


def test_save_keeps_the_mode_of_the_file_it_replaces(model, tmp_path):
    target = tmp_path / "talk.json"
    target.write_text("old")
    os.chmod(target, 0o640)
    assert chat(model, [b"ab", b"/save! " + bytes(target)]).returncode == 0
    assert os.stat(target).st_mode & 0o7777 == 0o640
    assert json.loads(target.read_text())[0]["content"] == "ab"


def test_save_never_replaces_the_model(model, tmp_path):
    before = model.read_bytes()
    symlink, hardlink = tmp_path / "link.bin", tmp_path / "hard.bin"
    symlink.symlink_to(model)
    os.link(model, hardlink)
    spellings = [model, symlink, hardlink, tmp_path / ".." / tmp_path.name / model.name]
    lines = [b"ab"] + [command + b" " + bytes(path) for path in spellings
                       for command in (b"/save", b"/save!")] + [b"ba"]
    result = chat(model, lines)
    assert result.stderr.count("is a file being read, never replaced") == 2 * len(spellings)
    assert model.read_bytes() == before
    assert symlink.is_symlink() and os.path.samefile(symlink, model)
    assert len(stats(result.stderr)) == 2
    assert result.returncode == 1
    assert last_line(result).startswith(
        f"barellm: {2 * len(spellings)} lines of the input failed: line 2 (/save), "
        "line 3 (/save!), line 4 (/save)")
    assert leftovers(tmp_path, "tiny-chat.bin", "link.bin", "hard.bin") == []


def test_save_refuses_directories_and_special_files(model, tmp_path):
    fifo, device, listening = tmp_path / "fifo", tmp_path / "full", tmp_path / "socket"
    os.mkfifo(fifo)
    device.symlink_to("/dev/full")  # a link: were it replaced, /dev/full would be safe
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(listening))
    directory = tmp_path / "dir"
    directory.mkdir()
    refusals = {fifo: "not a regular file", device: "not a regular file",
                listening: "not a regular file", directory: "is a directory",
                f"{tmp_path}/new/": "is a directory"}
    lines = [b"ab"] + [b"/save! " + str(path).encode() for path in refusals]
    result = chat(model, lines)
    server.close()
    for path, why in refusals.items():
        assert f"barellm: /save!: {path}: {why}" in result.stderr
    assert fifo.exists() and not fifo.is_file() and device.is_symlink()
    assert list(directory.iterdir()) == []
    assert result.returncode == 1
    assert leftovers(tmp_path, "tiny-chat.bin", "fifo", "full", "socket", "dir") == []


def test_save_dash_writes_to_standard_output(model):
    result = chat(model, [b"ab", b"/save -"])
    assert result.returncode == 0, result.stderr
    reply, saved = result.stdout.decode().split("\n", 1)
    assert json.loads(saved) == [{"role": "user", "content": "ab"},
                                 {"role": "assistant", "content": reply}]


def test_a_failed_write_says_why(model, tmp_path):
    nowhere = tmp_path / "no" / "such" / "dir" / "x.json"
    big = tmp_path / "big.json"

    def limit_file_size():
        # Writes past 16 bytes fail with EFBIG instead of raising SIGXFSZ.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16))

    result = chat(model, [b"ab", b"/save " + bytes(nowhere), b"/save " + bytes(big)],
                  preexec_fn=limit_file_size)
    assert f"barellm: /save: cannot write {nowhere}: No such file or directory" in result.stderr
    assert f"barellm: /save: cannot write {big}: File too large" in result.stderr
    assert not big.exists() and not (tmp_path / "no").exists()
    assert leftovers(tmp_path, "tiny-chat.bin") == []
    assert last_line(result) == ("barellm: 2 lines of the input failed: line 2 (/save), "
                                 "line 3 (/save)")


def test_a_long_or_odd_file_name_is_quoted_as_an_excerpt(model, tmp_path):
    """A name typed in a chat is untrusted text: a message quotes at most an excerpt of it,
    on one line."""
    long_name = b"n" * 5000
    odd_name = b"a\x1b[2Jb.json"  # an escape sequence that would clear a terminal
    (tmp_path / odd_name.decode()).write_text("old")
    result = chat(model, [b"ab", b"/save " + long_name, b"/save " + odd_name])
    lines = result.stderr.splitlines()
    refusal = next(line for line in lines if line.startswith("barellm: /save: ") and
                   "File name too long" in line)
    assert refusal == "barellm: /save: '" + "n" * 60 + "...': File name too long"
    assert "barellm: /save: 'a?[2Jb.json' exists already; /save! 'a?[2Jb.json' replaces it" \
        in lines
    assert "\x1b" not in result.stderr
    assert max(map(len, lines)) < 200
    assert result.returncode == 1
    assert last_line(result) == ("barellm: 2 lines of the input failed: line 2 (/save), "
                                 "line 3 (/save)")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only directory")
def test_a_write_without_permission_says_why(model, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    result = chat(model, [b"ab", b"/save " + bytes(locked / "x.json")])
    assert f"cannot write {locked / 'x.json'}: Permission denied" in result.stderr
    assert result.returncode == 1


def test_help_lists_the_commands(model):
    result = chat(model, [b"/help"])
    assert result.returncode == 0 and result.stdout == b""
    assert "/save! FILE also replaces an existing regular FILE" in result.stderr
    assert stats(result.stderr) == []


def test_a_save_without_a_file_name_fails(model):
    result = chat(model, [b"/save", b"/save!", b"ab", b"/save    "])
    assert "barellm: /save needs a file name: /save FILE" in result.stderr
    assert "barellm: /save! needs a file name: /save! FILE" in result.stderr
    assert len(stats(result.stderr)) == 1
    assert last_line(result) == ("barellm: 3 lines of the input failed: line 1 (/save), "
                                 "line 2 (/save!), line 4 (/save)")


# ---- lines that are not UTF-8 --------------------------------------------------------------

def test_a_line_that_is_not_utf8_is_refused_and_the_session_goes_on(model, tmp_path):
    saved = tmp_path / "talk.json"
    result = chat(model, [b"ab", b"hi \xff", b"c\xe2\x82", b"ba", b"/save " + bytes(saved)])
    assert ("barellm: this message is not valid UTF-8 (byte 3 of line 2); it was not sent, "
            "the conversation goes on") in result.stderr
    assert "(byte 1 of line 3)" in result.stderr
    assert "text to tokenize" not in result.stderr
    assert len(stats(result.stderr)) == 2
    assert [m["content"] for m in json.loads(saved.read_text())][0::2] == ["ab", "ba"]
    assert result.returncode == 1
    assert last_line(result) == ("barellm: 2 lines of the input failed: line 2 (a message "
                                 "that is not UTF-8), line 3 (a message that is not UTF-8)")


def test_a_line_longer_than_the_limit_is_dropped_and_the_session_goes_on(model):
    result = chat(model, [b"ab", b"x" * (3 << 20), b"ba"])
    assert ("barellm: line 2 is longer than 1048576 bytes; it was not sent, the conversation "
            "goes on") in result.stderr
    assert len(stats(result.stderr)) == 2
    assert last_line(result) == "barellm: 1 line of the input failed: line 2 (a line too long)"
    # Without a newline at the end of the input, too.
    result = chat(model, [b"ab"], input_tail=b"y" * (2 << 20))
    assert len(stats(result.stderr)) == 1
    assert last_line(result) == "barellm: 1 line of the input failed: line 2 (a line too long)"


def test_a_clean_session_exits_0_and_many_failures_are_counted(model):
    assert chat(model, [b"ab", b"", b"ba"]).returncode == 0
    result = chat(model, [b"\xff"] * 25)
    assert result.returncode == 1
    assert last_line(result).startswith("barellm: 25 lines of the input failed: line 1 (")
    assert last_line(result).endswith(", line 10 (a message that is not UTF-8) and 15 more")


def test_a_line_that_is_not_utf8_on_a_terminal_gives_the_next_prompt(model):
    term = Terminal(model, "--temp", "0", "-n", "3")
    term.read(lambda out, err: out.endswith("> "))
    os.write(term.master, b"hi \xff\n")
    term.read(lambda out, err: "not valid UTF-8" in err and out.endswith("> ")
              and term.prompts() == 2)
    term.type("ab\n")
    term.read(lambda out, err: len(stats(err)) == 1 and out.endswith("> "))
    term.type("/exit\n")
    assert term.finish() == 0  # on a terminal the user saw each refusal


# ---- options that must be UTF-8 ------------------------------------------------------------

@pytest.mark.parametrize("command", ["run", "chat"])
@pytest.mark.parametrize("flag", ["--stop", "--system"])
def test_stop_and_system_texts_must_be_utf8(model, command, flag):
    args = [BARELLM, command, model, flag, b"ok\xff"]
    if command == "run":
        args += ["-p", "ab", "--chat"]
    result = subprocess.run(args, input=b"ab\n", capture_output=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert result.stderr.decode() == (f"barellm: {flag} needs UTF-8 text; byte 2 of its value "
                                      "is not (barellm --help lists the options)\n")
    assert result.stdout == b""

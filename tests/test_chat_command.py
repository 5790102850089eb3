"""`barellm chat` on stories260K with the Llama-2-chat template added: through a pipe (each
line a turn, only the replies printed) and through a pseudo-terminal (the prompt, Ctrl-C,
Ctrl-D, /exit). The turns against `run --chat` and against jinja2's rendering of the
whole conversation (tests/test_chat.py's hf_render), the KV cache reuse by the prefilled
token counts of the statistics lines, /reset, /save and a full context."""

import fcntl
import json
import os
import re
import select
import shutil
import subprocess
import termios
import time

import pytest

from convert_testlib import (BUILD, CONVERT, SYNTH, STORIES, assert_wrong_command_line,
                             need_shared, run)
from test_chat import TEMPLATES, hf_render
from test_cli import barellm

BARELLM = os.path.join(BUILD, "barellm")
LLAMA2_CHAT = TEMPLATES["llama2-chat"]
STATS = re.compile(r"prompt: (\d+) tokens, .* \| generated: (\d+) tokens, .* \| "
                   r"stopped: ([^|\n]+) \| context: (\d+)/(\d+) tokens")


def with_template(hf_dir, template):
    config_path = os.path.join(hf_dir, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["chat_template"] = template
    with open(config_path, "w") as f:
        json.dump(config, f)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """stories260K with Llama-2-chat's template in its tokenizer_config.json."""
    hf = tmp_path_factory.mktemp("hf") / "stories-chat"
    shutil.copytree(need_shared(STORIES), hf)
    with_template(hf, LLAMA2_CHAT["chat_template"])
    path = str(tmp_path_factory.mktemp("model") / "stories-chat.bin")
    result = run(CONVERT, hf, "-o", path, "--dtype", "f32")
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture(scope="module")
def slow_chat_model(tmp_path_factory, chat_model):
    """A wider random model with the same tokenizer and template and a long context, whose
    replies last long enough to be interrupted."""
    hf = tmp_path_factory.mktemp("hf") / "stories-chat"
    shutil.copytree(need_shared(STORIES), hf)
    with_template(hf, LLAMA2_CHAT["chat_template"])
    with open(os.path.join(hf, "config.json")) as f:
        config = json.load(f)
    config.update({"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
                   "num_attention_heads": 4, "num_key_value_heads": 4,
                   "max_position_embeddings": 4096})
    config_path = tmp_path_factory.mktemp("config") / "config.json"
    config_path.write_text(json.dumps(config))
    synth = tmp_path_factory.mktemp("synth") / "hf"
    result = run(SYNTH, "--config", config_path, "--tokenizer", hf, "-o", synth)
    assert result.returncode == 0, result.stderr
    shutil.copy(os.path.join(hf, "tokenizer_config.json"), synth)
    path = str(tmp_path_factory.mktemp("model") / "slow-chat.bin")
    result = run(CONVERT, synth, "-o", path, "--dtype", "f32")
    assert result.returncode == 0, result.stderr
    return path


def stats(stderr):
    """(prefilled, generated, stop reason, context used) of each statistics line."""
    return [(int(m[1]), int(m[2]), m[3], int(m[4])) for m in STATS.finditer(stderr)]


def token_count(model, text):
    return len(json.loads(barellm("tokenize", model, "-p", text).stdout))


def run_chat_reply(model, prompt, n):
    """The reply of `run --chat` to one message, as `chat` should give it for a first turn."""
    result = barellm("run", model, "-p", prompt, "--chat", "--temp", "0", "-n", n)
    assert result.returncode == 0, result.stderr
    return result.stdout[:-1]


# ---- through a pipe ----------------------------------------------------------------------

def test_two_lines_are_two_turns(chat_model):
    result = barellm("chat", chat_model, "--temp", "0", "-n", 20,
                     input_text="Hi\nTell me more\n")
    assert result.returncode == 0, result.stderr
    turns = stats(result.stderr)
    assert len(turns) == 2
    first = run_chat_reply(chat_model, "Hi", 20)
    assert result.stdout.startswith(first + "\n") and result.stdout.endswith("\n")

    # The first turn prefills the rendering of one message, the second only what follows
    # the reply (plus the reply's last token, which the model had not run when -n stopped
    # it), and the context holds the sum.
    assert turns[0][0] == token_count(chat_model, hf_render(LLAMA2_CHAT, "Hi"))
    assert turns[0][2] == "reached -n" and turns[0][1] == 20
    conversation = [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "REPLY"},
                    {"role": "user", "content": "Tell me more"}]
    whole = render_conversation(LLAMA2_CHAT, conversation)
    after_reply = whole[whole.index("REPLY") + len("REPLY"):]
    assert after_reply == " </s><s>[INST] Tell me more [/INST]"
    assert turns[1][0] == 1 + token_count(chat_model, after_reply)
    assert turns[0][3] == turns[0][0] + 19
    assert turns[1][3] == turns[0][3] + turns[1][0] + 19


def render_conversation(entry, messages):
    """The template's rendering of a whole conversation with the generation prompt."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(entry["chat_template"]).render(
        messages=messages, add_generation_prompt=True, bos_token=entry["bos_token"],
        eos_token=entry["eos_token"])


def test_a_later_turn_continues_the_conversation(chat_model):
    """The second reply with the KV cache reused equals `run` on the whole conversation's
    tokens, prefilled at once: the first turn and the reply as chat generated them."""
    result = barellm("chat", chat_model, "--temp", "0", "-n", 12, "--kv", "f32",
                     input_text="Hi\nAnd then?\n")
    assert result.returncode == 0, result.stderr
    first = run_chat_reply(chat_model, "Hi", 12)
    second = result.stdout[len(first) + 1:-1]
    # The same turns as one prompt: the first turn's rendering, the reply's 12 tokens, what
    # follows the reply. The reply's tokens come from `run --chat`'s continuation.
    first_ids = json.loads(barellm("tokenize", chat_model, "-p",
                                   hf_render(LLAMA2_CHAT, "Hi")).stdout)
    reply_ids = greedy_ids(chat_model, first_ids, 12)
    next_ids = json.loads(barellm("tokenize", chat_model, "-p",
                                  " </s><s>[INST] And then? [/INST]").stdout)
    want = barellm("detokenize", chat_model, "-p",
                   json.dumps(greedy_ids(chat_model, first_ids + reply_ids + next_ids, 12)))
    assert second == want.stdout[:-1].lstrip(" ") or second == want.stdout[:-1]


def greedy_ids(model, ids, steps):
    """Greedy continuation ids of `ids` on the numpy reference model."""
    import numpy as np
    import model as reference
    config, weights = reference.load(model)
    ids = list(ids)
    out = []
    for _ in range(steps):
        out.append(int(np.argmax(reference.forward(config, weights, ids + out)[-1])))
    return out


def test_reset_starts_over_and_a_full_context_refuses_turns(chat_model):
    # 18 tokens of prompt + up to 30 of reply do not fit in 40: positions 18..39 run 22
    # reply tokens and the 23rd is drawn from the last, then the reply stops at the end of
    # the context; the next turn is refused, /reset makes room and the same first turn
    # gives the same reply.
    result = barellm("chat", chat_model, "--temp", "0", "-n", 30, "--ctx", 40,
                     input_text="Hi\nTell me more\n/reset\nHi\n")
    assert result.returncode == 1  # a turn was refused
    turns = stats(result.stderr)
    assert len(turns) == 2
    assert turns[0][2] == "context full (40 tokens)" and turns[0][3] == 40
    assert turns[1] == turns[0]
    assert "the context is full; /reset starts a new conversation" in result.stderr
    assert re.search(r"the context is full: this turn needs \d+ tokens and 0 of 40 are free; "
                     r"/reset starts a new conversation", result.stderr)
    assert "a new conversation" in result.stderr
    assert turns[0][:2] == (18, 23)
    reply = run_chat_reply(chat_model, "Hi", 23)
    assert result.stdout == reply + "\n" + reply + "\n"


def test_save_writes_the_conversation_as_json(chat_model, tmp_path):
    saved = tmp_path / "talk.json"
    result = barellm("chat", chat_model, "--temp", "0", "-n", 10, "--system", "Be brief.",
                     input_text=f"Hi\nMore\n/save {saved}\n")
    assert result.returncode == 0, result.stderr
    assert f"the conversation is in {saved}" in result.stderr
    messages = json.loads(saved.read_text())
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant"]
    assert [messages[i]["content"] for i in (0, 1, 3)] == ["Be brief.", "Hi", "More"]
    assert result.stdout == messages[2]["content"] + "\n" + messages[4]["content"] + "\n"
    # The system message went into the first turn: it prefilled the rendering with it.
    with_system = hf_render(LLAMA2_CHAT, "Hi", "Be brief.")
    assert stats(result.stderr)[0][0] == token_count(chat_model, with_system)


def test_save_to_an_unwritable_place_says_so_and_goes_on(chat_model, tmp_path):
    result = barellm("chat", chat_model, "--temp", "0", "-n", 5,
                     input_text=f"/save {tmp_path}/no/such/dir/x.json\n/save\nHi\n")
    assert result.returncode == 1, result.stderr  # through a pipe, a failed /save fails
    assert (f"/save: cannot write {tmp_path}/no/such/dir/x.json: No such file or directory"
            in result.stderr)
    assert result.stderr.splitlines()[-1] == ("barellm: 2 lines of the input failed: "
                                              "line 1 (/save), line 2 (/save)")
    assert "/save needs a file name" in result.stderr
    assert len(stats(result.stderr)) == 1
    assert not os.path.exists(tmp_path / "no")


def test_stop_strings_and_slashes_in_messages(chat_model):
    first = run_chat_reply(chat_model, "Hi", 20)
    cut = first[len(first) // 2:len(first) // 2 + 3]
    result = barellm("chat", chat_model, "--temp", "0", "-n", 20, "--stop", cut,
                     input_text="Hi\n")
    assert result.stdout == first[:first.index(cut)] + "\n"
    assert stats(result.stderr)[0][2] == "stop string"
    # A line that starts with "/" but is no command is a message.
    result = barellm("chat", chat_model, "--temp", "0", "-n", 5, input_text="/etc/hosts\n")
    assert result.returncode == 0 and len(stats(result.stderr)) == 1


def test_chat_refusals(chat_model, tmp_path):
    model = tmp_path / "stories.bin"
    assert run(CONVERT, need_shared(STORIES), "-o", model).returncode == 0
    result = barellm("chat", model, input_text="Hi\n")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == ("barellm: chat: this model has no chat template (its "
                             "tokenizer_config.json had no chat_template when it was "
                             "converted)\n")
    for args, message in [(["-p", "Hi"], "chat reads its messages from standard input"),
                          (["--chat"], "--chat is for run"),
                          (["--top-k", "x"], "--top-k needs an integer")]:
        assert_wrong_command_line(barellm("chat", chat_model, *args, input_text="Hi\n"),
                                  "barellm", message)


# ---- on a terminal -----------------------------------------------------------------------

class Terminal:
    """barellm chat with a pseudo-terminal as its controlling terminal, stdin and stdout;
    stderr is a separate pipe."""

    def __init__(self, *args):
        self.master, slave = os.openpty()

        def own_the_terminal():
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.process = subprocess.Popen([BARELLM, "chat", *map(str, args)], stdin=slave,
                                        stdout=slave, stderr=subprocess.PIPE,
                                        preexec_fn=own_the_terminal)
        os.close(slave)
        os.set_blocking(self.process.stderr.fileno(), False)
        self.out = b""
        self.err = b""

    def read(self, until, timeout=60):
        """Reads until `until(out, err)` holds (out, err: all text so far)."""
        deadline = time.monotonic() + timeout
        err_fd = self.process.stderr.fileno()
        while not until(self.out.decode(errors="replace"), self.err.decode(errors="replace")):
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"timed out; stdout {self.out!r}, stderr {self.err!r}")
            ready, _, _ = select.select([self.master, err_fd], [], [], left)
            for fd in ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the terminal's other side closed
                    chunk = b""
                if fd == self.master:
                    self.out += chunk
                else:
                    self.err += chunk
            if self.process.poll() is not None and not ready:
                break

    def type(self, text):
        os.write(self.master, text.encode())

    def prompts(self):
        return self.out.decode(errors="replace").count("> ")

    def finish(self):
        self.read(lambda out, err: self.process.poll() is not None)
        code = self.process.wait(timeout=60)
        os.close(self.master)
        return code


def test_a_three_turn_conversation_on_a_terminal(chat_model):
    term = Terminal(chat_model, "--temp", "0", "-n", 16)
    term.read(lambda out, err: out.endswith("> "))
    assert "barellm chat (Llama 2 template)" in term.err.decode()
    for turn, message in enumerate(["Hi", "Tell me more", "Why?"], start=1):
        term.type(message + "\n")
        term.read(lambda out, err: len(stats(err)) == turn and out.endswith("> "))
    turns = stats(term.err.decode())
    assert turns[0][0] == token_count(chat_model, hf_render(LLAMA2_CHAT, "Hi"))
    assert turns[1][0] == 1 + token_count(chat_model, " </s><s>[INST] Tell me more [/INST]")
    assert turns[2][0] == 1 + token_count(chat_model, " </s><s>[INST] Why? [/INST]")
    out = term.out.decode().replace("\r\n", "\n")
    assert run_chat_reply(chat_model, "Hi", 16) + "\n> " in out
    term.type("/exit\n")
    assert term.finish() == 0


def test_ctrl_c_stops_only_the_reply(slow_chat_model):
    term = Terminal(slow_chat_model, "--temp", "1", "--seed", "1", "-n", 3000, "--top-k", "50")
    term.read(lambda out, err: out.endswith("> "))
    term.type("Tell me a long story\n")
    # Some of the reply, then Ctrl-C through the terminal.
    term.read(lambda out, err: "story" in out and len(out.split("story")[-1].strip()) > 20)
    term.type("\x03")
    term.read(lambda out, err: len(stats(err)) == 1 and out.endswith("> "))
    turn = stats(term.err.decode())[0]
    assert turn[2] == "interrupted" and turn[1] < 3000
    # The conversation goes on: the next turn prefills only its own tokens.
    term.type("Go on\n")
    term.read(lambda out, err: "Go on" in out and len(out.split("Go on")[-1].strip()) > 20)
    term.type("\x03")
    term.read(lambda out, err: len(stats(err)) == 2 and out.endswith("> "))
    second = stats(term.err.decode())[1]
    assert second[2] == "interrupted"
    assert second[0] == token_count(slow_chat_model, " </s><s>[INST] Go on [/INST]")
    assert second[3] == turn[3] + second[0] + second[1]
    # Ctrl-C at the prompt leaves.
    term.type("\x03")
    assert term.finish() == 0


def test_ctrl_d_leaves(chat_model):
    term = Terminal(chat_model, "--temp", "0", "-n", 4)
    term.read(lambda out, err: out.endswith("> "))
    term.type("\x04")
    assert term.finish() == 0
    assert stats(term.err.decode()) == []


def test_color_marks_what_the_user_types(chat_model):
    term = Terminal(chat_model, "--temp", "0", "-n", 4, "--color")
    term.read(lambda out, err: out.endswith("> "))
    assert term.out.endswith(b"\x1b[32m> ")
    term.type("Hi\n")
    term.read(lambda out, err: len(stats(err)) == 1 and out.endswith("> "))
    assert b"\x1b[32m> Hi\r\n\x1b[0m" in term.out
    term.type("/exit\n")
    assert term.finish() == 0
    piped = barellm("chat", chat_model, "--temp", "0", "-n", 4, "--color", input_text="Hi\n")
    assert "\x1b" not in piped.stdout

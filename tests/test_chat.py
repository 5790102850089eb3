"""`run --chat`: the converter keeps tokenizer_config.json's chat_template, the built-in
renderings (src/tokenizer/chat.cpp, through build/chat_render) equal what jinja2 renders from the
real templates as transformers' apply_chat_template does, and the command runs with them.

The real templates are in tests/data/chat_templates.json, each with the checkpoint it was
copied from (no checkpoint with a chat template is available offline)."""

import datetime
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from convert_testlib import (BUILD, CONVERT, REPO, SMOLLM2_TOKENIZER, STORIES, SYNTH,
                             make_checkpoint, need_shared, read_raw, run, tiny_tensors)

jinja2 = pytest.importorskip("jinja2")
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

CHAT_RENDER = os.path.join(BUILD, "chat_render")
BARELLM = os.path.join(BUILD, "barellm")
with open(os.path.join(REPO, "tests", "data", "chat_templates.json"), encoding="utf-8") as f:
    TEMPLATES = {entry["name"]: entry for entry in json.load(f)}
SMOLLM2_TEMPLATE = TEMPLATES["smollm2-instruct"]["chat_template"]

PROMPTS = [
    "Hello",
    "What is the capital of France?",
    'He said "it\'s fine" and left.',
    "line one\nline two\n\n  indented\tTab",
    "  padded with spaces and newlines \n\n",
    "\u00a0\u3000unicode spaces\u2003 caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001f600\u2028",
    "{{ not jinja }} {% raw %} <|im_end|> [INST]",
    "",
]


SYSTEMS = ["You are a pirate.", "  Answer in French.\n\n", "", "\u65e5\u672c\u8a9e <|eot_id|>"]
# Templates that raise_exception on a system message.
NO_SYSTEM_ROLE = {"mistral-instruct-v0.1", "mixtral-instruct-v0.1", "gemma2-it"}


def hf_render(entry, prompt, system=None, **variables):
    """apply_chat_template(..., tokenize=False, add_generation_prompt=True, **variables) as
    transformers does it: a sandboxed jinja2 environment with trim_blocks and
    lstrip_blocks, raise_exception and strftime_now, and the special tokens as variables."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda format: datetime.datetime.now().strftime(format)
    messages = [{"role": "user", "content": prompt}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    return env.from_string(entry["chat_template"]).render(
        messages=messages, add_generation_prompt=True,
        bos_token=entry["bos_token"], eos_token=entry["eos_token"], **variables)


def chat_render(tmp_path, template, prompt, bos, system=None, no_think=False, effort=None):
    """(returncode, stdout bytes, stderr text) of build/chat_render."""
    if not os.path.exists(CHAT_RENDER):
        pytest.fail(f"{CHAT_RENDER} is missing: run `make` first")
    (tmp_path / "template").write_bytes(template.encode("utf-8"))
    (tmp_path / "prompt").write_bytes(prompt.encode("utf-8"))
    args = [CHAT_RENDER, *(["--no-think"] if no_think else []),
            *(["--effort", effort] if effort is not None else []), tmp_path / "template",
            tmp_path / "prompt", bos]
    if system is not None:
        (tmp_path / "system").write_bytes(system.encode("utf-8"))
        args.append(tmp_path / "system")
    result = subprocess.run(args, capture_output=True, timeout=60)
    return result.returncode, result.stdout, result.stderr.decode()


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_rendering_matches_jinja(tmp_path, name, prompt):
    entry = TEMPLATES[name]
    code, out, err = chat_render(tmp_path, entry["chat_template"], prompt, entry["bos_token"])
    assert code == 0, err
    assert err.strip() == entry["family"]
    assert out.decode("utf-8") == hf_render(entry, prompt)


@pytest.mark.parametrize("system", SYSTEMS)
@pytest.mark.parametrize("name", sorted(set(TEMPLATES) - NO_SYSTEM_ROLE))
def test_rendering_with_a_system_message_matches_jinja(tmp_path, name, system):
    entry = TEMPLATES[name]
    for prompt in PROMPTS[:5]:
        code, out, err = chat_render(tmp_path, entry["chat_template"], prompt,
                                     entry["bos_token"], system)
        assert code == 0, err
        assert out.decode("utf-8") == hf_render(entry, prompt, system)


@pytest.mark.parametrize("name", sorted(NO_SYSTEM_ROLE))
def test_a_system_message_is_refused_where_the_template_refuses_it(tmp_path, name):
    entry = TEMPLATES[name]
    with pytest.raises(jinja2.exceptions.TemplateError):
        hf_render(entry, "Hi", "Be brief.")
    code, out, err = chat_render(tmp_path, entry["chat_template"], "Hi", entry["bos_token"],
                                 "Be brief.")
    assert code == 1 and out == b""
    assert "has no system role" in err and len(err.strip().splitlines()) == 1


def test_the_exact_renderings(tmp_path):
    """The strings of docs: one per family, spelled out."""
    want = {
        "smollm2-instruct": "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                            "trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                            "<|im_start|>assistant\n",
        "qwen2-instruct": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "chatml-plain": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "llama3-instruct": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi"
                           "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "llama3.1-instruct": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
                             "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024"
                             "\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi"
                             "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "qwen2.5-instruct": "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You "
                            "are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi"
                            "<|im_end|>\n<|im_start|>assistant\n",
        "qwen3": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "llama2-chat": "<s>[INST] Hi [/INST]",
        "mistral-instruct-v0.1": "<s>[INST] Hi [/INST]",
        "gemma3-it": "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
        "gemma2-it": "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
        "phi3-mini-4k-instruct": "<|user|>\nHi<|end|>\n<|assistant|>\n",
        "phi4-mini-instruct": "<|user|>Hi<|end|><|assistant|>",
        "phi4": "<|im_start|>user<|im_sep|>Hi<|im_end|><|im_start|>assistant<|im_sep|>",
    }
    for name, text in want.items():
        entry = TEMPLATES[name]
        code, out, err = chat_render(tmp_path, entry["chat_template"], " Hi " if
                                     name.startswith(("llama", "gemma")) else "Hi",
                                     entry["bos_token"])
        assert code == 0, err
        assert out.decode() == text
    # Gemma 3 folds the system message, untrimmed, into the first user turn.
    entry = TEMPLATES["gemma3-it"]
    code, out, err = chat_render(tmp_path, entry["chat_template"], " Hi ", "<bos>", " Be brief.")
    assert code == 0, err
    assert out.decode() == ("<bos><start_of_turn>user\n Be brief.\n\nHi<end_of_turn>\n"
                            "<start_of_turn>model\n")


# Templates with Qwen3's enable_thinking switch.
THINKING_SWITCH = {"qwen3"}


@pytest.mark.parametrize("system", [None, *SYSTEMS])
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("name", sorted(THINKING_SWITCH))
def test_no_think_matches_jinja_with_enable_thinking_false(tmp_path, name, prompt, system):
    entry = TEMPLATES[name]
    code, out, err = chat_render(tmp_path, entry["chat_template"], prompt, entry["bos_token"],
                                 system, no_think=True)
    assert code == 0, err
    want = hf_render(entry, prompt, system, enable_thinking=False)
    assert want.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert out.decode("utf-8") == want
    # enable_thinking=True renders as the default.
    code, out, err = chat_render(tmp_path, entry["chat_template"], prompt, entry["bos_token"],
                                 system)
    assert out.decode("utf-8") == hf_render(entry, prompt, system, enable_thinking=True)


@pytest.mark.parametrize("name", sorted(set(TEMPLATES) - THINKING_SWITCH))
def test_no_think_is_refused_where_the_template_has_no_switch(tmp_path, name):
    entry = TEMPLATES[name]
    assert "enable_thinking" not in entry["chat_template"]
    code, out, err = chat_render(tmp_path, entry["chat_template"], "Hi", entry["bos_token"],
                                 no_think=True)
    assert code == 1 and out == b""
    assert "has no enable_thinking switch" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("template,message", [
    ("{% for message in messages %}{{ '<|user|>\n' + message['content'] + eos_token }}"
     "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}",
     "not one barellm knows"),
    ("{{- bos_token }}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
     "{{- 'Cutting Knowledge Date: December 2023\\n' }}{{- '<|eot_id|>' }}",
     "Llama 3.1-style"),
    ("{{ bos_token }}{% for message in messages %}{{ '[INST] ' + message['content'] + "
     "'[/INST]' }}{% endfor %}", "[INST] chat template of a variant"),
    ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
     "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}", "generation prompt"),
    # Gemma-like, but the system message neither folded in as Gemma 3 does nor refused.
    ("{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + "
     "'\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
     "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}",
     "Gemma-style chat template"),
    ("{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + "
     "'\n' + message['content'] + '<end_of_turn>\n' }}{% endfor %}", "| trim"),
    # Phi-3-mini's template of April 2024: no generation prompt, the assistant's tag written
    # after each user turn.
    ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}"
     "{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}"
     "{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}"
     "{% endif %}{% endfor %}", "Phi-style chat template"),
    # ChatML with <|im_sep|>, but with newlines after the turns.
    ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '<|im_sep|>' + "
     "message['content'] + '<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}"
     "{{ '<|im_start|>assistant<|im_sep|>' }}{% endif %}", "<|im_sep|>"),
])
def test_unknown_templates_are_refused(tmp_path, template, message):
    code, out, err = chat_render(tmp_path, template, "Hi", "<s>")
    assert code == 1 and out == b""
    assert message in err and len(err.strip().splitlines()) == 1


CHATML_HEAD = "<|im_start|>assistant\n"
SYSTEM_OPEN = "'<|im_start|>system\n"
REPEATS = 100_000  # about 2 MB of template: a scan per candidate would take minutes


@pytest.mark.parametrize("template,system", [
    # Candidate system turns that no <|im_end|> follows.
    ("<|im_end|>" + CHATML_HEAD + SYSTEM_OPEN * REPEATS, ""),
    # Candidates that all share one <|im_end|>, each closed early by the next one's quote.
    (CHATML_HEAD + SYSTEM_OPEN * REPEATS + "<|im_end|>\n'", ""),
    # Candidates whose literal holds an escape the recogniser does not decode.
    (CHATML_HEAD + SYSTEM_OPEN + ("\\" + SYSTEM_OPEN) * REPEATS + "\\x<|im_end|>\n'", ""),
    # The same literal without that escape: the first candidate is the system turn.
    (CHATML_HEAD + SYSTEM_OPEN + ("\\" + SYSTEM_OPEN) * REPEATS + "<|im_end|>\n'",
     SYSTEM_OPEN * REPEATS),
], ids=["no-end", "shared-end", "bad-escape", "long-system"])
def test_large_templates_are_recognised_in_one_pass(tmp_path, template, system):
    code, out, err = chat_render(tmp_path, template, "Hi", "<s>")
    assert code == 0, err
    turn = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    assert out.decode() == turn + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


# ---- the converter ---------------------------------------------------------------------

def converted_metadata(tmp_path, tok_config):
    hf = make_checkpoint(str(tmp_path / "hf"))
    if tok_config is not None:
        with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
            json.dump(tok_config, f)
    out = str(tmp_path / "model.bin")
    result = run(CONVERT, hf, "-o", out)
    assert result.returncode == 0, result.stderr
    return read_raw(out)[1]["__metadata__"]


def test_converter_stores_the_template_verbatim(tmp_path):
    metadata = converted_metadata(tmp_path, {"chat_template": SMOLLM2_TEMPLATE})
    assert metadata["barellm.chat_template"] == SMOLLM2_TEMPLATE


def test_converter_takes_the_default_of_a_template_list(tmp_path):
    templates = [{"name": "tool_use", "template": "{{ tools }}"},
                 {"name": "default", "template": SMOLLM2_TEMPLATE}]
    metadata = converted_metadata(tmp_path, {"chat_template": templates})
    assert metadata["barellm.chat_template"] == SMOLLM2_TEMPLATE


@pytest.mark.parametrize("tok_config", [None, {"add_bos_token": True}])
def test_converter_omits_a_missing_template(tmp_path, tok_config):
    assert "barellm.chat_template" not in converted_metadata(tmp_path, tok_config)


# ---- barellm run --chat ------------------------------------------------------------------

SMALL_SMOLLM2 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 49152,
    "max_position_embeddings": 256, "rope_theta": 100000, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
}


def smollm2_tokenizer_dir(tmp_path):
    """The SmolLM2 tokenizer.json with a tokenizer_config.json carrying its chat template."""
    tok = tmp_path / "tok"
    tok.mkdir()
    shutil.copy(os.path.join(need_shared(SMOLLM2_TOKENIZER), "tokenizer.json"), tok)
    (tok / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": SMOLLM2_TEMPLATE, "bos_token": "<|im_start|>",
         "eos_token": "<|im_end|>", "add_bos_token": False}))
    return tok


def barellm(*args):
    if not os.path.exists(BARELLM):
        pytest.fail(f"{BARELLM} is missing: run `make` first")
    return subprocess.run([BARELLM, *map(str, args)], capture_output=True, timeout=120)


def test_chat_runs_on_a_smollm2_shaped_model(tmp_path):
    tok = smollm2_tokenizer_dir(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL_SMOLLM2))
    hf = tmp_path / "hf"
    result = run(SYNTH, "--config", config, "--tokenizer", tok, "-o", hf)
    assert result.returncode == 0, result.stderr
    model = tmp_path / "model.bin"
    result = run(CONVERT, hf, "-o", model)
    assert result.returncode == 0, result.stderr

    prompt = 'Say "hi"\nin one word, caf\u00e9'
    result = barellm("run", model, "-p", prompt, "--chat", "-n", "5", "--temp", "0")
    assert result.returncode == 0, result.stderr.decode()
    # The prompt is the rendering, special tokens parsed, no BOS added.
    rendered = hf_render({**TEMPLATES["smollm2-instruct"]}, prompt)
    ids = json.loads(barellm("tokenize", model, "-p", rendered).stdout)
    assert ids[:3] == [1, 9690, 198] and ids.count(1) == 3 and ids.count(2) == 2
    assert f"prompt: {len(ids)} tokens".encode() in result.stderr
    assert not result.stdout.startswith(prompt.encode())  # only the reply is printed

    # --system replaces the template's default system turn.
    system = "Reply in French."
    result = barellm("run", model, "-p", prompt, "--chat", "--system", system, "-n", "5",
                     "--temp", "0")
    assert result.returncode == 0, result.stderr.decode()
    rendered = hf_render({**TEMPLATES["smollm2-instruct"]}, prompt, system)
    assert system in rendered and "SmolLM" not in rendered
    ids = json.loads(barellm("tokenize", model, "-p", rendered).stdout)
    assert f"prompt: {len(ids)} tokens".encode() in result.stderr

    result = barellm("run", model, "-p", prompt, "--system", system)
    assert result.returncode == 2 and b"--system needs --chat" in result.stderr


def test_chat_stops_at_the_end_of_turn_token(tmp_path):
    """A model that always predicts <|im_end|> (id 2, not in eos_ids here): --chat stops
    on it at once; without --chat it runs to -n."""
    tok = smollm2_tokenizer_dir(tmp_path)
    cfg = {**SMALL_SMOLLM2, "tie_word_embeddings": False, "eos_token_id": 0,
           "torch_dtype": "float32"}
    tensors = tiny_tensors(cfg)
    dim, vocab = cfg["hidden_size"], cfg["vocab_size"]
    for name in tensors:  # no layer changes the residual stream: h = embedding
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name] = ("F32", np.zeros_like(tensors[name][1]))
    tensors["model.embed_tokens.weight"] = ("F32", np.ones((vocab, dim), "<f4"))
    tensors["model.norm.weight"] = ("F32", np.ones(dim, "<f4"))
    head = np.zeros((vocab, dim), "<f4")
    head[2] = 1.0
    tensors["lm_head.weight"] = ("F32", head)
    with open(os.path.join(tok, "tokenizer.json")) as f:
        tokenizer = json.load(f)
    hf = make_checkpoint(str(tmp_path / "hf"), cfg, tensors, tokenizer)
    shutil.copy(tok / "tokenizer_config.json", hf)
    model = tmp_path / "model.bin"
    result = run(CONVERT, hf, "-o", model)
    assert result.returncode == 0, result.stderr

    chat = barellm("run", model, "-p", "Hi", "--chat", "-n", "5", "--temp", "0")
    assert chat.returncode == 0, chat.stderr.decode()
    assert b"generated: 1 tokens" in chat.stderr and b"stopped: end of text" in chat.stderr
    plain = barellm("run", model, "-p", "Hi", "-n", "5", "--temp", "0")
    assert plain.returncode == 0, plain.stderr.decode()
    assert b"generated: 5 tokens" in plain.stderr and b"stopped: reached -n" in plain.stderr


def test_chat_without_a_template_is_refused(tmp_path):
    model = tmp_path / "stories.bin"
    result = run(CONVERT, need_shared(STORIES), "-o", model)
    assert result.returncode == 0, result.stderr
    result = barellm("run", model, "-p", "Once", "--chat", "-n", "5")
    assert result.returncode == 1 and result.stdout == b""
    assert result.stderr.decode() == (
        "barellm: --chat: this model has no chat template (its tokenizer_config.json had no "
        "chat_template when it was converted)\n")


def test_chat_with_an_unknown_template_is_refused(tmp_path):
    hf = make_checkpoint(str(tmp_path / "hf"))
    with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": "{% for m in messages %}<|user|>{{ m.content }}"
                                    "{% endfor %}"}, f)
    model = tmp_path / "model.bin"
    result = run(CONVERT, hf, "-o", model)
    assert result.returncode == 0, result.stderr
    result = barellm("run", model, "-p", "ab", "--chat", "-n", "2")
    assert result.returncode == 1
    err = result.stderr.decode()
    assert err.startswith("barellm: --chat: the model's chat template is not one barellm "
                          "knows") and len(err.strip().splitlines()) == 1


# ---- the turns after the first (barellm chat) ---------------------------------------------

def chat_render_next(tmp_path, template, prompt, bos, eos):
    (tmp_path / "template").write_bytes(template.encode("utf-8"))
    (tmp_path / "prompt").write_bytes(prompt.encode("utf-8"))
    result = subprocess.run([CHAT_RENDER, "--next", tmp_path / "template", tmp_path / "prompt",
                             bos, eos], capture_output=True, timeout=60)
    return result.returncode, result.stdout, result.stderr.decode()


def chat_render_reply(tmp_path, template, content):
    (tmp_path / "template").write_bytes(template.encode("utf-8"))
    (tmp_path / "content").write_bytes(content.encode("utf-8"))
    result = subprocess.run([CHAT_RENDER, "--reply", tmp_path / "template", tmp_path / "content"],
                            capture_output=True, timeout=60)
    return result.returncode, result.stdout, result.stderr.decode()


def hf_render_conversation(entry, messages):
    """apply_chat_template of a whole conversation, as hf_render does for one message."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda format: datetime.datetime.now().strftime(format)
    return env.from_string(entry["chat_template"]).render(
        messages=messages, add_generation_prompt=True,
        bos_token=entry["bos_token"], eos_token=entry["eos_token"])


REPLIES = ["Paris.", "Sure, here it is:\n\n- one\n- two", "caf\u00e9 \U0001f600"]


@pytest.mark.parametrize("prompt", PROMPTS[:6])
@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_later_turns_match_jinja(tmp_path, name, prompt):
    """The first turn's rendering, the reply as render_reply writes it, then
    render_next_turn, equal jinja2's rendering of the whole conversation, with and without a
    system message, over three turns. render_reply writes the reply as generated but for
    Llama-2-chat's space before it (which the model generates: its replies start with a
    space) and harmony's final channel header (the analysis channel of past turns dropped)."""
    entry = TEMPLATES[name]
    systems = [None] if name in NO_SYSTEM_ROLE else [None, "Be brief."]
    for system in systems:
        messages = [] if system is None else [{"role": "system", "content": system}]
        messages.append({"role": "user", "content": "Hi"})
        code, first, err = chat_render(tmp_path, entry["chat_template"], "Hi",
                                       entry["bos_token"], system)
        assert code == 0, err
        text = first.decode("utf-8")
        for reply, user in zip(REPLIES, [prompt, "And then?", prompt]):
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": user}]
            code, out, err = chat_render_next(tmp_path, entry["chat_template"], user,
                                              entry["bos_token"], entry["eos_token"])
            assert code == 0, err
            code, written_reply, err = chat_render_reply(tmp_path, entry["chat_template"], reply)
            assert code == 0, err
            text += written_reply.decode("utf-8") + out.decode("utf-8")
            assert text == hf_render_conversation(entry, messages)
            if name != "gpt-oss":  # as generated, but for Llama-2-chat's leading space
                assert written_reply.decode("utf-8").lstrip(" ") == reply


@pytest.mark.parametrize("model_type,template", [("qwen2", "qwen2.5-instruct"),
                                                 ("qwen3", "qwen3")])
def test_chat_runs_on_qwen_shaped_models(tmp_path, model_type, template):
    """Small Qwen2/Qwen3 models with the SmolLM2 tokenizer (no Qwen tokenizer is at hand;
    it has the same <|im_start|>/<|im_end|> markers) and the real Qwen templates: the
    prompt is the jinja2 rendering, with --no-think the enable_thinking=False one."""
    tok = tmp_path / "tok"
    tok.mkdir()
    shutil.copy(os.path.join(need_shared(SMOLLM2_TOKENIZER), "tokenizer.json"), tok)
    entry = TEMPLATES[template]
    (tok / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": entry["chat_template"], "bos_token": None,
         "eos_token": "<|im_end|>", "add_bos_token": False}))
    config = {**SMALL_SMOLLM2, "architectures": [model_type.capitalize() + "ForCausalLM"],
              "model_type": model_type, "rope_theta": 1000000.0}
    if model_type == "qwen3":
        config["head_dim"] = 12
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf, model = tmp_path / "hf", tmp_path / "model.bin"
    result = run(SYNTH, "--config", tmp_path / "config.json", "--tokenizer", tok, "-o", hf)
    assert result.returncode == 0, result.stderr
    result = run(CONVERT, hf, "-o", model)
    assert result.returncode == 0, result.stderr

    prompt = "Why is the sky blue?"
    modes = [([], {})] + ([(["--no-think"], {"enable_thinking": False}),
                           (["--show-think"], {})] if model_type == "qwen3" else [])
    for flags, variables in modes:
        result = barellm("run", model, "-p", prompt, "--chat", *flags, "-n", "3", "--temp", "0")
        assert result.returncode == 0, result.stderr.decode()
        rendered = hf_render(entry, prompt, **variables)
        ids = json.loads(barellm("tokenize", model, "-p", rendered).stdout)
        assert f"prompt: {len(ids)} tokens".encode() in result.stderr
    if model_type == "qwen2":
        result = barellm("run", model, "-p", prompt, "--chat", "--no-think")
        assert result.returncode == 1 and b"has no enable_thinking switch" in result.stderr
    for flag in ("--no-think", "--show-think"):
        result = barellm("run", model, "-p", prompt, flag)
        assert result.returncode == 2 and f"{flag} needs --chat".encode() in result.stderr


# ---- harmony (gpt-oss) ---------------------------------------------------------------------

GPT_OSS = TEMPLATES["gpt-oss"]


def test_the_harmony_rendering_spelled_out(tmp_path):
    """The dated system message, the system message as a developer message, the user turn
    and the generation prompt, written out by hand from the template."""
    today = datetime.date.today().strftime("%Y-%m-%d")
    head = ("<|start|>system<|message|>You are ChatGPT, a large language model trained by "
            f"OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: {today}\n\nReasoning: medium"
            "\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
            "every message.<|end|>")
    turn = "<|start|>user<|message|> Hi <|end|><|start|>assistant"
    code, out, err = chat_render(tmp_path, GPT_OSS["chat_template"], " Hi ", "")
    assert code == 0, err
    assert out.decode() == head + turn
    code, out, err = chat_render(tmp_path, GPT_OSS["chat_template"], " Hi ", "", " Be brief.")
    assert code == 0, err
    assert out.decode() == (head + "<|start|>developer<|message|># Instructions\n\n Be brief."
                            "\n\n<|end|>" + turn)
    code, out, err = chat_render_reply(tmp_path, GPT_OSS["chat_template"], "Paris.")
    assert code == 0, err
    assert out.decode() == "<|channel|>final<|message|>Paris."
    code, out, err = chat_render_next(tmp_path, GPT_OSS["chat_template"], "And?", "", "")
    assert code == 0, err
    assert out.decode() == "<|end|><|start|>user<|message|>And?<|end|><|start|>assistant"


@pytest.mark.parametrize("effort", ["low", "medium", "high"])
@pytest.mark.parametrize("system", [None, "Be brief."])
def test_the_harmony_reasoning_effort_matches_jinja(tmp_path, effort, system):
    """A reasoning effort in place of the template's default, as apply_chat_template(...,
    reasoning_effort=...) renders it."""
    code, out, err = chat_render(tmp_path, GPT_OSS["chat_template"], "Hi", "", system,
                                 effort=effort)
    assert code == 0, err
    assert out.decode() == hf_render(GPT_OSS, "Hi", system, reasoning_effort=effort)
    assert f"Reasoning: {effort}\n" in out.decode()


@pytest.mark.parametrize("name,effort,message", [
    ("gpt-oss", "extreme", "--effort 'extreme' is not low, medium or high"),
    ("gpt-oss", "", "--effort '' is not low, medium or high"),
    ("smollm2-instruct", "low", "--effort needs a harmony chat template (gpt-oss); this "
                                "model's is ChatML"),
])
def test_a_reasoning_effort_is_refused_where_it_means_nothing(tmp_path, name, effort, message):
    code, out, err = chat_render(tmp_path, TEMPLATES[name]["chat_template"], "Hi",
                                 TEMPLATES[name]["bos_token"], effort=effort)
    assert code == 1 and out == b""
    assert message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("reply", ["<|channel|>analysis<|message|>x",
                                   "a<|channel|>final<|message|>"])
def test_a_reply_holding_channel_markers_is_refused_as_the_template_refuses_it(tmp_path, reply):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": reply},
                {"role": "user", "content": "And?"}]
    with pytest.raises(jinja2.exceptions.TemplateError):
        hf_render_conversation(GPT_OSS, messages)
    code, out, err = chat_render_reply(tmp_path, GPT_OSS["chat_template"], reply)
    assert code == 1 and out == b""
    assert "refuses an assistant message holding" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("edit,message", [
    (("set model_identity = ", "set identity = "), "a model_identity default"),
    (("Knowledge cutoff: 2024-06\\n", "Knowledge cutoff: 2024-06"), "a knowledge cutoff"),
    (('strftime_now("%Y-%m-%d")', 'strftime_now("%d %b %Y")'), "strftime_now"),
    (("set reasoning_effort = ", "set effort = "), "a reasoning_effort default"),
    (("Channel must be included", "Channels must be included"), "# Valid channels"),
    (("# Instructions", "# Rules"), "a developer message"),
    (('"<|start|>user<|message|>" + message.content', '"<|start|>user<|message|>" + message.text'),
     '"<|start|>user<|message|>" + message.content'),
    (('final<|message|>" + message.content + "<|end|>"', 'final<|message|>" + message.text'),
     "<|channel|>final<|message|>"),
])
def test_harmony_variants_barellm_cannot_render_are_refused(tmp_path, edit, message):
    template = GPT_OSS["chat_template"]
    assert edit[0] in template
    code, out, err = chat_render(tmp_path, template.replace(edit[0], edit[1]), "Hi", "")
    assert code == 1 and out == b""
    assert "a harmony chat template" in err and message in err, err
    assert len(err.strip().splitlines()) == 1

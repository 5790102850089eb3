"""gpt-oss's harmony chat format end to end: `run --chat`, `chat` and the server's chat
completions on a small model whose tokenizer (SmolLM2's with harmony's special tokens added)
and template (the real gpt-oss one) are gpt-oss's, and whose weights make it write a harmony
reply: an analysis message, then the final one. Only the final channel reaches the user;
`--show-think` prints the reply as generated; <|return|> ends the turn; a conversation's KV
cache holds what jinja2 renders of it (the analysis of past turns dropped)."""

import json
import os

import numpy as np
import pytest

from convert_testlib import (CONVERT, SMOLLM2_TOKENIZER, make_checkpoint, need_shared, run,
                             tiny_tensors)
from test_chat import TEMPLATES, hf_render, hf_render_conversation
from test_chat_command import stats
from test_cli import barellm
from test_serve import Server

GPT_OSS = TEMPLATES["gpt-oss"]
SMOLLM2_VOCAB = 49152
HARMONY_TOKENS = ["<|start|>", "<|message|>", "<|channel|>", "<|end|>", "<|return|>",
                  "<|call|>", "<|constrain|>"]
SPECIAL = {text: SMOLLM2_VOCAB + i for i, text in enumerate(HARMONY_TOKENS)}
# SmolLM2's ids of the words of the reply: "assistant" is two tokens.
ASSISTANT = [520, 9531]
ANALYSIS, FINAL, THOUGHT, ANSWER = 14975, 17254, 10768, 38634  # analysis final Well Paris
REASONING_TEXT, ANSWER_TEXT = "Well", "Paris"
# With --repeat-penalty 3 the model writes, after the generation prompt <|start|>assistant:
REPLY = (f"<|channel|>analysis<|message|>{REASONING_TEXT}<|end|><|start|>assistant"
         f"<|channel|>final<|message|>{ANSWER_TEXT}")
PENALTY = ["--repeat-penalty", "3"]


def successors():
    """(token, next token, weight) of the reply's chain. <|channel|> and <|message|> have two
    successors: the first one weighs twice as much, so the model takes it first and, once the
    repeat penalty divides it by 3, the second."""
    start, message, channel = SPECIAL["<|start|>"], SPECIAL["<|message|>"], SPECIAL["<|channel|>"]
    return [(start, ASSISTANT[0], 1), (ASSISTANT[0], ASSISTANT[1], 1),
            (ASSISTANT[1], channel, 1), (channel, ANALYSIS, 2), (channel, FINAL, 1),
            (ANALYSIS, message, 1), (FINAL, message, 1), (message, THOUGHT, 2),
            (message, ANSWER, 1), (THOUGHT, SPECIAL["<|end|>"], 1),
            (SPECIAL["<|end|>"], start, 1), (ANSWER, SPECIAL["<|return|>"], 1)]


def harmony_checkpoint(path):
    """A Llama-shaped model that predicts each token's successor in the chain: the layers add
    nothing to the residual stream, each chain token's embedding is a one-hot vector of its
    own, and the output row of a successor is its predecessor's vector times the weight."""
    with open(os.path.join(need_shared(SMOLLM2_TOKENIZER), "tokenizer.json")) as f:
        tokenizer = json.load(f)
    tokenizer["added_tokens"] += [
        {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True} for text, i in SPECIAL.items()]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_act": "silu", "hidden_size": 32, "intermediate_size": 64,
              "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": SMOLLM2_VOCAB + len(HARMONY_TOKENS),
              "max_position_embeddings": 1024, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False, "torch_dtype": "float32",
              "eos_token_id": SPECIAL["<|call|>"]}  # <|return|> ends the turn: end_of_turn
    tensors = tiny_tensors(config)
    dim, vocab = config["hidden_size"], config["vocab_size"]
    for name in tensors:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name] = ("F32", np.zeros_like(tensors[name][1]))
    chain = successors()
    tokens = sorted({token for pair in chain for token in pair[:2]})
    slot = {token: i for i, token in enumerate(tokens)}
    embedding = np.zeros((vocab, dim), "<f4")
    for token in tokens:
        embedding[token, slot[token]] = 1.0
    head = np.zeros((vocab, dim), "<f4")
    for token, successor, weight in chain:
        head[successor, slot[token]] = weight
    tensors["model.embed_tokens.weight"] = ("F32", embedding)
    tensors["model.norm.weight"] = ("F32", np.ones(dim, "<f4"))
    tensors["lm_head.weight"] = ("F32", head)
    hf = make_checkpoint(str(path), config, tensors, tokenizer)
    with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": GPT_OSS["chat_template"], "bos_token": "<|startoftext|>",
                   "eos_token": "<|return|>", "add_bos_token": False}, f)
    return hf


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    hf = harmony_checkpoint(tmp_path_factory.mktemp("hf") / "harmony")
    path = tmp_path_factory.mktemp("model") / "harmony.bin"
    result = run(CONVERT, hf, "-o", path)
    assert result.returncode == 0, result.stderr
    return path


def token_count(model, text):
    return len(json.loads(barellm("tokenize", model, "-p", text).stdout))


def test_run_chat_shows_the_final_channel(model):
    result = barellm("run", model, "-p", "Hi", "--chat", "--temp", "0", *PENALTY, "-n", "40")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ANSWER_TEXT + "\n"
    err = result.stderr
    # The prompt is jinja2's rendering; the reply's tokens and <|return|>, which stops it.
    assert f"prompt: {token_count(model, hf_render(GPT_OSS, 'Hi'))} tokens" in err
    assert "generated: 13 tokens" in err and "stopped: end of text" in err

    shown = barellm("run", model, "-p", "Hi", "--chat", "--show-think", "--temp", "0",
                    *PENALTY, "-n", "40")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == REPLY + "\n"

    # Without the penalty the model thinks forever: nothing of it is shown.
    thinking = barellm("run", model, "-p", "Hi", "--chat", "--temp", "0", "-n", "30")
    assert thinking.returncode == 0, thinking.stderr
    assert thinking.stdout == "\n" and "stopped: reached -n" in thinking.stderr


def test_run_chat_with_a_system_message_renders_a_developer_message(model):
    result = barellm("run", model, "-p", "Hi", "--chat", "--system", "Be brief.", "--temp",
                     "0", *PENALTY, "-n", "40")
    assert result.returncode == 0, result.stderr
    rendered = hf_render(GPT_OSS, "Hi", "Be brief.")
    assert "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>" in rendered
    assert f"prompt: {token_count(model, rendered)} tokens" in result.stderr
    no_think = barellm("run", model, "-p", "Hi", "--chat", "--no-think")
    assert no_think.returncode == 1 and "has no enable_thinking switch" in no_think.stderr


def test_a_reasoning_effort_is_rendered_as_jinja2_renders_it(model):
    """--reasoning-effort in run --chat and chat: the prompt is as long as
    apply_chat_template(..., reasoning_effort=...) writes it (test_chat.py holds the text
    itself through set_reasoning_effort); refused without a chat, and for a level that is not
    OpenAI's."""
    for effort in ("low", "high"):
        rendered = hf_render(GPT_OSS, "Hi", reasoning_effort=effort)
        result = barellm("run", model, "-p", "Hi", "--chat", "--reasoning-effort", effort,
                         "-n", "1")
        assert result.returncode == 0, result.stderr
        assert f"prompt: {token_count(model, rendered)} tokens" in result.stderr
        result = barellm("chat", model, "--reasoning-effort", effort, "-n", "1",
                         input_text="Hi\n")
        assert result.returncode == 0, result.stderr
        assert stats(result.stderr)[0][0] == token_count(model, rendered)
    for args, message in (
            (("run", model, "-p", "Hi", "--reasoning-effort", "low"),
             "--reasoning-effort needs --chat (or the chat command)"),
            (("run", model, "-p", "Hi", "--chat", "--reasoning-effort", "max"),
             "--reasoning-effort 'max' is not low, medium or high")):
        result = barellm(*args)
        assert result.returncode != 0 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_chat_holds_what_jinja2_renders_of_the_conversation(model, tmp_path):
    """Each turn shows the answer; the KV cache holds the template's rendering of the
    conversation, the reasoning of the past reply dropped: the second turn prefills the
    answer as the final channel and the next user turn, from the reply's start."""
    saved = tmp_path / "conversation.json"
    result = barellm("chat", model, "--temp", "0", *PENALTY, "-n", "40", "--system",
                     "Be brief.", input_text=f"Hi\nTell me more\n/save {saved}\n")
    assert result.returncode == 0, result.stderr
    turns = stats(result.stderr)
    assert len(turns) == 2
    first = hf_render(GPT_OSS, "Hi", "Be brief.")
    assert turns[0][0] == token_count(model, first)
    assert turns[0][1:3] == (13, "end of text")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": ANSWER_TEXT},
                {"role": "user", "content": "Tell me more"}]
    whole = hf_render_conversation(GPT_OSS, messages)
    assert whole.startswith(first)
    assert turns[0][3] == token_count(model, first)
    assert turns[1][0] == token_count(model, whole) - token_count(model, first)
    assert turns[1][3] == token_count(model, whole)
    # The second reply: the penalty now weighs on both successors alike, so the model thinks
    # until -n and shows nothing.
    assert result.stdout == ANSWER_TEXT + "\n\n"
    assert turns[1][1:3] == (40, "reached -n")
    assert json.loads(saved.read_text()) == messages + [{"role": "assistant", "content": ""}]


def test_the_server_answers_with_the_final_channel(model):
    server = Server(model, "--repeat-penalty", "3", "--temp", "0")
    try:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        client = server.client()
        reply = client.chat.completions.create(model="harmony.bin", messages=messages,
                                               max_tokens=40)
        assert reply.choices[0].message.content == ANSWER_TEXT
        assert reply.choices[0].finish_reason == "stop"
        assert reply.usage.completion_tokens == 13
        assert reply.usage.prompt_tokens == token_count(model, hf_render(GPT_OSS, "Hi",
                                                                         "Be brief."))
        pieces = [chunk.choices[0].delta.content for chunk in client.chat.completions.create(
            model="harmony.bin", messages=messages, max_tokens=40, stream=True)
            if chunk.choices and chunk.choices[0].delta.content]
        assert "".join(pieces) == ANSWER_TEXT
        # A past reply is written as the final channel: the prompt is jinja2's rendering.
        conversation = messages + [{"role": "assistant", "content": "Lyon"},
                                   {"role": "user", "content": "Sure?"}]
        reply = client.chat.completions.create(model="harmony.bin", messages=conversation,
                                               max_tokens=5)
        assert reply.usage.prompt_tokens == token_count(
            model, hf_render_conversation(GPT_OSS, conversation))
        # OpenAI's reasoning_effort: the system message's level, as jinja2 writes it.
        reply = client.chat.completions.create(model="harmony.bin", messages=messages,
                                               max_tokens=1, reasoning_effort="high")
        assert reply.usage.prompt_tokens == token_count(
            model, hf_render(GPT_OSS, "Hi", "Be brief.", reasoning_effort="high"))
        status, body = server.request("POST", "/v1/chat/completions", json.dumps(
            {"messages": messages, "reasoning_effort": "max"}))
        assert status == 400 and body["error"]["param"] == "reasoning_effort", body
        assert "'max' is not low, medium or high" in body["error"]["message"]
        status, body = server.request("POST", "/v1/chat/completions", json.dumps(
            {"messages": messages, "reasoning_effort": 3}))
        assert status == 400 and body["error"]["param"] == "reasoning_effort", body
        # The template refuses a past reply holding channel markers; so does the server.
        bad = messages + [{"role": "assistant", "content": "<|channel|>final<|message|>x"},
                          {"role": "user", "content": "Sure?"}]
        status, body = server.request("POST", "/v1/chat/completions",
                                      json.dumps({"messages": bad}))
        assert status == 400, body
        assert "refuses an assistant message holding" in body["error"]["message"]
    finally:
        server.stop()


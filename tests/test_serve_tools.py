"""Function calling in `barellm serve`, end to end through the unmodified `openai` client: models
whose greedy reply is a chosen text (tests/scripted_model.py) write a call as Qwen2.5 and
Llama 3.1 do, and the client gets it in message.tool_calls, at once and streamed, with the
text before it as content; the next request, with the call and its result, is rendered as
jinja2 renders it; without tools (or with tool_choice "none") the same reply is plain text; a
template that does not write tools refuses them with a 400; tool_choice "required" and a named
function make the reply a call."""

import json
import os

import pytest

openai = pytest.importorskip("openai")

from convert_testlib import CONVERT, need_shared, SMOLLM2_TOKENIZER, run
from scripted_model import write_scripted_checkpoint
from test_chat import TEMPLATES
from test_chat_tools import WEATHER, TOOLS, hf_render_tools
from test_serve import Server, barellm

QWEN = TEMPLATES["qwen2.5-instruct"]
LLAMA = TEMPLATES["llama3.1-instruct"]
QUESTION = {"role": "user", "content": "What's the weather in Paris?"}
ARGUMENTS = {"city": "Paris"}
# Qwen writes some text, then the call; Llama only the call.
# The pieces end where tool_choice's starts of a call end, so that a reply made to begin with
# one goes on as scripted.
QWEN_REPLY = ["Let me check.\n", "<tool_call>\n", '{"name": "get_weather", "arguments": ',
              '{"city": "Paris"}}', "\n</tool_call>"]
LLAMA_REPLY = ['{"name": "get_weather", "parameters": ', '{"city": "Paris"}}']
LLAMA_SPECIAL = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def scripted_model(tmp_path_factory, name, template, reply, **tokens):
    need_shared(SMOLLM2_TOKENIZER)
    hf = write_scripted_checkpoint(str(tmp_path_factory.mktemp("hf") / name),
                                   template["chat_template"], **tokens, reply_chunks=reply)
    path = str(tmp_path_factory.mktemp("model") / f"{name}.bin")
    result = run(CONVERT, hf, "-o", path, "--dtype", "f32")
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory):
    model = scripted_model(tmp_path_factory, "qwen", QWEN, QWEN_REPLY,
                           generation_prompt_end="<|im_start|>assistant\n",
                           end_token="<|im_end|>")
    server = Server(model, "--ctx", 2048, "--temp", 0)
    yield server, model
    assert server.stop() == 0, "".join(server.lines)


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    model = scripted_model(tmp_path_factory, "llama", LLAMA, LLAMA_REPLY,
                           generation_prompt_end="<|start_header_id|>assistant<|end_header_id|>"
                           "\n\n", end_token="<|eot_id|>", special_tokens=LLAMA_SPECIAL,
                           bos_token="<|begin_of_text|>")
    server = Server(model, "--ctx", 2048, "--temp", 0)
    yield server, model
    assert server.stop() == 0, "".join(server.lines)


def streamed(client, **request):
    """The content, the calls (merged from their deltas by index) and the finish reason."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **request):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            merged = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
            merged["id"] += call.id or ""
            merged["name"] += call.function.name or ""
            merged["arguments"] += call.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("which", ["qwen", "llama"])
def test_a_call_comes_back_in_tool_calls(request, which):
    server, _ = request.getfixturevalue(f"{which}_server")
    client = server.client()
    response = client.chat.completions.create(model=server.model_id, messages=[QUESTION],
                                              tools=TOOLS)
    message = response.choices[0].message
    assert response.choices[0].finish_reason == "tool_calls"
    assert message.content == ("Let me check.\n" if which == "qwen" else None)
    assert len(message.tool_calls) == 1
    call = message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == ARGUMENTS

    content, calls, finish = streamed(client, model=server.model_id, messages=[QUESTION],
                                      tools=TOOLS)
    assert (content, finish) == (message.content or "", "tool_calls")
    assert [c["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["arguments"]) == ARGUMENTS
    assert calls[0]["id"].startswith("call_")


@pytest.mark.parametrize("which, choice", [
    ("qwen", "required"), ("qwen", {"type": "function", "function": {"name": "get_weather"}}),
    ("llama", {"type": "function", "function": {"name": "get_weather"}})])
def test_a_forced_call_is_the_whole_reply(request, which, choice):
    """The reply starts with the start of a call (Qwen's text before it is skipped)."""
    server, _ = request.getfixturevalue(f"{which}_server")
    for stream in (False, True):
        fields = {"model": server.model_id, "messages": [QUESTION], "tools": TOOLS,
                  "tool_choice": choice}
        if stream:
            content, calls, finish = streamed(server.client(), **fields)
        else:
            response = server.client().chat.completions.create(**fields)
            message = response.choices[0].message
            content, finish = message.content, response.choices[0].finish_reason
            calls = [{"name": c.function.name, "arguments": c.function.arguments}
                     for c in message.tool_calls]
        assert finish == "tool_calls" and content in (None, "")
        assert [c["name"] for c in calls] == ["get_weather"]
        assert json.loads(calls[0]["arguments"]) == ARGUMENTS


@pytest.mark.parametrize("which", ["qwen", "llama"])
@pytest.mark.parametrize("fields", [{}, {"tools": TOOLS, "tool_choice": "none"}])
def test_without_tools_the_reply_is_text(request, which, fields):
    server, _ = request.getfixturevalue(f"{which}_server")
    response = server.client().chat.completions.create(model=server.model_id,
                                                       messages=[QUESTION], **fields)
    message = response.choices[0].message
    assert message.content == "".join(QWEN_REPLY if which == "qwen" else LLAMA_REPLY)
    assert not message.tool_calls
    assert response.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("which, template", [("qwen", QWEN), ("llama", LLAMA)])
def test_the_call_and_its_result_are_rendered_as_jinja2_renders_them(request, which, template):
    server, model = request.getfixturevalue(f"{which}_server")
    client = server.client()
    reply = client.chat.completions.create(model=server.model_id, messages=[QUESTION],
                                           tools=TOOLS).choices[0].message
    messages = [QUESTION, reply.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": reply.tool_calls[0].id,
                 "content": '{"temperature": 21.5}'}]
    response = client.chat.completions.create(model=server.model_id, messages=messages,
                                              tools=TOOLS)
    text = hf_render_tools(template, messages, TOOLS)
    result = barellm("tokenize", model, "-p", text)
    assert result.returncode == 0, result.stderr
    assert response.usage.prompt_tokens == len(json.loads(result.stdout))


def test_a_template_without_tools_refuses_them(tmp_path_factory):
    model = scripted_model(tmp_path_factory, "chatml", TEMPLATES["chatml-plain"], ["Hi."],
                           generation_prompt_end="<|im_start|>assistant\n",
                           end_token="<|im_end|>")
    server = Server(model, "--ctx", 2048)
    try:
        client = server.client()
        with pytest.raises(openai.BadRequestError, match="does not write tools"):
            client.chat.completions.create(model=server.model_id, messages=[QUESTION],
                                           tools=[WEATHER])
        assert client.chat.completions.create(
            model=server.model_id, messages=[QUESTION], max_tokens=4,
            temperature=0).choices[0].message.content == "Hi."
        server.assert_healthy()
    finally:
        assert server.stop() == 0, "".join(server.lines)

"""Tool calling in `barellm serve`'s chat route: the prompt rendered for a request with tools,
calls and results (src/tokenizer/chat_tools.cpp, through build/chat_render --request) equals
what jinja2 renders from the real Qwen2.5, Qwen3, Llama 3.1 and Llama 3.2 templates as
transformers' apply_chat_template(messages, tools=tools) does, the calls' arguments passed as
the objects their JSON text holds (as OpenAI-compatible servers pass them); templates that do
not write tools refuse them."""

import copy
import datetime
import json
import os
import subprocess

import pytest

from test_chat import TEMPLATES, CHAT_RENDER

jinja2 = pytest.importorskip("jinja2")
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

TOOL_TEMPLATES = ["qwen2.5-instruct", "qwen3", "llama3.1-instruct", "llama3.2-instruct"]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city, caf\u00e9 \u65e5\u672c \U0001f600 \"quoted\"\t\\",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "e.g. Paris\nor Z\u00fcrich\u0001"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14, "default": 3},
                "threshold": {"type": "number", "examples": [0.5, 1e-05, 1e+20, 100.0, -2.5]},
                "empty": {"type": "object", "properties": {}},
                "list": {"type": "array", "items": {}, "prefixItems": []},
                "flag": {"type": "boolean", "default": False, "nullable": None},
            },
            "required": ["city"],
        },
    },
}
# Keys in an order json.dumps(sort_keys=True) would change.
ADD = {"function": {"parameters": {"type": "object", "properties": {
    "b": {"type": "number"}, "a": {"type": "number"}}}, "name": "add"}, "type": "function"}
TOOLS = [WEATHER, ADD]


def call(name, arguments, call_id="call_1"):
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


QUESTION = {"role": "user", "content": "What's the weather in Paris?"}
SYSTEM = {"role": "system", "content": "  You are helpful.\n"}
ONE_CALL = {"role": "assistant", "content": None,
            "tool_calls": [call("get_weather", '{"city": "Paris", "days": 2}')]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21.5}'}
TWO_CALLS = {"role": "assistant", "content": "Let me check both.",
             "tool_calls": [call("get_weather", '{"city":"Paris","unit":"celsius"}'),
                            call("add", '{"b": 2, "a": 1.5}', "call_2")]}
NOT_JSON = {"role": "assistant", "content": "",
            "tool_calls": [call("add", "not JSON {")]}

# (name, messages, tools): every template renders these as jinja2 does.
CONVERSATIONS = [
    ("question", [QUESTION], TOOLS),
    ("with a system message", [SYSTEM, QUESTION], TOOLS),
    ("a call and its result", [SYSTEM, QUESTION, ONE_CALL, RESULT], TOOLS),
    ("the answer after a result, a new question",
     [QUESTION, ONE_CALL, RESULT, {"role": "assistant", "content": " Sunny, 21.5 C. "},
      {"role": "user", "content": "And tomorrow?"}], TOOLS),
    ("arguments that are not JSON", [QUESTION, NOT_JSON, RESULT], TOOLS),
    ("results without tools", [QUESTION, ONE_CALL, RESULT], None),
    ("no tools", [SYSTEM, QUESTION, {"role": "assistant", "content": "Hi"},
                  {"role": "user", "content": "\u65e5\u672c"}], None),
    ("a second user message in a row", [QUESTION, {"role": "user", "content": "Well?"}], TOOLS),
]
# Two calls in one message, two results in a row: Llama 3.1's templates refuse them.
HERMES_CONVERSATIONS = [
    ("two calls, two results", [QUESTION, TWO_CALLS, RESULT,
                                {"role": "tool", "content": "3.5"}], TOOLS),
    ("think blocks before and after the last question",
     [QUESTION, {"role": "assistant", "content": "<think>\nfirst\n</think>\n\nCloudy."},
      {"role": "user", "content": "Paris?"},
      {"role": "assistant", "content": "<think>\n\nplan\n\n</think>\n\n",
       "tool_calls": ONE_CALL["tool_calls"]}, RESULT], TOOLS),
    ("results wrapped as a user message",
     [QUESTION, {"role": "user", "content": "<tool_response>\nx\n</tool_response>"}], TOOLS),
]


def hf_messages(messages):
    """The messages as the template sees them: a call's arguments parsed from their JSON text
    where they hold JSON, a missing content empty."""
    out = copy.deepcopy(messages)
    for message in out:
        if message.get("content") is None:
            message["content"] = ""
        for tool_call in message.get("tool_calls", []):
            try:
                tool_call["function"]["arguments"] = json.loads(
                    tool_call["function"]["arguments"])
            except json.JSONDecodeError:
                pass
    return out


def hf_render_tools(entry, messages, tools):
    """apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    as transformers does it: its sandboxed environment, raise_exception, strftime_now and its
    tojson (json.dumps with ensure_ascii=False and the keys in their order)."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda format: datetime.datetime.now().strftime(format)
    return env.from_string(entry["chat_template"]).render(
        messages=hf_messages(messages), tools=tools, add_generation_prompt=True,
        bos_token=entry["bos_token"], eos_token=entry["eos_token"])


def render_request(tmp_path, entry, body):
    """(returncode, stdout text, stderr text) of chat_render --request on the request body."""
    if not os.path.exists(CHAT_RENDER):
        pytest.fail(f"{CHAT_RENDER} is missing: run `make` first")
    (tmp_path / "template").write_bytes(entry["chat_template"].encode("utf-8"))
    (tmp_path / "request").write_text(json.dumps(body), encoding="utf-8")
    result = subprocess.run([CHAT_RENDER, "--request", tmp_path / "template",
                             tmp_path / "request", entry["bos_token"], entry["eos_token"]],
                            capture_output=True, timeout=60)
    return result.returncode, result.stdout.decode("utf-8"), result.stderr.decode("utf-8")


def request_body(messages, tools, **fields):
    body = {"messages": messages, **fields}
    if tools is not None:
        body["tools"] = tools
    return body


@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=[c[0] for c in CONVERSATIONS])
@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_tool_conversations_render_as_jinja_renders_them(tmp_path, name, conversation):
    _, messages, tools = conversation
    code, text, err = render_request(tmp_path, TEMPLATES[name], request_body(messages, tools))
    assert code == 0, err
    assert text == hf_render_tools(TEMPLATES[name], messages, tools)
    assert ("calls: yes" in err) == (tools is not None)


@pytest.mark.parametrize("conversation", HERMES_CONVERSATIONS,
                         ids=[c[0] for c in HERMES_CONVERSATIONS])
@pytest.mark.parametrize("name", ["qwen2.5-instruct", "qwen3"])
def test_hermes_conversations_render_as_jinja_renders_them(tmp_path, name, conversation):
    _, messages, tools = conversation
    code, text, err = render_request(tmp_path, TEMPLATES[name], request_body(messages, tools))
    assert code == 0, err
    assert text == hf_render_tools(TEMPLATES[name], messages, tools)


def test_the_qwen3_think_blocks_spelled_out(tmp_path):
    """Dropped before the last question, written back after it, as Qwen3's template does."""
    messages = HERMES_CONVERSATIONS[1][1]
    _, text, _ = render_request(tmp_path, TEMPLATES["qwen3"], request_body(messages, None))
    assert "<|im_start|>assistant\nCloudy.<|im_end|>" in text
    assert ("<|im_start|>assistant\n<think>\nplan\n</think>\n\n<tool_call>\n"
            '{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
            "<|im_end|>") in text


@pytest.mark.parametrize("name", ["llama3.1-instruct", "llama3.2-instruct"])
def test_llama31_refuses_two_calls_in_one_message_as_its_template_does(tmp_path, name):
    messages = HERMES_CONVERSATIONS[0][1]
    with pytest.raises(jinja2.exceptions.TemplateError, match="single tool-calls"):
        hf_render_tools(TEMPLATES[name], messages, TOOLS)
    code, _, err = render_request(tmp_path, TEMPLATES[name], request_body(messages, TOOLS))
    assert code == 1 and "one call per assistant message" in err, err


@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_tool_choice_none_renders_without_the_tools(tmp_path, name):
    messages = [SYSTEM, QUESTION]
    code, text, err = render_request(tmp_path, TEMPLATES[name],
                                     request_body(messages, TOOLS, tool_choice="none"))
    assert code == 0 and "calls: no" in err, err
    assert text == hf_render_tools(TEMPLATES[name], messages, None)


# What a reply is made to start with for tool_choice "required" and a named function.
FORCED_STARTS = {
    "qwen2.5-instruct": ("<tool_call>\n", '<tool_call>\n{"name": "add", "arguments": '),
    "qwen3": ("<tool_call>\n", '<tool_call>\n{"name": "add", "arguments": '),
    "llama3.1-instruct": ('{"name": "', '{"name": "add", "parameters": '),
    "llama3.2-instruct": ('{"name": "', '{"name": "add", "parameters": '),
}


@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_a_forced_call_starts_the_reply_with_the_start_of_one(tmp_path, name):
    """tool_choice "required" and a named function: jinja2's rendering with the tools, then the
    start of a call in the template's format."""
    messages = [SYSTEM, QUESTION]
    required, named = FORCED_STARTS[name]
    for choice, start in [("required", required),
                          ({"type": "function", "function": {"name": "add"}}, named)]:
        code, text, err = render_request(tmp_path, TEMPLATES[name],
                                         request_body(messages, TOOLS, tool_choice=choice))
        assert code == 0 and "calls: yes" in err, err
        assert text == hf_render_tools(TEMPLATES[name], messages, TOOLS) + start


@pytest.mark.parametrize("name", sorted(set(TEMPLATES) - set(TOOL_TEMPLATES)))
def test_templates_that_do_not_write_tools_refuse_them(tmp_path, name):
    """Among them Phi-4-mini's and gpt-oss's, whose tool formats barellm does not write."""
    for body in [request_body([QUESTION], TOOLS), request_body([QUESTION, ONE_CALL, RESULT], None)]:
        code, _, err = render_request(tmp_path, TEMPLATES[name], body)
        assert code == 1 and "does not write tools" in err, err
    # tool_choice "none" leaves the tools out: the conversation renders as it would without.
    code, _, err = render_request(tmp_path, TEMPLATES[name],
                                  request_body([QUESTION], TOOLS, tool_choice="none"))
    assert code == 0, err


@pytest.mark.parametrize("body, param", [
    ({"messages": [QUESTION], "tools": {"type": "function"}}, "tools"),
    ({"messages": [QUESTION], "tools": [{"type": "function"}]}, "tools[0]"),
    ({"messages": [QUESTION], "tools": [{"type": "code", "function": {"name": "f"}}]}, "tools[0]"),
    ({"messages": [QUESTION], "tools": [{"type": "function", "function": {"name": ""}}]},
     "tools[0].function.name"),
    ({"messages": [QUESTION], "tools": [{"type": "function", "function": {
        "name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
    ({"messages": [QUESTION], "tool_choice": "required"}, "tool_choice"),
    ({"messages": [QUESTION], "tools": TOOLS, "tool_choice": "any"}, "tool_choice"),
    ({"messages": [QUESTION], "tools": TOOLS, "tool_choice": {"type": "function"}},
     "tool_choice"),
    ({"messages": [QUESTION], "tools": TOOLS,
      "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"messages": [QUESTION, {"role": "assistant", "tool_calls": [{"function": {}}]}]},
     "messages[1].tool_calls[0].function.name"),
    ({"messages": [QUESTION, {"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": 3}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": [QUESTION, {"role": "user", "tool_calls": []}]}, "messages[1].tool_calls"),
    ({"messages": [QUESTION, {"role": "tool"}]}, "messages[1].content"),
    ({"messages": [QUESTION, {"role": "assistant"}]}, "messages[1].content"),
    ({"messages": [QUESTION, {"role": "function", "content": "x"}]}, "messages[1].role"),
])
def test_malformed_tool_fields_are_refused_naming_them(tmp_path, body, param):
    code, _, err = render_request(tmp_path, TEMPLATES["qwen2.5-instruct"], body)
    assert code == 1 and f"'{param}'" in err, err


@pytest.mark.parametrize("name", TOOL_TEMPLATES)
def test_a_conversation_ending_with_the_assistant_is_refused(tmp_path, name):
    code, _, err = render_request(tmp_path, TEMPLATES[name],
                                  request_body([QUESTION, ONE_CALL], TOOLS))
    assert code == 1 and "must end with a user message or a tool's result" in err, err

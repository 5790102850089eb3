"""`barellm serve` through the unmodified `openai` client and through raw sockets: completions
and chat, streamed and not, stop strings, max_tokens, seeds, usage and finish_reason, against
`barellm run` on the same f32 model (greedy and seeded, alone and eight at once) and jinja2's
rendering of the conversations; and hostile clients: malformed JSON, wrong types, a 10 MB body,
a prompt beyond the context, 500 connections at once, a client that never reads its stream or
leaves in the middle of it, wrong or missing API keys. The server answers /health after each."""

import concurrent.futures
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time

import pytest

openai = pytest.importorskip("openai")

from convert_testlib import (BUILD, CONVERT, SYNTH, STORIES, assert_wrong_command_line,
                             need_shared, run)
from test_chat import TEMPLATES, hf_render_conversation
from test_chat_command import with_template

BARELLM = os.path.join(BUILD, "barellm")
LLAMA2_CHAT = TEMPLATES["llama2-chat"]
CONTEXT = 192
PROMPTS = ["Once upon a time", "Lily and Ben went to the park", "The cat", "One day, a little",
           "Tom had a red ball", "The sun was", "She said", "There was a big dog"]
LISTENING = re.compile(r"serving \S+ on (http://[0-9.]+:\d+)/v1")


def barellm(*args):
    if not os.path.exists(BARELLM):
        pytest.fail(f"{BARELLM} is missing: run `make` first")
    return subprocess.run([BARELLM, *map(str, args)], capture_output=True, text=True,
                          timeout=120)


class Server:
    """build/barellm serve on a free port, its stderr collected line by line (`program` and
    `device`: another barellm, and the device it serves on)."""

    def __init__(self, model, *args, program=BARELLM, device="cpu"):
        if not os.path.exists(program):
            pytest.fail(f"{program} is missing: run `make` first")
        self.model_id = os.path.basename(model)
        self.process = subprocess.Popen(
            [program, "serve", model, "--port", "0", "--device", device, "--threads", "1",
             *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.url = None
        ready = threading.Event()

        def read():
            for line in self.process.stderr:
                self.lines.append(line)
                match = LISTENING.search(line)
                if match:
                    self.url = match[1]
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        ready.wait(120)
        assert self.url, "".join(self.lines)
        self.host, self.port = self.url[len("http://"):].split(":")
        self.port = int(self.port)

    def client(self, api_key="none"):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0,
                             timeout=120)

    def request(self, method, path, body=None, headers=None):
        """(status, parsed JSON or text) of one request on a fresh connection."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            data = response.read().decode()
        finally:
            connection.close()
        try:
            return response.status, json.loads(data)
        except json.JSONDecodeError:
            return response.status, data

    def metrics(self):
        status, text = self.request("GET", "/metrics")
        assert status == 200
        return {m[1]: int(m[2]) for m in re.finditer(r"^barellm_(\w+) (\d+)$", text, re.M)}

    def assert_healthy(self):
        assert self.process.poll() is None, "".join(self.lines)
        assert self.request("GET", "/health") == (200, {"status": "ok"})

    def wait_idle(self, seconds=30):
        deadline = time.time() + seconds
        while time.time() < deadline:
            metrics = self.metrics()
            if metrics["running_sequences"] == 0 and metrics["queue_length"] == 0:
                return metrics
            time.sleep(0.1)
        pytest.fail(f"the server is still busy: {self.metrics()}")

    def stop(self):
        """SIGTERM; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            status = self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        self.reader.join(10)
        return status


def make_chat_model(tmp_path_factory, config_update=None):
    """stories260K's tokenizer and Llama-2-chat's template; its own weights (f32), or random
    ones of a larger shape given by `config_update`."""
    hf = tmp_path_factory.mktemp("hf") / "stories-chat"
    shutil.copytree(need_shared(STORIES), hf)
    with_template(hf, LLAMA2_CHAT["chat_template"])
    if config_update:
        with open(os.path.join(hf, "config.json")) as f:
            config = json.load(f)
        config.update(config_update)
        config_path = tmp_path_factory.mktemp("config") / "config.json"
        config_path.write_text(json.dumps(config))
        synth = tmp_path_factory.mktemp("synth") / "hf"
        result = run(SYNTH, "--config", config_path, "--tokenizer", hf, "-o", synth)
        assert result.returncode == 0, result.stderr
        shutil.copy(os.path.join(hf, "tokenizer_config.json"), synth)
        hf = synth
    path = str(tmp_path_factory.mktemp("model") / "stories-chat.bin")
    result = run(CONVERT, hf, "-o", path, "--dtype", "f32")
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_chat_model(tmp_path_factory)


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory):
    """Random weights wide and deep enough that a long reply lasts seconds, 4096 positions."""
    return make_chat_model(tmp_path_factory, {
        "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
        "max_position_embeddings": 4096})


@pytest.fixture(scope="module")
def server(model):
    server = Server(model, "--ctx", CONTEXT, "--parallel", 4)
    yield server
    assert server.stop() == 0, "".join(server.lines)


def run_greedy(model, prompt, tokens):
    """The text `barellm run --temp 0` generates after `prompt`."""
    result = barellm("run", model, "-p", prompt, "-n", tokens, "--temp", "0", "--ctx", CONTEXT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(prompt) and result.stdout.endswith("\n")
    return result.stdout[len(prompt):-1]


def prompt_ids(model, text):
    result = barellm("tokenize", model, "-p", text, "--bos")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_health_models_and_the_log(server):
    server.assert_healthy()
    models = server.client().models.list()
    assert [m.id for m in models.data] == [server.model_id]
    time.sleep(0.2)
    assert any(re.search(r"barellm: GET /v1/models 200 \d+ ms", line) for line in server.lines)


def test_greedy_completion_equals_run(server, model):
    response = server.client().completions.create(model=server.model_id, prompt=PROMPTS[0],
                                                  max_tokens=40, temperature=0)
    choice = response.choices[0]
    assert choice.text == run_greedy(model, PROMPTS[0], 40)
    assert response.usage.prompt_tokens == len(prompt_ids(model, PROMPTS[0]))
    assert response.usage.total_tokens == response.usage.prompt_tokens + 40 or \
        choice.finish_reason == "stop"
    if choice.finish_reason == "length":
        assert response.usage.completion_tokens == 40
    assert response.object == "text_completion" and response.model == server.model_id
    # The same prompt as token ids gives the same text.
    by_ids = server.client().completions.create(
        model=server.model_id, prompt=prompt_ids(model, PROMPTS[0]), max_tokens=40,
        temperature=0)
    assert by_ids.choices[0].text == choice.text
    time.sleep(0.2)
    assert any(re.search(r"POST /v1/completions 200 prompt \d+ generated \d+ tokens \d+ ms",
                         line) for line in server.lines), "".join(server.lines)


def test_max_tokens_and_finish_reason(server):
    response = server.client().completions.create(model=server.model_id, prompt=PROMPTS[1],
                                                  max_tokens=5, temperature=0)
    assert response.choices[0].finish_reason == "length"
    assert response.usage.completion_tokens == 5
    # Without max_tokens the reply may run until the context is full: as in `run`, the last
    # token is drawn from the logits of the last position.
    response = server.client().completions.create(model=server.model_id, prompt=PROMPTS[1],
                                                  temperature=0)
    usage = response.usage
    if response.choices[0].finish_reason == "length":
        assert usage.prompt_tokens + usage.completion_tokens == CONTEXT + 1


def test_streaming_equals_the_whole_reply(server):
    client = server.client()
    whole = client.completions.create(model=server.model_id, prompt=PROMPTS[2], max_tokens=30,
                                      temperature=0)
    chunks = list(client.completions.create(model=server.model_id, prompt=PROMPTS[2],
                                            max_tokens=30, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == whole.choices[0].text
    assert len([t for t in texts if t]) > 5  # token by token, not all at once
    finished = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finished[-1] == whole.choices[0].finish_reason
    assert all(reason is None for reason in finished[:-1])
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stop_strings(server):
    client = server.client()
    whole = client.completions.create(model=server.model_id, prompt=PROMPTS[0], max_tokens=40,
                                      temperature=0).choices[0].text
    words = whole.split()
    assert len(words) > 4, whole
    stop = " " + words[3]
    expected = whole[:whole.index(stop)]
    for stream in (False, True):
        response = client.completions.create(model=server.model_id, prompt=PROMPTS[0],
                                             max_tokens=40, temperature=0, stop=[stop, "zzzz"],
                                             stream=stream)
        if stream:
            chunks = list(response)
            text = "".join(c.choices[0].text for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            text, reason = response.choices[0].text, response.choices[0].finish_reason
        assert text == expected
        assert reason == "stop"


def test_seeds_repeat_and_match_run(server, model):
    client = server.client()

    def sample(seed):
        return client.completions.create(model=server.model_id, prompt=PROMPTS[3],
                                         max_tokens=30, temperature=1.0, seed=seed
                                         ).choices[0].text

    first, again, other = sample(7), sample(7), sample(8)
    assert first == again
    assert first != other
    result = barellm("run", model, "-p", PROMPTS[3], "-n", 30, "--temp", "1", "--seed", 7,
                     "--ctx", CONTEXT)
    assert result.returncode == 0, result.stderr
    assert result.stdout == PROMPTS[3] + first + "\n"


def test_chat_completion_equals_run_chat(server, model):
    client = server.client()
    system, user = "You tell stories.", "Tell me about a cat."
    response = client.chat.completions.create(
        model=server.model_id, max_tokens=30, temperature=0,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}])
    result = barellm("run", model, "--chat", "--system", system, "-p", user, "-n", 30,
                     "--temp", "0", "--ctx", CONTEXT)
    assert result.returncode == 0, result.stderr
    message = response.choices[0].message
    assert message.role == "assistant"
    assert message.content + "\n" == result.stdout
    assert response.object == "chat.completion"
    # Streamed: the role first, then the same text.
    chunks = list(client.chat.completions.create(
        model=server.model_id, max_tokens=30, temperature=0, stream=True,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}]))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == message.content
    assert chunks[-1].choices[0].finish_reason == response.choices[0].finish_reason


def test_a_conversation_is_rendered_as_jinja2_renders_it(server, model):
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello, Lily."},
                {"role": "user", "content": "Tell me more."}]
    response = server.client().chat.completions.create(model=server.model_id, max_tokens=3,
                                                       temperature=0, messages=messages)
    text = hf_render_conversation(LLAMA2_CHAT, messages)
    result = barellm("tokenize", model, "-p", text)  # the rendering starts with <s> already
    assert result.returncode == 0, result.stderr
    assert response.usage.prompt_tokens == len(json.loads(result.stdout))


def test_concurrent_greedy_requests_equal_each_alone_and_run(server, model):
    client = server.client()

    def complete(prompt):
        return client.completions.create(model=server.model_id, prompt=prompt, max_tokens=24,
                                         temperature=0).choices[0].text

    alone = [complete(p) for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(complete, PROMPTS))
    assert together == alone
    assert alone == [run_greedy(model, p, 24) for p in PROMPTS]
    metrics = server.wait_idle()
    assert metrics["requests_total"] >= 2 * len(PROMPTS)


def post_json(server, path, body, headers=None):
    return server.request("POST", path, body=body,
                          headers={"Content-Type": "application/json", **(headers or {})})


def assert_error(response, status, param=None, words=""):
    got_status, body = response
    assert got_status == status, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words in error["message"], error
    if param is not None:
        assert error["param"] == param
    return error


def test_malformed_requests_get_400(server):
    assert_error(post_json(server, "/v1/completions", b'{"prompt": "x"'), 400,
                 words="not valid JSON")
    assert_error(post_json(server, "/v1/completions", b"\xff\xfe"), 400)
    assert_error(post_json(server, "/v1/completions", b"[1, 2]"), 400)
    assert_error(post_json(server, "/v1/completions", b"{}"), 400, "prompt")
    for body, param in [({"prompt": 5}, "prompt"), ({"prompt": "x", "max_tokens": "9"},
                                                     "max_tokens"),
                        ({"prompt": "x", "temperature": -1}, "temperature"),
                        ({"prompt": "x", "n": 2}, "n"),
                        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
                        ({"prompt": [1, 999999]}, "prompt"),
                        ({"messages": "hi"}, "messages")]:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        assert_error(post_json(server, path, json.dumps(body)), 400, param)
    with pytest.raises(openai.BadRequestError):
        server.client().completions.create(model=server.model_id, prompt="x", n=2)
    with pytest.raises(openai.BadRequestError):  # a conversation the template cannot render
        server.client().chat.completions.create(
            model=server.model_id, messages=[{"role": "assistant", "content": "x"}])
    with pytest.raises(openai.NotFoundError):
        server.client().completions.create(model="gpt-4", prompt="x")
    assert_error(server.request("GET", "/v1/nothing"), 404)
    assert_error(server.request("GET", "/../../etc/passwd"), 404)
    server.assert_healthy()


def test_prompts_beyond_the_context_get_400_with_a_message(server):
    error = assert_error(post_json(server, "/v1/completions",
                                   json.dumps({"prompt": "Once upon a time " * 100})),
                         400, "prompt", "context")
    assert error["code"] == "context_length_exceeded"
    assert_error(post_json(server, "/v1/completions",
                           json.dumps({"prompt": "Hi", "max_tokens": CONTEXT})),
                 400, "max_tokens", "context")
    with pytest.raises(openai.BadRequestError, match="context"):
        server.client().chat.completions.create(
            model=server.model_id, messages=[{"role": "user", "content": "a cat " * 200}])
    server.assert_healthy()


def test_a_10_mb_body_gets_413(server):
    body = b'{"prompt": "' + b"a" * (10 << 20) + b'"}'
    assert_error(post_json(server, "/v1/completions", body), 413, words="larger than")
    server.assert_healthy()


def test_500_connections_at_once(server):
    def health(_):
        with socket.create_connection((server.host, server.port), timeout=120) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(4096):
                data += chunk
        return data.split(b" ", 2)[1]

    with concurrent.futures.ThreadPoolExecutor(500) as pool:
        statuses = list(pool.map(health, range(500)))
    assert statuses == [b"200"] * 500
    server.assert_healthy()


def open_stream(server, body):
    """A socket that has sent a streaming completion request and read nothing."""
    s = socket.create_connection((server.host, server.port), timeout=120)
    data = json.dumps({**body, "stream": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def test_a_client_that_never_reads_its_stream(server):
    s = open_stream(server, {"prompt": PROMPTS[0], "max_tokens": 150, "temperature": 0})
    try:
        # Others are served meanwhile.
        response = server.client().completions.create(model=server.model_id, prompt=PROMPTS[1],
                                                      max_tokens=10, temperature=0)
        assert response.usage.completion_tokens == 10
        server.assert_healthy()
    finally:
        s.close()
    server.wait_idle()
    server.assert_healthy()


def test_a_client_that_leaves_cancels_its_request(slow_model):
    server = Server(slow_model, "--ctx", 4096, "--parallel", 2)
    try:
        before = server.metrics()["generated_tokens_total"]
        s = open_stream(server, {"prompt": PROMPTS[0], "max_tokens": 4000, "temperature": 0})
        data = b""
        while data.count(b"data: ") < 3:
            data += s.recv(4096)
        s.close()
        metrics = server.wait_idle(60)
        assert metrics["generated_tokens_total"] - before < 2000, metrics
        assert metrics["kv_tokens_held"] == 0
        server.assert_healthy()
    finally:
        assert server.stop() == 0, "".join(server.lines)


def test_sigterm_stops_a_server_with_a_stream_open(slow_model):
    server = Server(slow_model, "--ctx", 4096, "--parallel", 2)
    s = open_stream(server, {"prompt": PROMPTS[0], "max_tokens": 4000, "temperature": 0})
    try:
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
        assert server.stop() == 0, "".join(server.lines)
        assert "barellm: stopped\n" in server.lines
    finally:
        s.close()


def test_api_key(model):
    server = Server(model, "--ctx", CONTEXT, "--api-key", "s3cret")
    try:
        for key in ("wrong", "s3cre", "s3cret-and-more"):
            with pytest.raises(openai.AuthenticationError):
                server.client(key).models.list()
        error = assert_error(server.request("POST", "/v1/completions", body="{}"), 401,
                             words="API key")
        assert error["code"] == "invalid_api_key"
        assert_error(server.request("GET", "/metrics"), 401)
        assert server.client("s3cret").completions.create(
            model=server.model_id, prompt="Hi", max_tokens=2).usage.completion_tokens == 2
        server.assert_healthy()  # /health needs no key
    finally:
        assert server.stop() == 0, "".join(server.lines)


def test_metrics(server):
    server.client().completions.create(model=server.model_id, prompt="Hi", max_tokens=3)
    metrics = server.wait_idle()
    for name in ("requests_total", "prompt_tokens_total", "generated_tokens_total",
                 "preemptions_total", "queue_length", "running_sequences", "batch_rows",
                 "kv_blocks_used", "kv_blocks_free", "kv_block_size", "kv_tokens_held",
                 "http_requests_total"):
        assert name in metrics
    assert metrics["generated_tokens_total"] >= 3
    assert metrics["kv_block_size"] == 16
    assert metrics["kv_blocks_used"] + metrics["kv_blocks_free"] >= 4 * CONTEXT // 16
    assert metrics["kv_tokens_held"] == 0


def test_serve_command_line(model):
    assert_wrong_command_line(barellm("serve", model, "--port", "70000"), "barellm",
                              "--port must be in [0, 65535]")
    assert_wrong_command_line(barellm("serve", model, "--parallel", "0"), "barellm",
                              "--parallel must be in")
    for size in ("12Q", "0", "-5M", "1.5G", "M", "2000000G"):
        assert_wrong_command_line(barellm("serve", model, "--kv-memory", size), "barellm",
                                  "--kv-memory needs a size")
    assert_wrong_command_line(barellm("serve", model, "--api-key", ""), "barellm",
                              "--api-key needs")
    assert_wrong_command_line(barellm("run", model, "-p", "x", "--port", "1"), "barellm",
                              "--port is for serve")
    assert_wrong_command_line(barellm("serve", model, "-p", "x"), "barellm",
                              "serve takes its prompts")
    # One sequence of the whole context does not fit: one line, exit 1.
    # (5 layers, 4 KV heads of 8, f16 keys and values: 10240 bytes a block of 16 positions.)
    for size, blocks in (("1K", 0), ("64KiB", 6), ("150kb", 15)):
        result = barellm("serve", model, "--ctx", 256, "--kv-memory", size)
        assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
        assert f"holds {blocks} KV blocks of 16 positions (10240 bytes each); one sequence " \
               "of --ctx 256 needs 16" in result.stderr
    # A port taken: one line, exit 1.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = barellm("serve", model, "--port", taken.getsockname()[1])
    assert result.returncode == 1, result.stderr
    assert result.stderr.splitlines()[-1].startswith("barellm: cannot listen on 127.0.0.1:")


def test_still_healthy_after_everything(server):
    server.assert_healthy()

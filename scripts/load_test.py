#!/usr/bin/env python3
"""Load test of OpenAI-compatible servers: N concurrent streaming clients on the `openai`
package, each with a fixed prompt and output length, against `barellm serve` and, given a
llama-server binary and a GGUF, against `llama-server -np N` on the same weights, in alternating
rounds. Prints one table: aggregate generated tokens/s (the tokens of all clients over the
round's wall time), each stream's decode rate (its tokens after the first over the time from
the first to the last, as `barellm run` counts its generation), time to first token and
inter-token latency, p50 and p99.

    scripts/load_test.py MODEL.bin [--gguf MODEL.gguf --llama-server PATH]
        [--clients 8] [--rounds 3] [--max-tokens 128] [--threads 2] [--ctx 1024]
        [--simd avx2] [--device cuda] [--json]

MODEL.bin is barellm's file of the weights the GGUF holds (convert/convert.py MODEL.gguf).
Each server is started here on a free port with --parallel/-np N and a context of --ctx
positions per sequence (barellm's at --simd's kernel level when given, e.g. against a
llama-server built without AVX-512; with --device cuda, barellm on the GPU and every layer of
llama-server's model offloaded to it), and stopped at the end. Every client asks for --max-tokens tokens
greedily, with a story prompt that keeps going (llama-server also gets ignore_eos); the table
reports how many tokens the clients got, in case one stopped early. A running server can be
measured instead with --url (its model is then whatever it serves).
"""

import argparse
import concurrent.futures
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import openai

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# llama-server's -ngl that offloads every layer of any model to the GPU.
LLAMA_ALL_LAYERS = "999"
PROMPTS = [
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "The robot woke up in the empty laboratory and slowly began to remember how",
    "Every morning the baker opened her shop before sunrise, and on this particular day",
    "Deep in the forest, the two friends found a door in the trunk of an enormous tree that",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url, process, seconds=600):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if process is not None and process.poll() is not None:
            sys.exit(f"load_test: the server exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"load_test: {url} did not become healthy in {seconds} s")


def start_server(command):
    print("load_test: starting " + " ".join(command), file=sys.stderr)
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def one_stream(client, model, prompt, max_tokens, extra):
    """(seconds to the first token, gaps between tokens, tokens) of one streamed completion."""
    start = time.perf_counter()
    arrivals, tokens = [], 0
    stream = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True}, extra_body=extra)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            arrivals.append(time.perf_counter())
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    if not arrivals:
        return None, [], tokens
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    return arrivals[0] - start, gaps, tokens or len(arrivals)


def run_round(url, model, clients, max_tokens, extra):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(
            lambda i: one_stream(client, model, PROMPTS[i % len(PROMPTS)], max_tokens, extra),
            range(clients)))
    seconds = time.perf_counter() - start
    tokens = [r[2] for r in results]
    return {"seconds": seconds, "tokens": tokens,
            "ttft": [r[0] for r in results if r[0] is not None],
            "decode": [len(r[1]) / sum(r[1]) for r in results if r[1] and sum(r[1]) > 0],
            "itl": [gap for r in results for gap in r[1]]}


def percentile(values, p):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def summary(name, rounds):
    tokens = [t for r in rounds for t in r["tokens"]]
    rates = [sum(r["tokens"]) / r["seconds"] for r in rounds]
    ttft = [t for r in rounds for t in r["ttft"]]
    itl = [t for r in rounds for t in r["itl"]]
    decode = [d for r in rounds for d in r["decode"]]
    return {"server": name, "rounds": len(rounds), "clients": len(rounds[0]["tokens"]),
            "tokens_min": min(tokens), "tokens_mean": statistics.mean(tokens),
            "aggregate_tok_s": statistics.median(rates), "aggregate_tok_s_all": rates,
            "stream_decode_tok_s": statistics.median(decode) if decode else float("nan"),
            "ttft_p50_ms": 1000 * percentile(ttft, 50), "ttft_p99_ms": 1000 * percentile(ttft, 99),
            "itl_p50_ms": 1000 * percentile(itl, 50), "itl_p99_ms": 1000 * percentile(itl, 99)}


def markdown(rows):
    lines = ["| server | clients | rounds | tokens/client (min, mean) | aggregate tok/s (median) "
             "| stream decode tok/s (median) | TTFT p50 / p99 ms | ITL p50 / p99 ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['server']} | {r['clients']} | {r['rounds']} | {r['tokens_min']}, "
                     f"{r['tokens_mean']:.1f} | {r['aggregate_tok_s']:.1f} | "
                     f"{r['stream_decode_tok_s']:.1f} | "
                     f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | "
                     f"{r['itl_p50_ms']:.1f} / {r['itl_p99_ms']:.1f} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="barellm weight file (not with --url)")
    parser.add_argument("--barellm", default=os.path.join(REPO, "build", "barellm"))
    parser.add_argument("--url", help="measure this running server instead")
    parser.add_argument("--gguf", help="the same weights as GGUF, for llama-server")
    parser.add_argument("--llama-server", help="llama.cpp's llama-server binary")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--ctx", type=int, default=1024, help="positions per sequence")
    parser.add_argument("--simd", choices=["scalar", "avx2", "avx512"],
                        help="barellm serve's CPU kernel level (default: the best this CPU runs)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where both servers run the model (default cpu)")
    parser.add_argument("--json", action="store_true", help="JSON instead of a markdown table")
    args = parser.parse_args()
    if bool(args.model) == bool(args.url):
        parser.error("give a MODEL to start barellm serve with, or --url (one of them)")
    if args.url and (args.simd or args.device != "cpu"):
        parser.error("--simd and --device are for the servers started here, not with --url")
    if bool(args.gguf) != bool(args.llama_server):
        parser.error("--gguf and --llama-server go together")

    servers, processes = [], []  # servers: (name, url, extra request fields)
    try:
        if args.url:
            servers.append(("server at " + args.url, args.url.rstrip("/"), {}))
            wait_healthy(servers[-1][1], None)
        else:
            port = free_port()
            simd = ["--simd", args.simd] if args.simd else []
            processes.append(start_server(
                [args.barellm, "serve", args.model, "--port", str(port), "--parallel",
                 str(args.clients), "--ctx", str(args.ctx), "--threads", str(args.threads),
                 "--device", args.device, *simd]))
            servers.append(("barellm serve", f"http://127.0.0.1:{port}", {}))
            wait_healthy(servers[-1][1], processes[-1])
        if args.llama_server:
            # llama-server splits -c among its -np slots.
            port = free_port()
            processes.append(start_server(
                [args.llama_server, "-m", args.gguf, "--host", "127.0.0.1", "--port", str(port),
                 "-np", str(args.clients), "-c", str(args.ctx * args.clients), "-t",
                 str(args.threads), "--no-webui",
                 "-ngl", LLAMA_ALL_LAYERS if args.device == "cuda" else "0"]))
            servers.append((f"llama-server -np {args.clients}", f"http://127.0.0.1:{port}",
                            {"ignore_eos": True}))
            wait_healthy(servers[-1][1], processes[-1])
        models = {}
        for name, url, _ in servers:
            with urllib.request.urlopen(url + "/v1/models", timeout=30) as response:
                models[name] = json.load(response)["data"][0]["id"]
        # A warm-up round each (page faults, thread start-up), then the rounds, alternating.
        for name, url, extra in servers:
            run_round(url, models[name], args.clients, min(8, args.max_tokens), extra)
        rounds = {name: [] for name, _, _ in servers}
        for number in range(args.rounds):
            for name, url, extra in servers:
                result = run_round(url, models[name], args.clients, args.max_tokens, extra)
                rounds[name].append(result)
                print(f"load_test: round {number + 1} {name}: "
                      f"{sum(result['tokens']) / result['seconds']:.1f} tok/s", file=sys.stderr)
    finally:
        for process in processes:
            process.terminate()
            process.wait(60)
    rows = [summary(name, rounds[name]) for name, _, _ in servers]
    if args.json:
        print(json.dumps({"clients": args.clients, "max_tokens": args.max_tokens,
                          "threads": args.threads, "ctx": args.ctx, "simd": args.simd,
                          "device": args.device,
                          "results": rows}, indent=1))
    else:
        print(markdown(rows))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""bench_serve.py — serve's throughput with C concurrent clients (bench/bench_serve.sh starts the server).

Each client sends R requests one after the other (a closed loop): a seeded random prompt of P token ids,
max_tokens drawn from [G/4, G] (seeded; requests of different lengths, so that requests end at different
steps), temperature 0. With --stream the answer comes as server-sent events and the time to the first token
is the first event's arrival; without, the whole answer (time to first token = the whole latency).
Prints one JSON line: clients, requests, tokens generated, wall seconds, tokens/s in all, per-request
latency (mean, p50, p95) and time to first token (mean, p95). Standard library only (Debian's python3)."""
import argparse
import http.client
import json
import random
import threading
import time


def one(port, body, stream):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("status %d: %s" % (r.status, r.read()[:300]))
    first = None
    ntok = 0
    if stream:
        buf = b""
        done = False
        while not done:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                done = True
                break
            ev = json.loads(line[6:])
            for ch in ev.get("choices", []):
                k = len(ch["logprobs"]["tokens"]) if ch.get("logprobs") else 0
                if k and first is None:
                    first = time.perf_counter() - t0
                ntok += k
        if not done:
            raise RuntimeError("the stream ended without data: [DONE]")
    else:
        o = json.loads(r.read())
        ntok = o["usage"]["completion_tokens"]
    t = time.perf_counter() - t0
    c.close()
    return t, (first if first is not None else t), ntok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--requests", type=int, default=4, help="per client")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=96)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    lat, ttft, toks, errs = [], [], [0], []
    lock = threading.Lock()

    def client(i):
        rng = random.Random(a.seed * 1000003 + i)
        for _ in range(a.requests):
            body = {"prompt": [rng.randrange(a.vocab) for _ in range(a.prompt)], "max_tokens": rng.randint(max(1, a.gen // 4), a.gen),
                    "temperature": 0, "logprobs": 0, "return_tokens_as_token_ids": True}
            if a.stream:
                body["stream"] = True
            try:
                t, f, n = one(a.port, body, a.stream)
            except Exception as e:  # noqa: BLE001 (reported below)
                with lock:
                    errs.append(str(e))
                return
            with lock:
                lat.append(t)
                ttft.append(f)
                toks[0] += n

    th = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    t0 = time.perf_counter()
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    if errs:
        raise SystemExit("errors: %s" % errs[:3])
    lat.sort()
    ttft.sort()

    def pct(x, p):
        return x[min(len(x) - 1, int(p * len(x)))]

    print(json.dumps({"clients": a.clients, "requests": len(lat), "stream": a.stream, "tokens": toks[0], "wall_s": round(wall, 3),
                      "tokens_per_s": round(toks[0] / wall, 1), "latency_mean_s": round(sum(lat) / len(lat), 4),
                      "latency_p50_s": round(pct(lat, 0.5), 4), "latency_p95_s": round(pct(lat, 0.95), 4),
                      "ttft_mean_s": round(sum(ttft) / len(ttft), 4), "ttft_p95_s": round(pct(ttft, 0.95), 4)}))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A stand-in OpenAI completions server for tests/serve/test_probe.sh (loopback, standard library only).

usage: fake_server.py PORT_FILE MODE [DELAY_S]

It answers echo + logprobs requests with made-up but deterministic numbers (each prompt token's
log-probability is a function of its id and position; the token is "top-1" unless id % 3 == 0), so a
probe's result depends only on the prompts. MODE:
  ok        well-formed answers
  flaky     the first 3 completions requests get 503 (then ok): retries
  missing   choices[0].logprobs left out
  count     token_logprobs one entry short
  token     the echoed token at position 2 is another id than the one sent
  slow      ok, after DELAY_S seconds per request (a run to kill midway)
  auth      ok, but every request must carry "Authorization: Bearer sekrit-key-42" (else 401)
It listens on 127.0.0.1 port 0 and writes the port to PORT_FILE.
"""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT_FILE, MODE = sys.argv[1], sys.argv[2]
DELAY = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
state = {"n": 0}
lock = threading.Lock()


def lp_of(tok, pos):
    return -((tok * 7919 + pos * 104729) % 1000) / 1000.0 - 0.01


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def send(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if status == 503:
            self.send_header("Retry-After", "0")
        self.end_headers()
        self.wfile.write(body)

    def authorised(self):
        if MODE != "auth" or self.headers.get("Authorization") == "Bearer sekrit-key-42":
            return True
        self.send(401, {"error": {"message": "bad key"}})
        return False

    def do_GET(self):
        if not self.authorised():
            return
        if self.path == "/v1/models":
            self.send(200, {"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
        else:
            self.send(404, {"error": {"message": "no"}})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if not self.authorised():
            return
        with lock:
            state["n"] += 1
            n = state["n"]
        if MODE == "flaky" and n <= 3:
            return self.send(503, {"error": {"message": "overloaded"}})
        if MODE == "slow":
            time.sleep(DELAY)
        ids = req["prompt"]
        if not req.get("echo"):  # prompt_logprobs alone, or greedy: not offered by this server
            return self.send(400, {"error": {"message": "echo is required here"}})
        toks, tls, tops = [], [], []
        for t, i in enumerate(ids + [7]):
            shown = i
            if MODE == "token" and t == 2:
                shown = i + 1
            toks.append("token_id:%d" % shown)
            if t == 0:
                tls.append(None)
                tops.append(None)
                continue
            lp = lp_of(i, t)
            tls.append(lp)
            if i % 3 == 0:  # another token is the top-1
                tops.append({"token_id:%d" % (i + 1): lp + 0.25, "token_id:%d" % i: lp})
            else:
                tops.append({"token_id:%d" % i: lp})
        if MODE == "count":
            tls = tls[:-2]
        choice = {"index": 0, "text": "", "finish_reason": "length",
                  "logprobs": {"tokens": toks, "token_logprobs": tls, "top_logprobs": tops,
                               "text_offset": list(range(len(toks)))}}
        if MODE == "missing":
            del choice["logprobs"]
        self.send(200, {"id": "x", "object": "text_completion", "model": "fake-model", "choices": [choice]})


srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
with open(PORT_FILE + ".tmp", "w") as f:
    f.write("%d\n" % srv.server_address[1])
import os  # noqa: E402

os.replace(PORT_FILE + ".tmp", PORT_FILE)
srv.serve_forever()

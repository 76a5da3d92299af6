"""ps.serve: the shipped w8s8 served on a free port (ps_api_serve_start), asked /v1/completions with urllib for
2 greedy tokens with their log-probabilities, checked against the model's own logits (ps.load's
run_with_hooks over the prompt and the prompt + the first token); the options refused by key; stop and the
with block."""
import json
import urllib.error
import urllib.request

import numpy as np
import pytest

import phasescope as ps
from conftest import model_path


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, json.loads(r.read())


def log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def test_serve_completion(w8s8):
    prompt = [5, 17, 3, 40, 22, 9]
    with ps.serve(model_path("data/models/w8s8"), port=0, max_batch=4) as s:
        assert s.port > 0 and s.url == f"http://127.0.0.1:{s.port}/v1" and s.name == "w8s8" and s.running
        st, r = post(s.url + "/completions", {"model": "w8s8", "prompt": prompt, "max_tokens": 2, "temperature": 0,
                                              "logprobs": 1, "return_tokens_as_token_ids": True})
    assert not s.running
    assert st == 200
    lp = r["choices"][0]["logprobs"]
    got = [int(t.split(":")[1]) for t in lp["tokens"]]
    assert len(got) == 2
    # the same greedy continuation from the model's logits, one forward per step
    seq = list(prompt)
    for k in range(2):
        row = w8s8.run_with_hooks(np.array([seq], np.int32))[0, -1]
        ls = log_softmax(row)
        want = int(np.argmax(row))
        assert got[k] == want, (k, got, want)
        assert abs(lp["token_logprobs"][k] - ls[want]) < 1e-4, (k, lp["token_logprobs"][k], ls[want])
        seq.append(want)


def test_serve_errors():
    with pytest.raises(ps.PhasescopeError, match='"bogus": unknown'):
        ps.serve(model_path("data/models/w8s8"), bogus=1)
    with pytest.raises(ps.PhasescopeError, match='"port": --port 70000') as e:
        ps.serve(model_path("data/models/w8s8"), port=70000)
    assert e.value.code == 2
    with pytest.raises(ps.PhasescopeError, match='"max_tokens": expected an integer'):
        ps.serve(model_path("data/models/w8s8"), max_tokens="many")
    s = ps.serve(model_path("data/models/w8s8"), port=0)
    port = s.port
    s.stop()
    s.stop()  # again: nothing
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)

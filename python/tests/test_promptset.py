"""The instruments on a caller's prompts (ps.PromptSet; CLI --prompts FILE): ps.knockout and ps.sweep against a
plain loop written here — run_with_cache for the means, run_with_hooks with a Python function that puts the
mean in place, the NLL of the answer at the query read off the logits — on the controlled model (deep_w8s8,
compressed and raw targets), a Qwen3 checkpoint and a DeepSeek-V4 checkpoint; the CLI's --prompts equal to
Python's call; every bad record refused with its line and key."""
import json
import os
import subprocess

import numpy as np
import pytest

import phasescope as ps
from conftest import CLI, ROOT, cli, model_path


def make_set(vocab, N, T, P, seed, alt=True, lo=2):
    """Prompts with a repeated pair: (a, b) at position k (k mod P = the residue), later a at the query; answer b."""
    rng = np.random.default_rng(seed)
    tok = rng.integers(lo, vocab, size=(N, T))
    tok[:, 0] = 0
    q = np.full(N, T - 1)
    res = np.arange(N) % P
    k = 4 + res + P * rng.integers(0, max(1, (T - 12) // P), size=N)
    k = np.minimum(k, T - 4)
    ans = tok[np.arange(N), k + 1]
    tok[np.arange(N), q] = tok[np.arange(N), k]
    a2 = (ans + 1 - lo) % (vocab - lo) + lo if alt else None
    return ps.PromptSet(tok, q, ans, k % P, a2)


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def outcomes(logits, S):
    """per prompt: correct, NLL of the answer, logit difference answer - alt"""
    i = np.arange(len(S))
    row = logits[i, S.query]
    lp = log_softmax(row)
    ok = row.argmax(-1) == S.answer
    ld = row[i, S.answer].astype(np.float64) - row[i, S.alt] if S.alt is not None else None
    return ok, -lp[i, S.answer], ld


def per_residue(x, S, P):
    return np.array([x[S.residue == r].mean() for r in range(P)])


def loop_knockout(m, S, points, head_axis, heads):
    """delta NLL [cells, P], accuracy [cells, P], delta logit diff [cells, P]: each cell's points mean-replaced
    (head_axis: the axis of the head in the activation, None: the whole activation)"""
    P = S.period
    clean = m(S.tokens)
    ok0, nll0, ld0 = outcomes(clean, S)
    _, cache = m.run_with_cache(S.tokens, names=points)
    means = {p: cache[p].astype(np.float64).mean(0).astype(np.float32) for p in points}
    d_nll, acc, d_ld = [], [], []
    for g in heads:
        def fn(a, name, g=g):
            if head_axis is None:
                a[:] = means[name]
            else:
                idx = [slice(None)] * a.ndim
                idx[head_axis] = g
                a[tuple(idx)] = means[name][tuple(idx[1:])]

        lg = m.run_with_hooks(S.tokens, fwd_hooks=[(p, fn) for p in points])
        ok, nll, ld = outcomes(lg, S)
        d_nll.append(per_residue(nll - nll0, S, P))
        acc.append(per_residue(ok.astype(float), S, P))
        d_ld.append(per_residue(ld - ld0, S, P))
    return np.array(d_nll), np.array(acc), np.array(d_ld), per_residue(ok0.astype(float), S, P)


def same_accuracy(got, want, n_per):
    """Accuracies from two computations of the same numbers (other batches, another summation order): equal,
    except that a prompt whose top two logits are within rounding may flip on another CPU (AVX2 vs AVX-512): at
    most one prompt per entry and two entries in all."""
    got, want = np.asarray(got, dtype=float), np.asarray(want, dtype=float)
    d = np.abs(got - want)
    assert np.all(d <= 1.0 / np.maximum(n_per, 1) + 1e-9) and np.count_nonzero(d > 1e-9) <= 2, (got, want)  # the JSON holds 10 digits


def check_knockout(r, loop, tol=1e-3):
    d_nll, acc, d_ld, clean_acc = loop
    np.testing.assert_allclose(r.arrays["grid.cells.residues.delta_nll"], d_nll, atol=tol)
    same_accuracy(r.arrays["grid.cells.residues.accuracy"], acc, r.arrays["grid.cells.residues.n"])
    np.testing.assert_allclose(r.arrays["grid.cells.residues.delta_logit_diff"], d_ld, atol=tol)
    same_accuracy(r.arrays["grid.clean.residues.accuracy"], clean_acc, r.arrays["grid.clean.residues.n"])


@pytest.fixture(scope="module")
def deep_set(deep):
    return make_set(deep.vocab_size, 24, 40, 8, seed=1)


@pytest.mark.parametrize("target,points", [
    ("compressed", ["blocks.10.attn.hook_ck", "blocks.10.attn.hook_cv"]),
    ("raw", ["blocks.10.attn.hook_k", "blocks.10.attn.hook_v"]),
])
def test_knockout_equals_hook_loop(deep, deep_set, target, points):
    r = ps.knockout(deep, prompts=deep_set, layers=[10], target=target, batch=7)
    heads = list(range(8))
    assert list(r.arrays["grid.cells.head"]) == heads
    check_knockout(r, loop_knockout(deep, deep_set, points, 2, heads))
    # the naive path (a full forward per cell) and the restarted one give the same grid
    assert r.data["grid"]["period"] == 8


def test_knockout_two_layers(deep, deep_set):
    """Each layer's cells get their own logit differences (the JSON lists layers ascending, the grid runs them
    top-down)."""
    r = ps.knockout(deep, prompts=deep_set, layers=[10, 11], heads=[0, 3], target="compressed")
    loops = [loop_knockout(deep, deep_set, [f"blocks.{l}.attn.hook_ck", f"blocks.{l}.attn.hook_cv"], 2, [0, 3]) for l in (10, 11)]
    np.testing.assert_allclose(r.arrays["grid.cells.residues.delta_logit_diff"], np.concatenate([lp[2] for lp in loops]), atol=1e-3)
    np.testing.assert_allclose(r.arrays["grid.cells.residues.delta_nll"], np.concatenate([lp[0] for lp in loops]), atol=1e-3)


def test_sweep_equals_plain_forward(deep, deep_set):
    S = deep_set
    r = ps.sweep(deep, prompts=S)
    ok, nll, ld = outcomes(deep(S.tokens), S)
    same_accuracy(r.arrays["curve.residues.accuracy"], per_residue(ok.astype(float), S, 8), r.arrays["curve.residues.n"])
    np.testing.assert_allclose(r.arrays["curve.residues.mean_logprob"], per_residue(-nll, S, 8), atol=2e-5)
    np.testing.assert_allclose(r.arrays["curve.residues.mean_logit_diff"], per_residue(ld, S, 8), atol=2e-5)
    assert list(r.arrays["curve.residues.n"]) == [3] * 8
    ev = r.data["provenance"]["eval"]
    assert ev["n_prompts"] == 24 and ev["period"] == 8 and ev["prompts"]["T"] == 40 and ev["prompts"]["source"] == "request"
    # period= wider than the labels: empty residues stay in the curve
    r16 = ps.sweep(deep, prompts=S, period=16)
    assert r16.data["curve"]["period"] == 16 and list(r16.arrays["curve.residues.n"])[8:] == [0] * 8


def test_without_alt(deep):
    S = make_set(deep.vocab_size, 8, 24, 4, seed=3, alt=False)
    r = ps.sweep(deep, prompts=S)
    assert "mean_logit_diff" not in r.data["curve"]["residues"][0]
    k = ps.knockout(deep, prompts=S, layers=[11], heads=[0, 1])
    assert "delta_logit_diff" not in k.data["grid"]["cells"][0]["residues"][0]


def test_qwen3(tmp_path):
    m = ps.load(model_path("tests/conformance/qwen3_published"))
    S = make_set(m.vocab_size, 12, 24, 4, seed=5)
    r = ps.knockout(m, prompts=S, layers=[1], target="raw")
    check_knockout(r, loop_knockout(m, S, ["blocks.1.attn.hook_k", "blocks.1.attn.hook_v"], 2, [0, 1]))
    m.close()


def test_deepseek_v4(tmp_path):
    m = ps.load(model_path("tests/conformance/v4/mix4"))
    S = make_set(m.vocab_size, 8, 24, 4, seed=6)
    layer = 1
    r = ps.knockout(m, prompts=S, layers=[layer], target="raw")
    check_knockout(r, loop_knockout(m, S, [f"layers.{layer}.attn.kv"], None, [0]))
    s = ps.sweep(m, prompts=S)
    ok, nll, _ = outcomes(m(S.tokens), S)
    same_accuracy(s.arrays["curve.residues.accuracy"], per_residue(ok.astype(float), S, 4), s.arrays["curve.residues.n"])
    np.testing.assert_allclose(s.arrays["curve.residues.mean_logprob"], per_residue(-nll, S, 4), atol=2e-5)
    m.close()


def strip(d):
    d = json.loads(json.dumps(d))
    d.pop("provenance")
    return d


def test_cli_equals_python(deep, deep_set, tmp_path):
    f = tmp_path / "prompts.jsonl"
    deep_set.save(f)
    assert ps.PromptSet.load(f).records() == deep_set.records()
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    for cmd, extra, name in [("knockout", ["--layers", "10,11", "--heads", "0,3"], "knockout.json"), ("sweep", [], "sweep.json")]:
        out = tmp_path / cmd
        subprocess.run([CLI, cmd, "--model", model_path("data/models/deep_w8s8"), "--prompts", str(f), "--out", str(out), *extra],
                       check=True, capture_output=True, env=env, cwd=ROOT)
        with open(out / name) as fh:
            cli_doc = json.load(fh)
        kw = dict(layers=[10, 11], heads=[0, 3]) if cmd == "knockout" else {}
        py = ps.run(cmd, deep, prompts=deep_set, **kw)
        assert strip(cli_doc) == strip(py.data)
        assert cli_doc["provenance"]["eval"]["prompts"]["tokens_hash"] == py.data["provenance"]["eval"]["prompts"]["tokens_hash"]


BAD = [
    ('{"tokens": [0, 5, 6], "query": 3, "answer": 7, "residue": 0}', "line 2: key \"query\" = 3 is past the tokens"),
    ('{"tokens": [0, 5, 6], "query": 1, "answer": 7}', "line 2: missing key \"residue\""),
    ('{"tokens": [0, 5], "query": 1, "answer": 7, "residue": 0}', "line 2: key \"tokens\": 2 tokens, but the first prompt has 3"),
    ('{"tokens": [0, 5, 6], "query": 1, "answer": "x", "residue": 0}', "line 2: key \"answer\" is not an integer"),
    ('{"tokens": [0, 5, 6], "query": 1, "answer": 7, "residue": -1}', "line 2: key \"residue\" = -1 must be >= 0"),
    ('{"tokens": [0, 5, 6], "query": 1, "answer": 7, "residue": 0, "alt": 3}', "line 2: key \"alt\" given, but the first prompt has none"),
    ('{"tokens": [0, 5, 6], "query": 1, "answer": 7, "residue": 0, "extra": 1}', "line 2: unknown key \"extra\""),
    ('{"tokens": [0, 5, 6], "query": 1, "answer": 7, "residue": 0', "line 2: not JSON"),
    ('{"tokens": [0, 5, 999], "query": 1, "answer": 7, "residue": 0}', "prompt 1: key \"tokens\": id 999 at position 2 is outside the vocabulary"),
    ('{"tokens": [0, 5, 6], "query": 1, "answer": 96, "residue": 0}', "prompt 1: key \"answer\" = 96 is outside the vocabulary"),
]


@pytest.mark.parametrize("line,msg", BAD)
def test_bad_records(tmp_path, line, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"tokens": [0, 5, 6], "query": 2, "answer": 7, "residue": 1}\n' + line + "\n")
    r = subprocess.run([CLI, "sweep", "--model", model_path("data/models/deep_w8s8"), "--prompts", str(f), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2, r.stderr  # a usage error, as a bad flag
    assert msg in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()


def test_bad_requests(deep):
    S = make_set(deep.vocab_size, 4, 16, 4, seed=2)
    with pytest.raises(ps.PhasescopeError, match="not below the period 2"):
        ps.sweep(deep, prompts=S, period=2)
    with pytest.raises(ps.PhasescopeError, match="a prompt set is run as given"):
        ps.sweep(deep, prompts=S, mode="move")
    with pytest.raises(ps.PhasescopeError, match="no fillers"):
        ps.knockout(deep, prompts=S, family="repeat")
    with pytest.raises(ps.PhasescopeError, match="takes no prompt set"):
        ps.gates(deep, prompts=S)
    with pytest.raises(ps.PhasescopeError, match="item 0: missing key \"answer\""):
        ps.run("sweep", deep, prompts=[{"tokens": [0, 1], "query": 1, "residue": 0}])
    with pytest.raises(ps.PhasescopeError, match="query 5 is past the tokens"):
        ps.PromptSet([[0, 1, 2]], [5], [1], [0])
    with pytest.raises(ps.PhasescopeError, match="answer has 2 entries for 1 prompts"):
        ps.PromptSet([[0, 1, 2]], [1], [1, 2], [0])


def test_saved_sweep_prompts_reproduce_the_sweep(deep, tmp_path):
    """sweep --save-prompts writes the task sweep's prompts as a prompt set; the sweep on that set gives the
    built-in sweep's numbers (the same accuracy per residue; log-probs to float rounding: other batches)."""
    f = tmp_path / "sweep.jsonl"
    for mode in ("pad", "move"):
        r = ps.sweep(deep, n=4, period=8, mode=mode, save_prompts=f)
        S = ps.PromptSet.load(f)
        assert len(S) == sum(r.arrays["curve.residues.n"])
        s = ps.sweep(deep, prompts=S, period=8)
        np.testing.assert_array_equal(s.arrays["curve.residues.n"], r.arrays["curve.residues.n"])
        same_accuracy(s.arrays["curve.residues.accuracy"], r.arrays["curve.residues.accuracy"], r.arrays["curve.residues.n"])
        np.testing.assert_allclose(s.arrays["curve.residues.mean_logprob"], r.arrays["curve.residues.mean_logprob"], atol=1e-3)
    with pytest.raises(ps.PhasescopeError, match="--save-prompts: writes the prompts of the checkpoint's task sweep"):
        ps.sweep(deep, prompts=S, save_prompts=f)


@pytest.mark.parametrize("target,points", [("raw", ["blocks.11.attn.hook_k", "blocks.11.attn.hook_v"]),
                                           ("compressed", ["blocks.11.attn.hook_ck"])])
def test_knockout_on_select_kind(target, points):
    """The select kind (block selection through pooled keys, data/models/deep_select_s2_rule): raw replaces the
    keys and values the selected blocks are read from, compressed the level-1 pooled keys that choose the blocks;
    a forward per cell (no restart path), equal to the hook loop."""
    m = ps.load(model_path("data/models/deep_select_s2_rule"))
    S = make_set(m.vocab_size, 16, 48, 16, seed=7)
    r = ps.knockout(m, prompts=S, layers=[11], target=target, heads=[0, 3, 6])
    check_knockout(r, loop_knockout(m, S, points, 2, [0, 3, 6]))
    m.close()


MINICPM = "tests/conformance/infllm/tiny"  # K 8, S 4, blocks of 16, top 4 + 2 local + 1 initial, dense_len 0


@pytest.fixture(scope="module")
def minicpm():
    m = ps.load(model_path(MINICPM))
    yield m
    m.close()


@pytest.mark.parametrize("target,points", [("raw", ["blocks.{l}.attn.hook_k", "blocks.{l}.attn.hook_v"]),
                                           ("compressed", ["blocks.{l}.attn.hook_ck"])])
def test_knockout_on_minicpm(minicpm, target, points):
    """MiniCPM4 (InfLLM-v2, tests/conformance/infllm/tiny) at 112 tokens (the sparse path: 7 blocks for 6 slots,
    so the choice matters): raw replaces a KV head's keys and values, compressed its level-1 pooled keys hook_ck;
    a forward per cell, equal to the hook loop on both layers."""
    m = minicpm
    S = make_set(m.vocab_size, 12, 112, 4, seed=8)
    r = ps.knockout(m, prompts=S, layers=[0, 1], target=target)
    assert r.data["grid"]["target"] == target
    assert list(r.arrays["grid.cells.layer"]) == [0, 0, 1, 1] and list(r.arrays["grid.cells.head"]) == [0, 1, 0, 1]
    loops = [loop_knockout(m, S, [p.format(l=l) for p in points], 2, [0, 1]) for l in (0, 1)]
    check_knockout(r, tuple(np.concatenate(x) for x in zip(*(lp[:3] for lp in loops))) + (loops[0][3],))
    assert np.abs(r.arrays["grid.cells.residues.delta_nll"]).max() > 1e-3  # the knockout moves something


def test_minicpm_compressed_knockout_moves_the_selection(minicpm):
    """The point of the compressed target: a KV head's level-1 pooled keys replaced by their mean (as a
    compressed-target cell does) change the blocks that head selects, and only that head's at that layer."""
    m = minicpm
    S = make_set(m.vocab_size, 12, 112, 4, seed=8)
    ck, bl = "blocks.0.attn.hook_ck", "blocks.0.attn.hook_blocks"
    _, cache = m.run_with_cache(S.tokens, names=[ck, bl])
    mean = cache[ck].astype(np.float64).mean(0).astype(np.float32)
    for g in (0, 1):
        seen = {}

        def put(a, name, g=g):
            a[:, :, g] = mean[:, g]

        def keep(a, name):
            seen["blocks"] = a.copy()

        m.run_with_hooks(S.tokens, fwd_hooks=[(ck, put), (bl, keep)])
        moved = (seen["blocks"][:, :, g] != cache[bl][:, :, g]).any(-1)
        assert moved.mean() > 0.05, moved.mean()  # rows whose selected set changed
        np.testing.assert_array_equal(seen["blocks"][:, :, 1 - g], cache[bl][:, :, 1 - g])


def test_minicpm_knockout_cli_with_task_file(tmp_path):
    """The CLI on the checkpoint with the task file tests/conformance/infllm/tiny_task.json (128 tokens: the
    sparse path, so the default target is compressed)."""
    out = tmp_path / "ko"
    cli("knockout", "--model", model_path(MINICPM), "--task", model_path("tests/conformance/infllm/tiny_task.json"), "--n", 8,
        "--period", 2, "--out", out)
    with open(out / "knockout.json") as fh:
        doc = json.load(fh)
    g = doc["grid"]
    assert g["target"] == "compressed" and g["period"] == 2 and "unit" not in g
    assert [(c["layer"], c["head"]) for c in g["cells"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert doc["provenance"]["task_source"]["file"].endswith("tiny_task.json")
    d = np.array([[r["delta_nll"] for r in c["residues"]] for c in g["cells"]])
    assert np.all(np.isfinite(d)) and np.abs(d).max() > 1e-4
    cli("render", out / "knockout.json", "--out", tmp_path / "fig")  # the result validator, then its figure


def test_minicpm_bad_knockout_requests(minicpm, tmp_path):
    m = minicpm
    S = make_set(m.vocab_size, 4, 112, 2, seed=9)
    with pytest.raises(ps.PhasescopeError, match="--target both: expected raw or compressed"):
        ps.knockout(m, prompts=S, target="both")
    with pytest.raises(ps.PhasescopeError, match="--target heads: expected raw or compressed"):
        ps.knockout(m, prompts=S, target="heads")
    short = ps.PromptSet([[0, 5, 6, 7, 5]] * 2, [4, 4], [6, 6], [0, 1])  # fewer tokens than a window (K = 8)
    with pytest.raises(ps.PhasescopeError, match="prompts of 5 tokens have no complete level-1 window"):
        ps.knockout(m, prompts=short, target="compressed")
    assert ps.knockout(m, prompts=short).data["grid"]["target"] == "raw"  # the default at that length
    # a copy whose prompts below 256 tokens run dense: raw by default, compressed refused
    d = tmp_path / "dense"
    d.mkdir()
    cfg = json.load(open(model_path(MINICPM + "/config.json")))
    cfg["sparse_config"]["dense_len"] = 256
    json.dump(cfg, open(d / "config.json", "w"))
    os.symlink(model_path(MINICPM + "/model.safetensors"), d / "model.safetensors")
    md = ps.load(d)
    assert ps.knockout(md, prompts=S, layers=[0]).data["grid"]["target"] == "raw"
    with pytest.raises(ps.PhasescopeError, match="prompts of 112 tokens run dense \\(below sparse_config.dense_len 256\\)"):
        ps.knockout(md, prompts=S, target="compressed")
    md.close()

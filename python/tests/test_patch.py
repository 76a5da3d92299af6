"""Activation patching on a caller's prompts (ps.patch; CLI `phasescope patch --prompts CLEAN --corrupt CORRUPT`)
against a plain loop written here: run_with_cache on the corrupt tokens, then run_with_hooks on the clean tokens
with a Python function that copies the corrupt activation into the cell's head, the answer's NLL, accuracy and
logit difference read off the logits — on the controlled model (deep_w8s8: batched cells restarted at the layer),
a Qwen3 checkpoint and a DeepSeek-V4 checkpoint (a forward per cell); patching with corrupt == clean changes
nothing; the CLI's result equals Python's; bad inputs are refused naming the file, line or key."""
import json
import os
import subprocess

import numpy as np
import pytest

import phasescope as ps
from conftest import CLI, ROOT, model_path
from test_promptset import log_softmax, per_residue, same_accuracy


def make_pair(vocab, N, T, P, seed, lo=2):
    """Clean prompts with a repeated pair (a, b) at position k (k mod P = the residue), a again at the query,
    answer b; the corrupt prompts the same with b replaced by b' (alt = b': the logit difference b - b')."""
    rng = np.random.default_rng(seed)
    tok = rng.integers(lo, vocab, size=(N, T))
    tok[:, 0] = 0
    q = np.full(N, T - 1)
    res = np.arange(N) % P
    k = np.minimum(4 + res + P * rng.integers(0, max(1, (T - 12) // P), size=N), T - 4)
    i = np.arange(N)
    ans = tok[i, k + 1]
    tok[i, q] = tok[i, k]
    alt = (ans + 1 - lo) % (vocab - lo) + lo
    corrupt = tok.copy()
    corrupt[i, k + 1] = alt
    return ps.PromptSet(tok, q, ans, k % P, alt), corrupt


def outcomes(logits, S):
    i = np.arange(len(S))
    row = logits[i, S.query]
    lp = log_softmax(row)
    return row.argmax(-1) == S.answer, -lp[i, S.answer], row[i, S.answer].astype(np.float64) - row[i, S.alt]


def loop_patch(m, S, corrupt, points, head_axis, heads):
    """Per cell and residue: delta NLL (patched - clean), accuracy, delta logit diff, patch metric; and the clean
    and corrupt runs' accuracy, NLL and logit difference per residue."""
    P = S.period
    ok0, nll0, ld0 = outcomes(m(S.tokens), S)
    _, cache = m.run_with_cache(corrupt, names=points)
    okc, nllc, ldc = outcomes(m(corrupt), S)
    LD0, LDC = per_residue(ld0, S, P), per_residue(ldc, S, P)
    cells = {k: [] for k in ("d_nll", "acc", "d_ld", "metric")}
    for g in heads:
        def fn(a, name, g=g):
            if head_axis is None:
                a[:] = cache[name]
            else:
                idx = [slice(None)] * a.ndim
                idx[head_axis] = g
                a[tuple(idx)] = cache[name][tuple(idx)]

        ok, nll, ld = outcomes(m.run_with_hooks(S.tokens, fwd_hooks=[(p, fn) for p in points]), S)
        cells["d_nll"].append(per_residue(nll - nll0, S, P))
        cells["acc"].append(per_residue(ok.astype(float), S, P))
        cells["d_ld"].append(per_residue(ld - ld0, S, P))
        cells["metric"].append((per_residue(ld, S, P) - LDC) / (LD0 - LDC))
    runs = {"clean": (per_residue(ok0.astype(float), S, P), per_residue(nll0, S, P), LD0),
            "corrupt": (per_residue(okc.astype(float), S, P), per_residue(nllc, S, P), LDC)}
    return {k: np.array(v) for k, v in cells.items()}, runs


def check_patch(r, loop, tol=1e-3):
    cells, runs = loop
    A = r.arrays
    np.testing.assert_allclose(A["grid.cells.residues.delta_nll"], cells["d_nll"], atol=tol)
    same_accuracy(A["grid.cells.residues.accuracy"], cells["acc"], A["grid.cells.residues.n"])
    np.testing.assert_allclose(A["grid.cells.residues.delta_logit_diff"], cells["d_ld"], atol=tol)
    np.testing.assert_allclose(A["grid.cells.residues.patch_metric"], cells["metric"], atol=tol * 10)
    for run in ("clean", "corrupt"):
        acc, nll, ld = runs[run]
        same_accuracy(A[f"grid.{run}.residues.accuracy"], acc, A[f"grid.{run}.residues.n"])
        np.testing.assert_allclose(-A[f"grid.{run}.residues.mean_logprob"], nll, atol=tol)
        np.testing.assert_allclose(A[f"grid.{run}.residues.mean_logit_diff"], ld, atol=tol)


@pytest.fixture(scope="module")
def deep_pair(deep):
    return make_pair(deep.vocab_size, 12, 32, 4, seed=11)


def test_patch_equals_hook_loop(deep, deep_pair):
    """deep_w8s8, compressed target, two layers, batches of 5 prompts: the restarted, batched cells equal the loop."""
    S, C = deep_pair
    heads = [0, 5, 7]
    r = ps.patch(deep, clean=S, corrupt=C, layers=[10, 11], heads=heads, target="compressed", batch=5)
    assert r.kind == "patch" and r.data["grid"]["method"] == "patch"
    assert list(r.arrays["grid.cells.layer"]) == [10] * 3 + [11] * 3 and list(r.arrays["grid.cells.head"]) == heads * 2
    loops = [loop_patch(deep, S, C, [f"blocks.{l}.attn.hook_ck", f"blocks.{l}.attn.hook_cv"], 2, heads) for l in (10, 11)]
    cells = {k: np.concatenate([lp[0][k] for lp in loops]) for k in loops[0][0]}
    check_patch(r, (cells, loops[0][1]))
    ev = r.data["provenance"]["eval"]
    assert ev["prompts"]["n"] == 12 and ev["corrupt"]["n"] == 12 and ev["corrupt"]["T"] == 32 and len(ev["corrupt"]["tokens_hash"]) == 16
    assert sorted(r.figures()) == ["patch_heatmap.png"]


def test_raw_target_and_zero_change(deep, deep_pair):
    """raw target (hook_k, hook_v) against the loop; patching with corrupt == clean changes nothing anywhere (to the
    float rounding of the restarted forward, which sums in another order than the clean one)."""
    S, C = deep_pair
    r = ps.patch(deep, clean=S, corrupt=C, layers=[11], heads=[5], target="raw")
    check_patch(r, loop_patch(deep, S, C, ["blocks.11.attn.hook_k", "blocks.11.attn.hook_v"], 2, [5]))
    z = ps.patch(deep, clean=S, corrupt=S.tokens, layers=[11], heads=[0, 3])
    A = z.arrays
    np.testing.assert_allclose(A["grid.cells.residues.delta_nll"], 0, atol=1e-4)
    np.testing.assert_allclose(A["grid.cells.residues.delta_accuracy_pp"], 0, atol=1e-9)
    np.testing.assert_allclose(A["grid.cells.residues.delta_logit_diff"], 0, atol=1e-4)
    np.testing.assert_allclose(A["grid.corrupt.residues.mean_logprob"], A["grid.clean.residues.mean_logprob"], atol=1e-9)
    assert all(e["patch_metric"] is None for c in z.data["grid"]["cells"] for e in c["residues"])  # 0 / 0


def test_qwen3():
    m = ps.load(model_path("tests/conformance/qwen3_published"))
    S, C = make_pair(m.vocab_size, 12, 24, 4, seed=5)
    r = ps.patch(m, clean=S, corrupt=C, layers=[0, 1], target="raw", batch=5)
    loops = [loop_patch(m, S, C, [f"blocks.{l}.attn.hook_k", f"blocks.{l}.attn.hook_v"], 2, [0, 1]) for l in (0, 1)]
    check_patch(r, ({k: np.concatenate([lp[0][k] for lp in loops]) for k in loops[0][0]}, loops[0][1]))
    m.close()


def test_deepseek_v4():
    """DeepSeek-V4 (a forward per cell, no kept state): the raw target (layers.L.attn.kv, one cell per layer)."""
    m = ps.load(model_path("tests/conformance/v4/mix4"))
    S, C = make_pair(m.vocab_size, 8, 24, 4, seed=6)
    r = ps.patch(m, clean=S, corrupt=C, layers=[1], target="raw")
    check_patch(r, loop_patch(m, S, C, ["layers.1.attn.kv"], None, [0]))
    m.close()


def strip(d):
    d = json.loads(json.dumps(d))
    d.pop("provenance")
    return d


def run_cli(*args):
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    return subprocess.run([CLI, "patch", "--model", model_path("data/models/deep_w8s8"), *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=ROOT)


def test_cli_equals_python(deep, deep_pair, tmp_path):
    S, C = deep_pair
    clean, corr = tmp_path / "clean.jsonl", tmp_path / "corrupt.jsonl"
    S.save(clean)
    corr.write_text("".join(json.dumps({"tokens": t}) + "\n" for t in C.tolist()))
    out = tmp_path / "out"
    r = run_cli("--prompts", clean, "--corrupt", corr, "--layers", "11", "--heads", "1,2", "--out", out)
    assert r.returncode == 0, r.stderr
    with open(out / "patch.json") as fh:
        doc = json.load(fh)
    assert (out / "patch_heatmap.png").exists()
    py = ps.patch(deep, clean=S, corrupt=C, layers=[11], heads=[1, 2])
    assert strip(doc) == strip(py.data)
    for k in ("prompts", "corrupt"):
        assert doc["provenance"]["eval"][k]["tokens_hash"] == py.data["provenance"]["eval"][k]["tokens_hash"]
    # files as arguments of the Python call too
    assert strip(ps.patch(deep, clean=clean, corrupt=corr, layers=[11], heads=[1, 2]).data) == strip(doc)
    # --shard I/N (batches of 5: the units cross batches) merged = one process
    whole = tmp_path / "whole"
    args = ["--prompts", clean, "--corrupt", corr, "--layers", "10,11", "--heads", "1,2", "--batch", "5"]
    assert run_cli(*args, "--out", whole).returncode == 0
    for i in range(3):
        r = run_cli(*args, "--shard", f"{i}/3", "--out", tmp_path / "parts")
        assert r.returncode == 0, r.stderr
    r = subprocess.run([CLI, "merge", str(tmp_path / "parts"), "--out", str(tmp_path / "merged")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    with open(whole / "patch.json") as a, open(tmp_path / "merged" / "patch.json") as b:
        assert strip(json.load(a)) == strip(json.load(b))


def test_bad_inputs(deep, deep_pair, tmp_path):
    S, C = deep_pair
    clean, corr = tmp_path / "clean.jsonl", tmp_path / "corrupt.jsonl"
    S.save(clean)
    lines = [json.dumps({"tokens": t}) for t in C.tolist()]
    corr.write_text("\n".join(lines[:-1]) + "\n")  # one sequence short
    r = run_cli("--prompts", clean, "--corrupt", corr, "--layers", "11", "--out", tmp_path / "o")
    assert r.returncode == 2 and "11 token sequences, but the clean prompts are 12" in r.stderr, r.stderr
    corr.write_text("\n".join(lines[:2] + [json.dumps({"tokens": C[2, :-1].tolist()})] + lines[3:]) + "\n")
    r = run_cli("--prompts", clean, "--corrupt", corr, "--layers", "11", "--out", tmp_path / "o")
    assert r.returncode == 2 and "corrupt.jsonl line 3: key \"tokens\": 31 tokens, but the first has 32" in r.stderr, r.stderr
    r = run_cli("--prompts", clean, "--corrupt", tmp_path / "missing.jsonl", "--out", tmp_path / "o")
    assert r.returncode != 0 and "missing.jsonl" in r.stderr, r.stderr
    r = run_cli("--prompts", clean, "--out", tmp_path / "o")
    assert r.returncode == 2 and "--corrupt CORRUPT.jsonl" in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()
    with pytest.raises(ps.PhasescopeError, match="key \"tokens\": 31 tokens, but the clean prompts have 32"):
        ps.patch(deep, clean=S, corrupt=C[:, :-1], layers=[11])
    with pytest.raises(ps.PhasescopeError, match="corrupt must be integer tokens"):
        ps.patch(deep, clean=S, corrupt=C[0], layers=[11])
    with pytest.raises(ps.PhasescopeError, match="needs the clean prompts"):
        ps.patch(deep, corrupt=C, layers=[11])

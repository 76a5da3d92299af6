"""Selection recall (ps.recall; CLI `phasescope recall`) against a plain loop written here: run_with_cache of each
layer's hook_blocks, the needle's block looked up in the query row's blocks, counted per residue — on the select
kind (data/models/deep_select_s2_rule) and on the MiniCPM4 conformance checkpoint (tests/conformance/infllm/tiny);
the accuracy of the same forwards equal to ps.sweep's; the forced blocks; shards merged equal to one process; every
bad request refused by name."""
import json
import os
import subprocess

import numpy as np
import pytest

import phasescope as ps
from conftest import CLI, ROOT, model_path

SELECT = "data/models/deep_select_s2_rule"
TINY = "tests/conformance/infllm/tiny"


def needle_set(vocab, N, T, P, seed, lo=2, near=None):
    """Prompts with a repeated pair (a, b) at position k (k mod P = the residue), a again at the query (the last
    position), answer b; the needle is k. near: k within `near` tokens of the query (its block forced)."""
    rng = np.random.default_rng(seed)
    tok = rng.integers(lo, vocab, size=(N, T))
    tok[:, 0] = 0
    q = np.full(N, T - 1)
    res = np.arange(N) % P
    if near is None:
        k = 2 + res + P * rng.integers(0, max(1, (T - 8 - P) // P), size=N)
    else:
        k = T - 1 - near + (res - (T - 1 - near)) % P
        k = np.where(k >= T - 1, k - P, k)
    k = np.clip(k, 1, T - 3)
    ans = tok[np.arange(N), k + 1]
    tok[np.arange(N), q] = tok[np.arange(N), k]
    return ps.PromptSet(tok, q, ans, k % P, needle=k)


def loop_recall(m, S, layers, geom, offset=0):
    """found [cells, P], forced [cells, P], n [P]: the needle's block among the query row's blocks (hook_blocks)."""
    P = S.period
    names = [f"blocks.{l}.attn.hook_blocks" for l in layers]
    _, cache = m.run_with_cache(S.tokens, names=names)
    blk, ib, lb = geom["block"], geom["init_blocks"], geom["local_blocks"]
    H = cache[names[0]].shape[2]
    found = np.zeros((len(layers) * H, P), int)
    forced = np.zeros((len(layers) * H, P), int)
    n = np.zeros(P, int)
    for i in range(len(S)):
        t, r = int(S.query[i]), int(S.residue[i])
        nb = (int(S.needle[i]) + offset) // blk
        n[r] += 1
        f = nb < ib or (t // blk - lb <= nb <= t // blk)
        for li, name in enumerate(names):
            for g in range(H):
                hit = nb in cache[name][i, t, g].astype(int)
                found[li * H + g, r] += hit
                forced[li * H + g, r] += hit and f
    return found, forced, n


def cell_counts(r, key):
    return np.array([[e[key] for e in c["residues"]] for c in r.data["cells"]])


def check_against_loop(r, m, S, layers):
    found, forced, n = loop_recall(m, S, layers, r.data["selection"])
    got_n = cell_counts(r, "n")
    np.testing.assert_array_equal(got_n, np.broadcast_to(n, got_n.shape))
    got = cell_counts(r, "found")
    # the instrument's forwards run in batches, the loop's in one: a selection decided by a near-tie of two block
    # scores may fall the other way on another summation order (rare: at most one query a cell and residue)
    assert np.abs(got - found).max() <= 1 and np.abs(got - found).sum() <= 2, (got, found)
    np.testing.assert_array_equal(cell_counts(r, "forced") <= got, True)
    np.testing.assert_allclose(r.arrays["cells.residues.recall"], got / got_n, atol=1e-9)
    return found, forced


@pytest.fixture(scope="module")
def sel():
    m = ps.load(model_path(SELECT))
    yield m
    m.close()


def test_recall_select_kind_equals_loop(sel):
    S = needle_set(sel.vocab_size, 48, 64, 16, seed=3)
    r = ps.recall(sel, prompts=S, layers=[0, 11], period=16)
    assert [c["layer"] for c in r.data["cells"]] == [0] * 8 + [11] * 8
    assert r.data["selection"]["block"] == 16 and r.data["selection"]["n_kv_heads"] == 8
    check_against_loop(r, sel, S, [0, 11])
    # the accuracy of the same forwards is the sweep's on the same prompts
    s = ps.sweep(sel, prompts=S, period=16)
    np.testing.assert_array_equal(r.arrays["curve.residues.accuracy"], s.arrays["curve.residues.accuracy"])
    # per layer: any head / mean over heads, from the cells
    rec = r.arrays["cells.residues.recall"].reshape(2, 8, 16)
    mean_heads = np.array([[e["mean_heads"] for e in ly["residues"]] for ly in r.data["layers"]])
    np.testing.assert_allclose(mean_heads, rec.mean(1), atol=1e-9)
    any_head = np.array([[e["any_head"] for e in ly["residues"]] for ly in r.data["layers"]])
    assert np.all(any_head >= rec.max(1) - 1e-12)
    any_cell = np.array([e["any_cell"] for e in r.data["any_cell"]])
    assert np.all(any_cell >= any_head.max(0) - 1e-12) and np.all(any_cell <= 1)


def test_recall_forced_blocks(sel):
    """A needle in the query's own block or the one before it is forced: found at every head, counted forced."""
    S = needle_set(sel.vocab_size, 32, 64, 16, seed=5, near=3)
    r = ps.recall(sel, prompts=S, layers=[5], period=16)
    n, found, forced = cell_counts(r, "n"), cell_counts(r, "found"), cell_counts(r, "forced")
    np.testing.assert_array_equal(found, n)
    np.testing.assert_array_equal(forced, n)
    rec = r.arrays["cells.residues.recall"]
    assert np.all(rec[:, n[0] > 0] == 1) and np.isnan(rec[:, n[0] == 0]).all()


def test_recall_needle_offset(sel):
    """needle_offset moves the needle: the loop with the same offset agrees."""
    S = needle_set(sel.vocab_size, 32, 64, 16, seed=9)
    r = ps.recall(sel, prompts=S, layers=[3], period=16, needle_offset=1)
    assert r.data["needle_offset"] == 1
    found, _, _ = loop_recall(sel, S, [3], r.data["selection"], offset=1)
    got = cell_counts(r, "found")
    assert np.abs(got - found).max() <= 1 and np.abs(got - found).sum() <= 2


def test_recall_minicpm_equals_loop():
    m = ps.load(model_path(TINY))
    S = needle_set(m.vocab_size, 32, 160, 16, seed=11)
    r = ps.recall(m, prompts=S, period=16)
    assert [c["layer"] for c in r.data["cells"]] == [0, 0, 1, 1]
    g = r.data["selection"]
    assert (g["block"], g["topk"], g["init_blocks"], g["local_blocks"]) == (16, 4, 1, 2)
    found, forced = check_against_loop(r, m, S, [0, 1])
    assert found.sum() > forced.sum()  # some needles found by score, not all forced
    assert (found < cell_counts(r, "n")).any()  # and some missed: the measurement is not trivially 1
    m.close()


def test_recall_cli_and_shards_equal_python(sel, tmp_path):
    S = needle_set(sel.vocab_size, 24, 64, 8, seed=13)
    f = tmp_path / "set.jsonl"
    S.save(f)
    r = ps.recall(sel, prompts=S, layers=[1, 2], period=8, batch=8)
    base = [CLI, "recall", "--model", model_path(SELECT), "--prompts", str(f), "--layers", "1,2", "--period", "8", "--batch", "8"]
    env = dict(os.environ, OMP_NUM_THREADS="2")
    subprocess.run(base + ["--out", str(tmp_path / "one")], check=True, capture_output=True, env=env)
    for i in range(2):
        subprocess.run(base + ["--out", str(tmp_path / "sh"), "--shard", f"{i}/2"], check=True, capture_output=True, env=env)
    parts = sorted(str(p) for p in (tmp_path / "sh").glob("recall.part-*"))
    assert len(parts) == 2
    subprocess.run([CLI, "merge", *parts, "--out", str(tmp_path / "merged")], check=True, capture_output=True, env=env)
    one = json.load(open(tmp_path / "one" / "recall.json"))
    merged = json.load(open(tmp_path / "merged" / "recall.json"))
    for key in ("curve", "cells", "layers", "any_cell", "selection", "period"):
        assert one[key] == merged[key] == r.data[key], key
    assert (tmp_path / "one" / "recall_heatmap.png").stat().st_size > 10000
    fig = r.figure()
    assert fig is not None


def test_recall_bad_requests(sel, tmp_path):
    S = needle_set(sel.vocab_size, 8, 64, 8, seed=1)
    plain = ps.PromptSet(S.tokens, S.query, S.answer, S.residue)
    with pytest.raises(ps.PhasescopeError, match='needs each prompt\'s "needle"'):
        ps.recall(sel, prompts=plain)
    with pytest.raises(ps.PhasescopeError, match="needle 63 is after the query"):
        ps.PromptSet(S.tokens, S.query - 1, S.answer, S.residue, needle=np.full(8, 63))
    with pytest.raises(ps.PhasescopeError, match="--layers"):
        ps.recall(sel, prompts=S, layers=[12])
    with pytest.raises(ps.PhasescopeError, match="--mode: a prompt set is run as given"):
        ps.recall(sel, prompts=S, mode="move")
    full = ps.load(model_path("data/models/deep_w8s8"))
    with pytest.raises(ps.PhasescopeError, match="selects no blocks"):
        ps.recall(full, prompts=S)
    full.close()
    f = tmp_path / "bad.jsonl"
    recs = S.records()
    del recs[1]["needle"]
    f.write_text("\n".join(json.dumps(x) for x in recs) + "\n")
    p = subprocess.run([CLI, "recall", "--model", model_path(SELECT), "--prompts", str(f)], capture_output=True, text=True)
    assert p.returncode != 0 and 'line 2: key "needle" missing' in p.stderr, p.stderr

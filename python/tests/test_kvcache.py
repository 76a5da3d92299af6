"""The KV cache from Python (model.kv_cache(), model.generate()) against the whole-sequence forward
(run_with_hooks): a prefill in two chunks and single-token decode steps give its logits at those
positions; an entry equals the forward's hook_ck; a mean ("set") edit changes the next logits and a zero
edit reads back zeros; fwd_hooks during an append equal the forward's; greedy generate equals an argmax
loop over run_with_hooks on the growing sequence, and with an edit the CLI's `generate --edit`; several prompts
sampled with mean and set edits equal the CLI's `generate` with the same options (a set edit equals a
KVCache loop with .edit); progress and its cancel; bad arguments."""
import json

import numpy as np
import pytest

import phasescope as ps
from conftest import cli, model_path, tokens

CK = "blocks.0.attn.cache_ck"
TOL = 1e-4


@pytest.fixture(scope="module")
def toks(w8s8):
    return tokens(1, 22, w8s8.vocab_size, salt=5)[0]


def test_prefill_decode_equal_forward(w8s8, toks):
    ref = w8s8.run_with_hooks(toks[None])[0]
    with w8s8.kv_cache() as kv:
        s = kv.add()
        rows = [kv.append(s, toks[:10]), kv.append(s, toks[10:19])]
        rows += [kv.append(s, toks[t:t + 1]) for t in range(19, 22)]
        got = np.concatenate(rows)
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() < TOL
        assert kv.len(s) == 22 and kv.nbytes > 0
        # an entry against the forward's compressed keys as attended
        _, cache = w8s8.run_with_cache(toks[None], names=["blocks.0.attn.hook_ck"])
        ck = cache["blocks.0.attn.hook_ck"][0]  # [nW, n_kv, hd]
        assert kv.n_entries(s, 0, 2) == ck.shape[0] == 2
        assert np.abs(kv.entry(s, CK, 2, 1) - ck[1, 2]).max() < 1e-5
        # fork and truncate
        f = kv.fork(s)
        kv.truncate(f, 21)
        assert kv.len(f) == 21 and kv.len(s) == 22
        assert np.abs(kv.append(f, toks[21:]) - ref[21:]).max() < TOL


def test_edits(w8s8, toks):
    with w8s8.kv_cache() as kv:
        s = kv.add()
        kv.append(s, toks[:20])
        f = kv.fork(s)
        g = kv.fork(s)
        n = kv.n_entries(s, 0, 4)
        mean = np.mean([kv.entry(s, CK, 4, j) for j in range(n)], axis=0)
        kv.edit(CK, 4, 0, mean, seq=s)  # mean replacement of entry 0 of head 4
        assert np.array_equal(kv.entry(s, CK, 4, 0), mean.astype(np.float32))
        kv.edit(CK, 4, 1, seq=g)  # zero
        assert not kv.entry(g, CK, 4, 1).any() and kv.entry(f, CK, 4, 1).any()
        nxt = toks[20:21]
        a, b, c = kv.append(s, nxt), kv.append(f, nxt), kv.append(g, nxt)
        assert np.abs(a - b).max() > TOL and np.abs(c - b).max() > TOL
        with pytest.raises(ps.PhasescopeError, match="cache_zz"):
            kv.entry(s, "blocks.0.attn.cache_zz", 0, 0)
        with pytest.raises(ps.PhasescopeError, match="head 99"):
            kv.edit(CK, 99, 0)
        with pytest.raises(ps.PhasescopeError, match="sequence 42"):
            kv.append(42, nxt)


def test_hooks_during_append(w8s8, toks):
    hooks = [("blocks.0.attn.hook_z", ps.actions.zero(head=1))]
    ref = w8s8.run_with_hooks(toks[None], fwd_hooks=hooks)[0]
    seen = []

    def watch(a, name):
        seen.append(a.shape)

    with w8s8.kv_cache() as kv:
        s = kv.add()
        got = kv.append(s, toks, fwd_hooks=hooks + [("blocks.0.hook_resid_pre", watch)])
    assert np.abs(got - ref).max() < TOL
    assert seen == [(1, len(toks), w8s8.cfg["d_model"])]


def test_generate_greedy(w8s8, toks):
    prompt = list(toks[:9])
    new, lps = w8s8.generate(prompt, max_tokens=4)
    seq = list(prompt)
    for _ in range(4):
        row = w8s8.run_with_hooks([seq])[0, -1].astype(np.float64)
        seq.append(int(np.argmax(row)))
    assert new == seq[9:]
    assert len(lps) == 4 and all(lp <= 0 for lp in lps)
    # an edit changes what is generated from (or at least the log-probabilities)
    new2, lps2 = w8s8.generate(prompt, max_tokens=4, edits=[(CK, h, 0) for h in range(16)])
    assert new2 != new or not np.allclose(lps2, lps)


def test_generate_equals_cli(w8s8, toks, tmp_path):
    """model.generate with a zero edit against `phasescope generate --edit` (core/generate.c)."""
    prompt = [int(t) for t in toks[:19]]
    (tmp_path / "t.json").write_text(json.dumps([prompt]))
    cli("generate", "--model", model_path("data/models/w8s8"), "--tokens", tmp_path / "t.json", "--max-tokens", 6,
        "--edit", f"{CK}:3:0:zero", "--out", tmp_path / "out")
    ref = json.loads((tmp_path / "out" / "generate.json").read_text())["sequences"][0]
    new, lps = w8s8.generate(prompt, max_tokens=6, edits=[(CK, 3, 0)])
    assert new == ref["tokens"]
    assert np.abs(np.array(lps) - np.array(ref["logprobs"])).max() < 1e-5


def test_generate_batch_sampled_equals_cli(w8s8, tmp_path):
    """Three prompts of different lengths, sampled with a seed and a mean edit: the CLI's generate (one
    code path, core/generate.c: the same tokens, log-probabilities bit for bit through JSON's doubles)."""
    prompts = [[int(t) for t in tokens(1, n, w8s8.vocab_size, salt=n)[0]] for n in (11, 17, 6)]
    (tmp_path / "t.json").write_text(json.dumps(prompts))
    cli("generate", "--model", model_path("data/models/w8s8"), "--tokens", tmp_path / "t.json", "--max-tokens", 7,
        "--temperature", 1.2, "--top-p", 0.9, "--seed", 4, "--edit", f"{CK}:1:0:mean", "--out", tmp_path / "out")
    ref = json.loads((tmp_path / "out" / "generate.json").read_text())["sequences"]
    new, lps = w8s8.generate(prompts, max_tokens=7, temperature=1.2, top_p=0.9, seed=4, edits=[(CK, 1, 0, "mean")])
    assert new == [r["tokens"] for r in ref]
    assert [np.abs(np.array(a) - np.array(r["logprobs"])).max() for a, r in zip(lps, ref)] == [0, 0, 0]
    # a 2-d array of prompts is a list of them
    two, two_lps = w8s8.generate(np.array([prompts[0], prompts[0]]), max_tokens=7)
    assert len(two) == 2 and two[0] == two[1] and two_lps[0] == two_lps[1] and len(two[0]) == 7


def test_generate_set_edit_equals_cache_loop(w8s8, toks):
    """A (name, head, j, value) edit equals a KVCache prefill of all but the last token, .edit(value), the last
    token and a greedy append loop: the edit holds from the first generated token on."""
    prompt = toks[:13]
    vec = np.linspace(3, -3, w8s8.kv_cache().width(CK), dtype=np.float32)
    new, lps = w8s8.generate(prompt, max_tokens=5, edits=[(CK, 4, 0, vec)])
    with w8s8.kv_cache() as kv:
        s = kv.add()
        kv.append(s, prompt[:-1])
        kv.edit(CK, 4, 0, vec)
        row = kv.append(s, prompt[-1:])[-1]
        ref, ref_lp = [], []
        for t in range(5):
            k = int(np.argmax(row))
            x = row.astype(np.float64)
            ref.append(k)
            ref_lp.append(float(x[k] - x.max() - np.log(np.exp(x - x.max()).sum())))
            if t < 4:
                row = kv.append(s, [k])[-1]
    assert new == ref
    assert np.abs(np.array(lps) - np.array(ref_lp)).max() < 1e-6
    plain, plain_lps = w8s8.generate(prompt, max_tokens=5)
    assert abs(plain_lps[0] - lps[0]) > 1e-4  # the edit mattered, from the first token on


def test_generate_progress_and_errors(w8s8, toks):
    seen = []
    w8s8.generate(toks[:9], max_tokens=4, progress=lambda d, n: seen.append((d, n)))
    assert seen == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
    with pytest.raises(ps.Cancelled, match="cancelled after 2 of 4 tokens"):
        w8s8.generate(toks[:9], max_tokens=4, progress=lambda d, n: d >= 2)
    for kw, msg in [(dict(edits=[("blocks.0.attn.cache_zz", 0, 0)]), "cache_zz"),
                    (dict(edits=[(CK, 0, 0, "half")]), "half"),
                    (dict(edits=[(CK, 0, 0, np.zeros(3))]), "3 numbers"),
                    (dict(temperature=-1), "temperature"),
                    (dict(top_p=0), "top_p"),
                    (dict(max_tokens=-2), "max_tokens")]:
        with pytest.raises(ps.PhasescopeError, match=msg):
            w8s8.generate(toks[:9], **{"max_tokens": 3, **kw})
    with pytest.raises(ps.PhasescopeError, match="prompt 1"):
        w8s8.generate([list(toks[:4]), []], max_tokens=2)
    # stop: the sequence ends at the first stop token it generates, the token kept
    full, _ = w8s8.generate(toks[:9], max_tokens=6)
    cut, _ = w8s8.generate(toks[:9], max_tokens=6, stop=[full[1]])
    assert cut == full[:full.index(full[1]) + 1]
    with pytest.raises(ps.PhasescopeError, match="stop"):
        w8s8.generate(toks[:9], max_tokens=2, stop=[w8s8.vocab_size])
    assert w8s8.generate(toks[:9], max_tokens=2)[0] == w8s8.generate(toks[:9], max_tokens=2)[0]  # usable after


def test_generate_text_equals_cli(tmp_path):
    """A text prompt through model.tokenizer equals the CLI's generate --prompt (tokens, text, log-probabilities)."""
    tt = model_path("tests/text/tiny_tokenizer.json")
    cli("init", "--config", model_path("tests/text/tiny_model.json"), "--out", tmp_path / "tm", "--seed", 2)
    cli("generate", "--model", tmp_path / "tm", "--tokenizer", tt, "--prompt", "the cat sat on", "--max-tokens", 5,
        "--temperature", 0.9, "--seed", 3, "--out", tmp_path / "g")
    ref = json.loads((tmp_path / "g" / "generate.json").read_text())["sequences"][0]
    m = ps.load(str(tmp_path / "tm"), tokenizer=tt)
    try:
        text, lps = m.generate("the cat sat on", max_tokens=5, temperature=0.9, seed=3)
        assert text == ref["text"] and np.abs(np.array(lps) - np.array(ref["logprobs"])).max() == 0
        texts, _ = m.generate(["the cat sat on", "a dog"], max_tokens=3)
        assert len(texts) == 2 and all(isinstance(t, str) for t in texts)
    finally:
        m.close()
    with pytest.raises(ps.PhasescopeError, match="needs a tokenizer"):
        ps.load(model_path("data/models/w8s8")).generate("the cat", max_tokens=2)


def test_generate_qwen3_equals_forward_argmax():
    """A Hugging Face Qwen3 checkpoint (tests/conformance/qwen3_published: q/k norms, GQA, tied embeddings)
    decodes through the cache as an argmax loop over the whole forward says, log-probabilities within 1e-4."""
    m = ps.load(model_path("tests/conformance/qwen3_published"))
    try:
        prompt = [int(t) for t in tokens(1, 11, m.vocab_size, salt=3)[0]]
        new, lps = m.generate(prompt, max_tokens=5)
        seq = list(prompt)
        for k, lp in zip(new, lps):
            row = m.run_with_hooks([seq])[0, -1].astype(np.float64)
            assert k == int(np.argmax(row))
            assert abs(lp - (row[k] - row.max() - np.log(np.exp(row - row.max()).sum()))) < 1e-4
            seq.append(k)
        assert len(new) == 5
    finally:
        m.close()


def test_model_close_frees_its_caches(toks):
    m = ps.load(model_path("data/models/w8s8"))
    kv = m.kv_cache()
    s = kv.add()
    kv.append(s, toks[:5])
    m.close()
    with pytest.raises(ps.PhasescopeError, match="freed"):
        kv.append(s, toks[5:6])
    kv.free()  # again: nothing


def test_select_model_cache_and_generate(tmp_path):
    """A select-attention model (experiments/configs/demo/select.json's shape, random weights): a prefill in two
    chunks and single-token decode steps give the whole forward's logits, a fork truncated into a window grows
    like its own forward, and greedy generate equals an argmax loop over run_with_hooks; the cache has no entries."""
    cli("init", "--config", model_path("experiments/configs/demo/select.json"), "--out", tmp_path / "sel", "--seed", 5)
    m = ps.load(str(tmp_path / "sel"))
    try:
        toks = tokens(1, 70, m.vocab_size, salt=3)[0]
        ref = m.run_with_hooks(toks[None])[0]
        with m.kv_cache() as kv:
            s = kv.add()
            rows = [kv.append(s, toks[:27]), kv.append(s, toks[27:50])]
            rows += [kv.append(s, toks[t:t + 1]) for t in range(50, 70)]
            assert np.abs(np.concatenate(rows) - ref).max() < TOL
            f = kv.fork(s)
            kv.truncate(f, 41)
            other = tokens(1, 20, m.vocab_size, salt=9)[0]
            ref2 = m.run_with_hooks(np.concatenate([toks[:41], other])[None])[0]
            got = np.concatenate([kv.append(f, other[:7])] + [kv.append(f, other[t:t + 1]) for t in range(7, 20)])
            assert np.abs(got - ref2[41:]).max() < TOL
            with pytest.raises(ps.PhasescopeError, match="not a KV cache point"):
                kv.entry(s, CK, 0, 0)
        prompt = list(toks[:30])
        new, _ = m.generate(prompt, max_tokens=12)
        seq = list(prompt)
        for _ in range(12):
            seq.append(int(np.argmax(m.run_with_hooks([seq])[0, -1].astype(np.float64))))
        assert new == seq[30:]
    finally:
        m.close()

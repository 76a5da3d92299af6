"""run_with_cache against `phasescope forward --hooks` (another process, the CLI's own path), bit for bit,
at every point of each checkpoint's table: the controlled kinds (compressed deep and shallow, full
attention, staggered grids, a text model), a Hugging Face Qwen3 checkpoint as published (sharded BF16),
and the DeepSeek-V4 conformance checkpoints. Also: the table itself (hook_points, hook_names, shapes), the
batch against single sequences, and arrays that stay valid after later calls."""
import json
import os

import numpy as np
import pytest

import phasescope as ps
from conftest import bits_equal, cli, model_path, read_safetensors, tokens

MODELS = [
    ("data/models/deep_w8s8", 40),
    ("data/models/w8s8", 33),
    ("data/models/full", 33),
    ("data/models/w8s8_staggered", 37),
    ("data/models/text_w8s8", 30),
    ("tests/conformance/qwen3_published", 24),
    ("tests/conformance/v4/mix4", 24),
    ("tests/conformance/v4/hub3", 20),
]


@pytest.mark.parametrize("rel,T", MODELS, ids=[os.path.basename(m) for m, _ in MODELS])
def test_cache_equals_cli_forward(rel, T, tmp_path):
    path = model_path(rel)
    with ps.load(path) as m:
        toks = tokens(2, T, m.vocab_size)
        names = m.hook_names
        assert names, f"{rel}: no hook names"
        tp, op = tmp_path / "tokens.json", tmp_path / "fwd.safetensors"
        tp.write_text(json.dumps(toks.tolist()))
        # a point named "logits" (DeepSeek-V4) is written by forward under the logits' own name
        # ("logits.B" twice: forward refuses it as a duplicate), so it is compared with the logits
        cli_names = [n for n in names if n != "logits"]
        cli("forward", "--model", path, "--tokens", tp, "--out", op, "--hooks", ",".join(cli_names))
        ref = read_safetensors(op)
        for b in range(2):  # forward runs each sequence on its own: one at a time here too
            logits, cache = m.run_with_cache(toks[b:b + 1])
            assert logits.dtype == np.float32 and logits.shape == (1, T, m.vocab_size)
            assert bits_equal(logits[0], ref[f"logits.{b}"]), f"{rel}: logits of sequence {b}"
            assert list(cache) == names, f"{rel}: the cache's names are not the table's, in firing order"
            for n in names:
                assert cache[n].shape == m.hook_shape(n, 1, T), f"{rel}: {n} shape against the table"
                want = ref[f"logits.{b}"] if n == "logits" else ref[f"{n}.{b}"]
                assert bits_equal(cache[n][0], want), f"{rel}: {n} of sequence {b} differs from forward's"


def test_table(deep):
    assert deep.family == "phasescope" and deep.n_layers == 12 and deep.vocab_size == 96
    assert deep.cfg["d_model"] > 0
    pts = {p["name"]: p for p in deep.hook_points}
    assert set(pts) >= {"blocks.{L}.hook_resid_pre", "blocks.{L}.attn.hook_ck", "blocks.{L}.attn.hook_gate_k"}
    for p in deep.hook_points:
        assert set(p) >= {"name", "shape", "head_axis", "layers", "what"}
    ck = pts["blocks.{L}.attn.hook_ck"]
    assert ck["head_axis"] == 2 and ck["layer_list"] == list(range(12))
    # every concrete name is a pattern of the table at one of its layers
    for n in deep.hook_names:
        parts = n.split(".")
        pat = ".".join("{L}" if p.isdigit() else p for p in parts)
        assert pat in pts and int(parts[1]) in pts[pat]["layer_list"], n
    # shapes by the table's formulas: nW = (T - W) / S + 1 windows
    W, S = deep.cfg["attention"]["window"], deep.cfg["attention"]["stride"]
    T = 40
    nW = (T - W) // S + 1
    d = deep.cfg["d_model"]
    assert deep.hook_shape("blocks.3.hook_resid_pre", 2, T) == (2, T, d)
    assert deep.hook_shape("blocks.3.attn.hook_ck", 2, T)[:2] == (2, nW)
    assert deep.hook_shape("blocks.3.attn.hook_pattern", 2, T)[3] == nW + T


def test_batch_equals_single(deep):
    toks = tokens(3, 40, deep.vocab_size, salt=1)
    names = ["blocks.10.attn.hook_ck", "blocks.11.hook_resid_post"]
    lb, cb = deep.run_with_cache(toks, names=names)

    def close(a, b):  # a batch's GEMMs sum in another order than one sequence's: float32 rounding only
        return np.abs(a - b).max() <= 1e-3 * np.abs(b).max()

    for b in range(3):
        l1, c1 = deep.run_with_cache(toks[b:b + 1], names=names)
        assert close(lb[b], l1[0]), f"logits of sequence {b}"
        for n in names:
            assert close(cb[n][b], c1[n][0]), f"{n} of sequence {b}"
    # and a batch of one is the single sequence, bit for bit
    l1, _ = deep.run_with_cache(toks[1:2], names=names)
    assert bits_equal(deep(toks[1:2]), l1)


def test_names_filters(deep):
    toks = tokens(1, 24, deep.vocab_size)
    _, all_ = deep.run_with_cache(toks)
    _, by_list = deep.run_with_cache(toks, names=["blocks.2.attn.hook_cv", "blocks.0.hook_mlp_out"])
    _, by_pred = deep.run_with_cache(toks, names=lambda n: n.endswith("hook_ck"))
    _, by_str = deep.run_with_cache(toks, names="blocks.2.attn.hook_cv")
    assert set(by_list) == {"blocks.2.attn.hook_cv", "blocks.0.hook_mlp_out"}
    assert list(by_pred) == [f"blocks.{l}.attn.hook_ck" for l in range(12)]
    assert list(by_str) == ["blocks.2.attn.hook_cv"]
    for c in (by_list, by_pred, by_str):
        for n, a in c.items():
            assert bits_equal(a, all_[n]), n


def test_arrays_stay_valid(deep):
    toks = tokens(2, 40, deep.vocab_size)
    logits, cache = deep.run_with_cache(toks, names=["blocks.5.attn.hook_cv"])
    keep_l, keep_c = logits.copy(), cache["blocks.5.attn.hook_cv"].copy()
    cv = cache["blocks.5.attn.hook_cv"]
    del cache  # the array alone keeps the C output alive
    for i in range(20):  # later calls, with other shapes, never move or change it
        deep.run_with_cache(tokens(1 + i % 3, 16 + i, deep.vocab_size, salt=i))
        deep.run_with_hooks(toks, [("blocks.5.attn.hook_cv", ps.actions.zero())])
    assert bits_equal(logits, keep_l) and bits_equal(cv, keep_c)


def test_tokens_forms(w8s8):
    toks = tokens(2, 16, w8s8.vocab_size)
    ref = w8s8(toks)
    assert bits_equal(w8s8(toks.tolist()), ref)
    assert bits_equal(w8s8(toks.astype(np.int64)), ref)
    one = w8s8(toks[0])  # a single sequence is [1, T]
    assert one.shape == (1, 16, w8s8.vocab_size) and bits_equal(one[0], w8s8(toks[:1])[0])

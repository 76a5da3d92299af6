"""Every error raises ps.PhasescopeError with the C message (naming what is at fault), and the model stays
usable after each: the logits of a clean run are the same bits before and after."""
import os
import shutil

import numpy as np
import pytest

import phasescope as ps
from conftest import bits_equal, model_path, tokens


def test_missing_and_corrupt_checkpoints(tmp_path):
    with pytest.raises(ps.PhasescopeError, match="no such directory") as ei:
        ps.load(tmp_path / "absent")
    assert ei.value.code == 2
    bad = tmp_path / "corrupt"
    bad.mkdir()
    shutil.copy(model_path("data/models/w8s8/config.json"), bad)
    with open(model_path("data/models/w8s8/model.safetensors"), "rb") as f:
        (bad / "model.safetensors").write_bytes(f.read(1000))
    with pytest.raises(ps.PhasescopeError, match="model.safetensors"):
        ps.load(bad)
    (bad / "model.safetensors").unlink()
    with pytest.raises(ps.PhasescopeError, match="safetensors"):
        ps.load(bad)
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ps.PhasescopeError, match="config.json"):
        ps.load(bad)
    with pytest.raises(ps.PhasescopeError, match="device tpu"):
        ps.load(model_path("data/models/w8s8"), device="tpu")
    with pytest.raises(ps.PhasescopeError, match="tok.json: cannot open"):
        ps.load(model_path("data/models/w8s8"), tokenizer=tmp_path / "tok.json")


@pytest.fixture
def m(w8s8):
    clean_toks = tokens(2, 20, w8s8.vocab_size)
    clean = w8s8(clean_toks)
    yield w8s8
    assert bits_equal(w8s8(clean_toks), clean), "the model changed after an error"


def raises(match, f, code=None):
    with pytest.raises(ps.PhasescopeError, match=match) as ei:
        f()
    if code is not None:
        assert ei.value.code == code
    return str(ei.value)


def test_bad_tokens(m):
    V = m.vocab_size
    raises(r"token 96 at sequence 0, position 2 is outside the vocabulary \[0, 96\)", lambda: m([[1, 2, V]]), 2)
    raises(r"token -1 at sequence 1, position 1 is outside the vocabulary", lambda: m([[1, 2], [1, -1]]), 2)
    raises(r"more than max_seq_len 96 by 1", lambda: m(np.zeros((1, m.n_ctx + 1), int)), 2)
    raises("equal-length", lambda: m([[1, 2], [3]]))
    raises("dtype float64", lambda: m([[1.5, 2.0]]))
    raises("int32 range", lambda: m([[2 ** 40]]))
    raises(r"B, T >= 1", lambda: m(np.zeros((1, 0), int)))
    raises(r"targets: shape", lambda: m.run_with_cache([[1, 2, 3]], names=["blocks.0.attn.hook_z"], grads=True,
                                                        targets=[[1, 2]]))


def test_bad_hook_names(m):
    msg = raises(r'hook "blocks.0.attn.hook_zz": unknown hook name; valid hooks', lambda: m.run_with_hooks(
        [[1, 2, 3]], [("blocks.0.attn.hook_zz", ps.actions.zero())]), 2)
    assert "blocks.{l}.attn.hook_ck" in msg, "the message does not list the valid names"
    raises(r"layer 5 out of range \(the model has 1 layers\); valid hooks",
           lambda: m.run_with_cache([[1, 2, 3]], names=["blocks.5.attn.hook_z"]))
    raises("unknown hook name", lambda: m.run_with_hooks([[1, 2, 3]], [("nope", lambda a, n: None)]))
    raises("unknown hook name", lambda: m.hook_shape("nope"))
    raises("each entry is", lambda: m.run_with_hooks([[1, 2, 3]], ["blocks.0.attn.hook_z"]))
    raises("a function fn", lambda: m.run_with_hooks([[1, 2, 3]], [("blocks.0.attn.hook_z", 3)]))


def test_empty_names_cache_nothing(m):
    """names=[] (TransformerLens's empty names_filter) is no error: nothing cached, the plain forward's
    logits; with grads, the loss and no gradients."""
    toks = tokens(2, 12, m.vocab_size, salt=5)
    plain = m(toks)
    for empty in ([], (), set()):
        logits, cache = m.run_with_cache(toks, names=empty)
        assert isinstance(cache, ps.ActivationCache) and len(cache) == 0, (empty, cache)
        assert bits_equal(logits, plain), f"names={empty!r}: the logits differ from model(tokens)"
    logits, cache, grads = m.run_with_cache(toks, names=[], grads=True)
    _, _, ref = m.run_with_cache(toks, names=["blocks.0.attn.hook_z"], grads=True)
    assert bits_equal(logits, plain) and len(cache) == 0 and len(grads) == 0
    assert grads.loss == ref.loss and grads.n_targets == ref.n_targets == 2 * 11


def test_bad_hook_results(m):
    Z = "blocks.0.attn.hook_z"
    raises(r"hook blocks.0.attn.hook_z: returned shape \[1, 2, 16, 16\], the activation's is \[2, 2, 16, 16\]",
           lambda: m.run_with_hooks([[1, 2], [3, 4]], [(Z, lambda a, n: a[:1])]), 1)
    raises(r"hook blocks.0.attn.hook_z: returned dtype float64",
           lambda: m.run_with_hooks([[1, 2, 3]], [(Z, lambda a, n: a.astype(np.float64))]), 1)
    raises(r"returned int, not a numpy array", lambda: m.run_with_hooks([[1, 2, 3]], [(Z, lambda a, n: 3)]), 1)


def test_bad_actions(m):
    Z = "blocks.0.attn.hook_z"
    raises("zero action on head 99: out of range", lambda: m.run_with_hooks([[1, 2, 3]], [(Z, ps.actions.zero(head=99))]))
    raises("the source is", lambda: m.run_with_hooks([[1, 2, 3]], [(Z, ps.actions.set(np.zeros(5)))]))
    raises("empty or negative range", lambda: ps.actions.zero(positions=(4, 2)))
    raises("head=-3", lambda: ps.actions.zero(head=-3))


def test_bad_requests(m):
    raises(r'unknown flag --bogus of sweep', lambda: ps.sweep(m, bogus=1), 2)
    raises(r"--n abc: not an integer", lambda: ps.sweep(m, n="abc"), 2)
    raises(r"nothing: not an instrument \(the instruments: .*knockout", lambda: ps.run("nothing", m), 2)
    raises(r"--layers 7: 7 is out of range", lambda: ps.knockout(m, layers=[7]), 2)
    raises(r"a flag's value", lambda: ps.sweep(m, n=object()))
    raises(r"no such directory", lambda: ps.sweep(model_path("data/models/absent"), n=8))


def test_closed_model():
    m = ps.load(model_path("data/models/w8s8"))
    m.close()
    m.close()  # twice is fine
    raises("the model is closed", lambda: m([[1, 2]]))

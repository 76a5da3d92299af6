"""Python hook functions against the backend-side actions (ps.actions), bit for bit: a function that zeros
a head equals zero(head=...), one that adds a vector equals add(...), set, mean_replace (the mean taken
here in double, in order), patch (from another run's cache), with head / positions / seqs ranges; edits
in place and returned replacements; hooks firing in order; the cache after the hooks; exceptions."""
import numpy as np
import pytest

import phasescope as ps
from conftest import bits_equal, tokens

CK = "blocks.10.attn.hook_ck"
Z = "blocks.11.attn.hook_z"
RES = "blocks.6.hook_resid_pre"


@pytest.fixture(scope="module")
def toks(deep):
    return tokens(3, 40, deep.vocab_size, salt=2)


def run(m, toks, hooks):
    return m.run_with_hooks(toks, fwd_hooks=hooks)


def test_zero_head(deep, toks):
    clean = deep(toks)

    def fn(a, name):
        assert name == CK
        a[:, :, 3] = 0

    a = run(deep, toks, [(CK, fn)])
    b = run(deep, toks, [(CK, ps.actions.zero(head=3))])
    assert bits_equal(a, b)
    assert not bits_equal(a, clean), "zeroing layer 10's compressed keys of head 3 changed nothing"


def test_zero_ranges(deep, toks):
    def fn(a, name):
        a[1:3, 2:4, 0] = 0

    a = run(deep, toks, [(CK, fn)])
    b = run(deep, toks, [(CK, ps.actions.zero(head=0, positions=(2, 4), seqs=slice(1, 3)))])
    assert bits_equal(a, b)

    def fn2(a, name):
        a[:, 5] = 0

    assert bits_equal(run(deep, toks, [(Z, fn2)]), run(deep, toks, [(Z, ps.actions.zero(positions=5))]))


def test_add_and_set(deep, toks):
    rng = np.random.default_rng(0)
    shape = deep.hook_shape(Z, 3, 40)  # [B, T, n_heads, hd]
    v = rng.standard_normal(shape[2:]).astype(np.float32)  # one position's values, every head

    def add(a, name):
        a[:, :, 2] += np.float32(0.5) * v[2]

    assert bits_equal(run(deep, toks, [(Z, add)]), run(deep, toks, [(Z, ps.actions.add(v, scale=0.5, head=2))]))
    per_pos = rng.standard_normal((40,) + shape[2:]).astype(np.float32)  # [npos, n_heads, hd], by position

    def setf(a, name):
        a[:, 20:30] = per_pos[20:30]

    assert bits_equal(run(deep, toks, [(Z, setf)]), run(deep, toks, [(Z, ps.actions.set(per_pos, positions=(20, 30)))]))


def test_mean_replace(deep, toks):
    other = tokens(4, 40, deep.vocab_size, salt=5)
    _, cache = deep.run_with_cache(other, names=[RES])
    src = cache[RES]  # [S, T, d]
    acc = src[0].astype(np.float64)
    for s in range(1, src.shape[0]):  # in order, in double
        acc = acc + src[s]
    mean = (acc / src.shape[0]).astype(np.float32)

    def fn(a, name):
        a[:] = mean

    a = run(deep, toks, [(RES, fn)])
    b = run(deep, toks, [(RES, ps.actions.mean_replace(src))])
    c = run(deep, toks, [(RES, ps.actions.set(mean))])  # mean [T, d]: per position
    assert bits_equal(a, b) and bits_equal(b, c)


def test_patch(deep, toks):
    other = tokens(3, 40, deep.vocab_size, salt=7)
    lo, cache = deep.run_with_cache(other, names=[CK])
    src = cache[CK]

    def fn(a, name):
        a[:, :, 1] = src[:, :, 1]

    a = run(deep, toks, [(CK, fn)])
    b = run(deep, toks, [(CK, ps.actions.patch(src, head=1))])
    assert bits_equal(a, b)
    # patching every point a sequence's logits depend on... at the last layer's resid_post gives its logits
    _, c2 = deep.run_with_cache(other, names=["blocks.11.hook_resid_post"])
    p = run(deep, toks, [("blocks.11.hook_resid_post", ps.actions.patch(c2["blocks.11.hook_resid_post"]))])
    assert bits_equal(p, lo)


def test_replacement_equals_in_place(deep, toks):
    def inplace(a, name):
        a *= np.float32(0.5)

    def replace(a, name):
        return a * np.float32(0.5)

    assert bits_equal(run(deep, toks, [(Z, inplace)]), run(deep, toks, [(Z, replace)]))


def test_order_and_cache_after_hooks(deep, toks):
    seen = []

    def after_zero(a, name):
        seen.append(float(np.abs(a[:, :, 3]).max()))
        a[:, :, 3] += 1

    logits, cache = deep.run_with_cache(toks, names=[CK], fwd_hooks=[(CK, ps.actions.zero(head=3)), (CK, after_zero)])
    assert seen == [0.0], "the function did not see the action's zeros"
    assert np.all(cache[CK][:, :, 3] == 1), "the cache is not the value after the hooks"
    # predicate names: every layer's hook_ck gets the function
    hits = []
    deep.run_with_hooks(toks, [(lambda n: n.endswith("hook_ck"), lambda a, n: hits.append(n))])
    assert hits == [f"blocks.{l}.attn.hook_ck" for l in range(12)]


def test_hook_may_keep_its_array(deep, toks):
    kept = {}

    def keep(a, name):
        kept[name] = a

    deep.run_with_hooks(toks, [(CK, keep)])
    _, cache = deep.run_with_cache(toks, names=[CK])
    for _ in range(3):
        deep(tokens(2, 50, deep.vocab_size))
    assert bits_equal(kept[CK], cache[CK])


class Boom(Exception):
    pass


def test_exception_reaches_caller(deep, toks):
    clean = deep(toks)
    calls = []

    def bad(a, name):
        calls.append(name)
        raise Boom("no")

    with pytest.raises(Boom, match="no") as ei:
        deep.run_with_hooks(toks, [(lambda n: n.endswith("hook_z"), bad)])
    assert calls == ["blocks.0.attn.hook_z"], "the pass went on after the exception"
    assert any("hook blocks.0.attn.hook_z" in n for n in ei.value.__notes__)
    assert bits_equal(deep(toks), clean), "the model changed after an aborted pass"
    with pytest.raises(KeyboardInterrupt):
        deep.run_with_hooks(toks, [(CK, lambda a, n: (_ for _ in ()).throw(KeyboardInterrupt()))])
    assert bits_equal(deep(toks), clean)

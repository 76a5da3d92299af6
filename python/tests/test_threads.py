"""Threads: a C call releases the GIL (another Python thread runs meanwhile), hook functions run in the
calling thread with the GIL back, and two models used from two threads at once give the bits each gives
alone (the library keeps no global mutable state)."""
import threading

import numpy as np
import pytest

import phasescope as ps
from conftest import bits_equal, model_path, tokens


def test_gil_released_during_a_run(deep):
    toks = tokens(4, 90, deep.vocab_size)
    done = threading.Event()

    def work():
        for _ in range(3):
            deep.run_with_cache(toks)
        done.set()

    t = threading.Thread(target=work)
    ticks = 0
    t.start()
    while not done.is_set():
        ticks += 1  # runs only while the worker is inside C without the GIL
    t.join()
    assert ticks > 1000, f"the main thread ran {ticks} times while 3 forwards ran: the GIL was held"


def test_two_models_in_two_threads():
    a = ps.load(model_path("data/models/deep_w8s8"))
    b = ps.load(model_path("tests/conformance/v4/mix4"))
    ta, tb = tokens(2, 48, a.vocab_size), tokens(1, 24, b.vocab_size)
    ref_a = a.run_with_hooks(ta, [("blocks.10.attn.hook_ck", ps.actions.zero(head=6))])
    ref_b, cb = b.run_with_cache(tb, names=["layers.1.attn.kv"])
    out, errs = {}, []
    seen = []

    def run_a():
        try:
            for i in range(5):
                out[("a", i)] = a.run_with_hooks(ta, [("blocks.10.attn.hook_ck", ps.actions.zero(head=6)),
                                                     ("blocks.10.attn.hook_z", lambda x, n: seen.append(threading.get_ident()))])
        except BaseException as e:
            errs.append(e)

    def run_b():
        try:
            for i in range(5):
                out[("b", i)] = b.run_with_cache(tb, names=["layers.1.attn.kv"])
        except BaseException as e:
            errs.append(e)

    ts = [threading.Thread(target=run_a), threading.Thread(target=run_b)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs, errs
    assert len(set(seen)) == 1 and seen[0] == ts[0].ident, "a hook ran outside the thread that called"
    for i in range(5):
        assert bits_equal(out[("a", i)], ref_a)
        lg, c = out[("b", i)]
        assert bits_equal(lg, ref_b) and bits_equal(c["layers.1.attn.kv"], cb["layers.1.attn.kv"])
    a.close()
    b.close()


def test_reentrant_and_concurrent_calls_are_refused(w8s8):
    toks = tokens(1, 16, w8s8.vocab_size)
    clean = w8s8(toks)

    def calls_itself(a, name):
        w8s8(toks)

    with pytest.raises(ps.PhasescopeError, match="already running"):
        w8s8.run_with_hooks(toks, [("blocks.0.attn.hook_z", calls_itself)])
    with pytest.raises(ps.PhasescopeError, match="cannot be closed"):
        w8s8.run_with_hooks(toks, [("blocks.0.attn.hook_z", lambda a, n: w8s8.close())])
    # another thread while a hook holds the model: refused, not a crash
    errs = []

    def other_thread(a, name):
        t = threading.Thread(target=lambda: errs.append(pytest.raises(ps.PhasescopeError, w8s8, toks)))
        t.start()
        t.join()

    w8s8.run_with_hooks(toks, [("blocks.0.attn.hook_z", other_thread)])
    assert errs and "already running" in str(errs[0].value)
    assert bits_equal(w8s8(toks), clean)

"""No leak over 1,000 calls: the resident set size after 1,000 calls (in turn: run_with_cache of every
point, run_with_hooks with a Python function and actions, a hook raising, a bad token, gradients) and
20 load/close stays within 16 MiB of the size after a warm-up, where leaking the 200 caches alone would
grow it by about 100 MiB (printed: the per-call cache size and the growth)."""
import gc

import numpy as np
import pytest

import phasescope as ps
from conftest import model_path, tokens


def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    pytest.skip("no /proc/self/status")


def call(m, toks, i):
    """One call, of kind i % 5; the bytes a run_with_cache of every point hands out."""
    k = i % 5
    if k == 0:
        logits, cache = m.run_with_cache(toks)
        return sum(a.nbytes for a in cache.values()) + logits.nbytes
    if k == 1:
        m.run_with_hooks(toks, [("blocks.0.attn.hook_z", lambda a, n: a * np.float32(0.5)),
                                ("blocks.0.attn.hook_ck", ps.actions.zero(head=1))])
    elif k == 2:
        try:
            m.run_with_hooks(toks, [("blocks.0.attn.hook_z", lambda a, n: 1 / 0)])
        except ZeroDivisionError:
            pass
    elif k == 3:
        try:
            m([[m.vocab_size]])
        except ps.PhasescopeError:
            pass
    else:
        m.run_with_cache(toks, names=["blocks.0.attn.hook_z"], grads=True)
    return 0


def test_no_leak_over_1000_calls():
    m = ps.load(model_path("data/models/w8s8"))
    toks = tokens(2, 32, m.vocab_size)
    per_call = max(call(m, toks, i) for i in range(50))  # warm-up: allocator pools, first-call caches
    gc.collect()
    before = rss_kb()
    for i in range(1000):
        call(m, toks, i)
    for i in range(20):
        ps.load(model_path("data/models/w8s8")).close()
    gc.collect()
    grown = rss_kb() - before
    print(f"cache per call {per_call / 1024:.0f} KiB; RSS grew {grown} KiB over 1,000 calls + 20 loads")
    # 200 leaked caches alone would be 200 * per_call (about 100 MiB); allow 16 MiB of allocator noise
    assert per_call * 200 / 1024 > 4 * 16 * 1024, "the test is too small to see a leak"
    assert grown < 16 * 1024, f"RSS grew by {grown} KiB"
    m.close()

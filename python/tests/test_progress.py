"""Progress and cancellation (include/phasescope.h, "progress and cancellation"; python/phasescope/progress.py):
progress= sees every unit of an instrument and of a run in order and changes no number; a truthy return
stops the call (ps.Cancelled, saying where) and the model then gives the uninterrupted numbers bit for bit;
Ctrl-C (SIGINT from a timer thread) stops a long sweep and a long run within a couple of seconds with
KeyboardInterrupt, the model usable after; another Python thread runs while an instrument runs (the GIL
is released); train's progress= stops a training run too."""
import json
import os
import signal
import threading
import time

import numpy as np
import pytest

import phasescope as ps
from conftest import ROOT, bits_equal, tokens


def arrays_equal(a, b):
    return a.arrays.keys() == b.arrays.keys() and all(bits_equal(a.arrays[k], b.arrays[k]) for k in a.arrays)


def test_sweep_progress_and_cancel(w8s8):
    ref = ps.sweep(w8s8, n=16, batch=4)
    seen = []
    r = ps.sweep(w8s8, n=16, batch=4, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(k, 32) for k in range(1, 33)], seen  # 8 shifts x 4 batches, each reported in order
    assert arrays_equal(r, ref), "a progress callback changed the sweep"
    with pytest.raises(ps.Cancelled, match="cancelled after 3 of 32 batches") as e:
        ps.sweep(w8s8, n=16, batch=4, progress=lambda d, t: d >= 3)
    assert e.value.code == 3
    assert arrays_equal(ps.sweep(w8s8, n=16, batch=4), ref), "the model after a cancelled sweep gives other numbers"

    def boom(d, t):
        if d == 2:
            raise ValueError("stop here")

    with pytest.raises(ValueError, match="stop here"):
        ps.sweep(w8s8, n=16, batch=4, progress=boom)


@pytest.mark.parametrize("name,flags", [
    ("gates", dict(n=16, batch=4)),
    ("gatecycle", dict(layer=0, shift=2, n=8)),
    ("knockout", dict(n=8, method="atp", verify=1)),
], ids=["gates", "gatecycle", "knockout_atp"])
def test_every_instrument_stops(w8s8, name, flags):
    ref = ps.run(name, w8s8, **flags)
    seen = []
    r = ps.run(name, w8s8, progress=lambda d, t: seen.append((d, t)), **flags)
    assert len(seen) >= 2 and all(0 < d <= t for d, t in seen) and seen[-1][0] == seen[-1][1], seen
    assert arrays_equal(r, ref), f"{name}: a progress callback changed the result"
    with pytest.raises(ps.Cancelled, match=r"cancelled after"):
        ps.run(name, w8s8, progress=lambda d, t: True, **flags)
    assert arrays_equal(ps.run(name, w8s8, **flags), ref), f"{name}: other numbers after a cancelled run"


def test_run_progress_and_cancel(deep):
    toks = tokens(2, 40, deep.vocab_size)
    ref, cref = deep.run_with_cache(toks, names=["blocks.3.attn.hook_ck"])
    seen = []
    lg, c = deep.run_with_cache(toks, names=["blocks.3.attn.hook_ck"], progress=lambda d, t: seen.append((d, t)))
    assert seen == [(k, 12) for k in range(13)], seen  # as each of 12 layers starts, and at the end
    assert bits_equal(lg, ref) and bits_equal(c["blocks.3.attn.hook_ck"], cref["blocks.3.attn.hook_ck"])
    with pytest.raises(ps.Cancelled, match="cancelled after 4 of 12 layers"):
        deep.run_with_hooks(toks, progress=lambda d, t: d == 4)
    assert bits_equal(deep(toks), ref)


def _interrupt_after(seconds):
    t = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    t.start()
    return t


def _assert_interrupted(call, after=0.5):
    timer = _interrupt_after(after)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            call()
    finally:
        timer.cancel()
    took = time.monotonic() - t0
    assert took < after + 2.0, f"Ctrl-C took {took - after:.1f} s to stop the call"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the SIGINT handler was not put back"


def test_ctrl_c_stops_a_long_sweep(deep):
    small = ps.sweep(deep, n=8, period=8)
    # n=4096 prompts, 8 shifts: minutes of work; SIGINT after 0.5 s must stop it within a couple of seconds
    _assert_interrupted(lambda: ps.sweep(deep, n=4096, period=8, batch=8))
    assert arrays_equal(ps.sweep(deep, n=8, period=8), small), "the model after Ctrl-C gives other numbers"


def test_ctrl_c_stops_a_long_run(deep):
    toks = tokens(1, 40, deep.vocab_size)
    ref = deep(toks)
    big = tokens(64, 96, deep.vocab_size)  # forwards caching every residual, again and again: many seconds

    def long_runs():
        for _ in range(10000):
            deep.run_with_cache(big, names=lambda n: n.endswith("hook_resid_post"))

    _assert_interrupted(long_runs)
    assert bits_equal(deep(toks), ref)


def test_another_thread_runs_during_an_instrument(w8s8):
    ticks, stop = [0], threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=count)
    t.start()
    try:
        ps.sweep(w8s8, n=32, batch=8)
    finally:
        stop.set()
        t.join()
    assert ticks[0] > 1000, f"the other thread ran {ticks[0]} times during the sweep: the GIL was held"


def test_train_progress_stops(tmp_path):
    tc = json.load(open(os.path.join(ROOT, "experiments/configs/tiny_kv_w4s4.json")))
    tc["train"].update(steps=40, log_every=5, eval_every=1000, gates_every=1000)
    cfg = tmp_path / "tc.json"
    cfg.write_text(json.dumps(tc))
    seen = []

    def progress(rec):
        seen.append(rec)
        return rec.get("step", 0) >= 10

    with pytest.raises(ps.Cancelled, match=r"cancelled after step \d+ of 40"):
        ps.train(cfg, tmp_path / "run", progress=progress, poll_s=0.01)
    assert seen and seen[-1]["step"] < 40
    r = ps.train(cfg, tmp_path / "run", resume=True)  # the checkpoint it kept continues
    assert r.log[-1]["step"] == 40


def test_progress_true_draws_a_bar(w8s8, capfd, monkeypatch):
    """progress=True: a bar (tqdm's when installed; here the line on stderr, tqdm hidden) reaching the call's
    total, and the same numbers as without it."""
    import builtins
    real_import = builtins.__import__

    def no_tqdm(name, *a, **k):
        if name.startswith("tqdm"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    capfd.readouterr()
    r = ps.sweep(w8s8, n=8, progress=True)
    out, err = capfd.readouterr()
    assert out == "" and "sweep [" in err and err.rstrip().endswith("8/8"), err[-200:]
    assert r.json == ps.sweep(w8s8, n=8).json

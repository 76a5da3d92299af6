#!/usr/bin/env python3
"""bench_promptset.py — the knockout grid on a caller's prompt set, three ways, same machine, same run:

  1. the grid engine from Python: ps.knockout(model, prompts=S, layers=[10, 11]) (one call; the engine keeps the
     clean state and restarts each cell at its layer, several cells per forward);
  2. the loop a TransformerLens user writes: run_with_cache for the means, then per cell a run_with_hooks forward
     with a Python hook that puts the mean in place (what python/tests/test_promptset.py checks the grid against);
  3. the CLI on the same prompts (`phasescope knockout --prompts FILE`, a process: start, open, run, write).

deep_w8s8 (12 layers, 8 KV heads), layers 10-11, the compressed target (hook_ck and hook_cv), N prompts of the
sweep's own layout (`sweep --save-prompts`, the first N records). CPU seconds (this process's, or the child's) beside
wall seconds, since the 2-core machine may be shared; each case REPS times, medians. The three give the same
numbers (the test); this only times them.

usage: PYTHONPATH=python /usr/bin/python3 bench/bench_promptset.py [--build build] [--n 64] [--reps 3]"""
import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_self():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    os.environ.setdefault("PHASESCOPE_LIB", os.path.join(a.build, "libphasescope.so"))
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import phasescope as ps
    import numpy as np

    cli = os.path.join(a.build, "phasescope")
    model_dir = os.path.join(ROOT, "data/models/deep_w8s8")
    tmp = tempfile.mkdtemp(prefix="bench_promptset-")
    full = os.path.join(tmp, "all.jsonl")
    subprocess.run([cli, "sweep", "--model", model_dir, "--n", "8", "--out", os.path.join(tmp, "sweep"), "--save-prompts", full],
                   check=True, stdout=subprocess.DEVNULL)
    with open(full) as f:
        lines = [next(f) for _ in range(a.n)]
    pfile = os.path.join(tmp, "prompts.jsonl")
    with open(pfile, "w") as f:
        f.writelines(lines)
    S = ps.PromptSet.load(pfile)
    m = ps.load(model_dir)
    layers, heads = [10, 11], list(range(8))

    def engine():
        return ps.knockout(m, prompts=S, layers=layers, period=8)

    def loop():
        pts = [f"blocks.{l}.attn.hook_{p}" for l in layers for p in ("ck", "cv")]
        clean = m(S.tokens)
        _, cache = m.run_with_cache(S.tokens, names=pts)
        means = {p: cache[p].astype(np.float64).mean(0).astype(np.float32) for p in pts}
        i = np.arange(len(S))
        out = []
        for l in layers:
            for g in heads:
                def fn(act, name, g=g):
                    act[:, :, g] = means[name][:, g]
                lg = m.run_with_hooks(S.tokens, fwd_hooks=[(f"blocks.{l}.attn.hook_{p}", fn) for p in ("ck", "cv")])
                out.append(lg[i, S.query, S.answer] - clean[i, S.query, S.answer])
        return out

    def run_cli(r):
        subprocess.run([cli, "knockout", "--model", model_dir, "--prompts", pfile, "--layers", "10,11", "--period", "8",
                        "--out", os.path.join(tmp, f"ko{r}")], check=True, stdout=subprocess.DEVNULL)

    rows = {"engine (ps.knockout)": ([], []), "run_with_hooks loop": ([], []), "CLI knockout --prompts": ([], [])}
    for r in range(a.reps):
        for name, fn, cpu in (("engine (ps.knockout)", engine, cpu_self), ("run_with_hooks loop", loop, cpu_self),
                              ("CLI knockout --prompts", lambda: run_cli(r), cpu_children)):
            c0, t0 = cpu(), time.perf_counter()
            fn()
            rows[name][0].append(time.perf_counter() - t0)
            rows[name][1].append(cpu() - c0)
    print(f"bench_promptset: deep_w8s8, layers 10-11 x 8 KV heads (16 cells, compressed target), N {len(S)} prompts of "
          f"{S.tokens.shape[1]} tokens, {a.reps} runs each (median), OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}")
    print(f"| {'path':24s} | wall s | CPU s |")
    print(f"|{'-' * 26}|-------:|------:|")
    med = {k: (statistics.median(v[0]), statistics.median(v[1])) for k, v in rows.items()}
    for k, (w, c) in med.items():
        print(f"| {k:24s} | {w:6.2f} | {c:5.2f} |")
    e, lp, c = med["engine (ps.knockout)"], med["run_with_hooks loop"], med["CLI knockout --prompts"]
    print(f"loop / engine: {lp[1] / e[1]:.1f}x CPU, {lp[0] / e[0]:.1f}x wall; Python / CLI wall: {e[0] / c[0]:.3f} "
          f"(CPU {e[1] / c[1]:.3f}; the CLI's includes its start, the model's load and its files)")
    m.close()


if __name__ == "__main__":
    main()

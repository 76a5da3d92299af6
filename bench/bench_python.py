#!/usr/bin/env python3
"""bench_python.py — the Python path against the CLI, same machine, same run: a sweep and a knockout of
deep_w8s8 run by `phasescope` (a process: start, open the model, run, write) and by `ps.sweep` /
`ps.knockout` in this process (the same instrument through ps_api_instrument, which opens the model from
its path too), alternated, each REPS times; the median wall time of each and their ratio (target: the
Python path within 5 % of the CLI). Also run_with_cache of every point against `phasescope forward
--hooks` of every point (one sequence). Both sides produce the same JSON (python/tests checks it bit for
bit); this only times them. CPU time of the children is reported beside wall time, since the 2-core
machine is shared.

usage: PYTHONPATH=python /usr/bin/python3 bench/bench_python.py [--build build] [--reps 3] [--n 32]"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--n", type=int, default=32, help="prompts per residue (sweep); knockout uses n/2")
    a = ap.parse_args()
    os.environ.setdefault("PHASESCOPE_LIB", os.path.join(a.build, "libphasescope.so"))
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import phasescope as ps  # first: it sets OpenMP's wait policy before numpy loads libgomp
    import numpy as np

    cli = os.path.join(a.build, "phasescope")
    model = os.path.join(ROOT, "data/models/deep_w8s8")
    tmp = tempfile.mkdtemp(prefix="bench_python-")
    cases = [
        ("sweep", dict(n=a.n)),
        ("knockout", dict(n=max(1, a.n // 2), layers=[10, 11])),
    ]
    print(f"bench_python: deep_w8s8, {a.reps} alternated runs each, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}, "
          f"library {ps.library_path}")
    print(f"{'case':34s} {'CLI wall s':>10s} {'Python wall s':>13s} {'ratio':>7s}   {'CLI cpu s':>9s} {'Py cpu s':>8s}")
    rows = []
    devnull = open(os.devnull, "w")
    for name, flags in cases:
        args = []
        for k, v in flags.items():
            args += ["--" + k, ",".join(map(str, v)) if isinstance(v, list) else str(v)]
        tc, tp, cc, cp = [], [], [], []
        for r in range(a.reps):
            out = os.path.join(tmp, f"{name}-cli-{r}")
            c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run([cli, name, "--model", model, *args, "--out", out], check=True, stdout=devnull)
            tc.append(time.perf_counter() - t0)
            c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cc.append(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
            s0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            saved = sys.stdout.fileno()
            keep = os.dup(saved)
            os.dup2(devnull.fileno(), saved)  # the instrument's console lines, as the CLI's go to devnull
            try:
                res = getattr(ps, name)(model, **flags)
            finally:
                os.dup2(keep, saved)
                os.close(keep)
            tp.append(time.perf_counter() - t0)
            s1 = resource.getrusage(resource.RUSAGE_SELF)
            cp.append(s1.ru_utime + s1.ru_stime - s0.ru_utime - s0.ru_stime)
            del res
        mc, mp = statistics.median(tc), statistics.median(tp)
        label = f"{name} " + " ".join(f"{k}={v}" for k, v in flags.items())
        print(f"{label:34s} {mc:10.2f} {mp:13.2f} {mp / mc:7.3f}   {statistics.median(cc):9.2f} {statistics.median(cp):8.2f}")
        rows.append(dict(case=label, cli_s=tc, python_s=tp, ratio=mp / mc))

    # run_with_cache of every point against forward --hooks of every point (one sequence of 64 tokens)
    m = ps.load(model)
    toks = (np.arange(64) * 37 % m.vocab_size).reshape(1, 64)
    tpath = os.path.join(tmp, "tokens.json")
    with open(tpath, "w") as f:
        json.dump(toks.tolist(), f)
    hooks = ",".join(m.hook_names)
    tc, tp = [], []
    for r in range(a.reps):
        t0 = time.perf_counter()
        subprocess.run([cli, "forward", "--model", model, "--tokens", tpath, "--out", os.path.join(tmp, "fwd.safetensors"),
                        "--hooks", hooks], check=True, stdout=devnull)
        tc.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        m2 = ps.load(model)  # the CLI opens the model each time: so does this side
        logits, cache = m2.run_with_cache(toks)
        tp.append(time.perf_counter() - t0)
        m2.close()
    mc, mp = statistics.median(tc), statistics.median(tp)
    label = f"forward, all {len(m.hook_names)} points cached"
    print(f"{label:34s} {mc:10.3f} {mp:13.3f} {mp / mc:7.3f}")
    rows.append(dict(case=label, cli_s=tc, python_s=tp, ratio=mp / mc))
    t0 = time.perf_counter()
    for _ in range(20):
        m.run_with_cache(toks)
    print(f"{'run_with_cache, model kept open':34s} {'':10s} {(time.perf_counter() - t0) / 20:13.4f}   (per call, 20 calls)")
    subprocess.run(["rm", "-rf", tmp])
    print(json.dumps({"bench_python": rows}))


if __name__ == "__main__":
    main()

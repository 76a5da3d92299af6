#!/usr/bin/python3
"""bench_python_torch.py — phasescope's run_with_cache from Python against the TransformerLens way in plain
PyTorch: torch_peer.py's Peer (the same function, checked by `torch_peer.py --check`) with a HookPoint at
each of phasescope's hook points and forward hooks that cache them (TransformerLens's run_with_cache).

Models: deep_w8s8 (the shipped checkpoint) and a Qwen3-0.6B-shaped model (vocab 151936, d 1024, 28 layers,
16/8 heads, hd 128, d_ff 3072; random weights from `phasescope init`), with full attention and with W8/S8
compressed attention. For each, both sides load the same safetensors checkpoint, then run B sequences of T
tokens caching every point, and caching one point per layer through a names filter
(n.endswith("hook_resid_post")); the logits (and a few cached points) of the two are compared, so both are
known to compute the same thing.

Each side runs in its own process (the same thread count: OMP_NUM_THREADS for phasescope's OpenMP/OpenBLAS,
torch.set_num_threads for PyTorch; a passive OpenMP wait policy for both), so memory is measured per side:
RSS after the imports (the libraries: torch's are larger), RSS after loading the weights and the peak while
loading (VmHWM), and the peak RSS while running (VmHWM again, reset after the load through
/proc/self/clear_refs, so the load's transient does not count). ru_maxrss is not used: Linux carries it
over from the parent across exec.
Times: the median wall time of `reps` calls after one warm-up, and CPU seconds (user+sys) per call.

usage: /usr/bin/python3 bench/bench_python_torch.py [--build build] [--threads 2] [--reps 3] [--T 128]
       [--B 1] [--models deep,qwen3,qwen3_w8s8] [--cache DIR]
(the Qwen3-shaped checkpoints, 2.4 and 4.3 GB, are written once into --cache, default
$TMPDIR/phasescope-bench-torch, and reused)"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN3 = dict(vocab_size=151936, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, d_ff=3072)


def vm(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # MB
    return float("nan")


def reset_peak():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn, reps):
    fn()  # warm-up
    ws, cs = [], []
    for _ in range(reps):
        c0, t0 = cpu_s(), time.perf_counter()
        out = fn()
        ws.append(time.perf_counter() - t0)
        cs.append(cpu_s() - c0)
        del out
    ws.sort()
    cs.sort()
    return ws[len(ws) // 2], cs[len(cs) // 2]


def tokens(B, T, V):
    import numpy as np
    i = np.arange(B * T).reshape(B, T)
    return ((i * 7919 + 13 + i // 5) % V).astype(np.int32)


def check_names(cfg):
    L = cfg["n_layers"]
    names = [f"blocks.0.attn.hook_q", f"blocks.{L // 2}.attn.hook_pattern", f"blocks.{L - 1}.hook_resid_post"]
    if cfg["attention"]["kind"] == "compressed":
        names += [f"blocks.{L // 2}.attn.hook_gate_k", f"blocks.{L - 1}.attn.hook_ck"]
    return names


def keep(n):
    return n.endswith("hook_resid_post")


# ---------------------------------------------------------------- one side, in its own process


def child_phasescope(a, cfg):
    sys.path.insert(0, os.path.join(ROOT, "python"))
    os.environ.setdefault("PHASESCOPE_LIB", os.path.join(a.build, "libphasescope.so"))
    import phasescope as ps  # before numpy: the OpenMP wait policy
    import numpy as np
    rss_import = vm("VmRSS")
    t0 = time.perf_counter()
    m = ps.load(a.model)
    load_s = time.perf_counter() - t0
    toks = tokens(a.B, a.T, m.vocab_size)
    rss_load, hwm_load = vm("VmRSS"), vm("VmHWM")
    reset_peak()
    every_s, every_cpu = timed(lambda: m.run_with_cache(toks), a.reps)
    filt_s, filt_cpu = timed(lambda: m.run_with_cache(toks, names=keep), a.reps)
    logits, cache = m.run_with_cache(toks)
    n_points, cache_mb = len(cache), sum(v.nbytes for v in cache.values()) / 2**20
    np.savez(a.npz, logits=logits[0], **{n: cache[n][0] for n in check_names(cfg)})
    return dict(load_s=load_s, rss_load_mb=rss_load, hwm_load_mb=hwm_load, peak_run_mb=vm("VmHWM"),
                rss_import_mb=rss_import, every_s=every_s,
                every_cpu=every_cpu, filt_s=filt_s, filt_cpu=filt_cpu, n_points=n_points, cache_mb=cache_mb,
                threads=os.environ.get("OMP_NUM_THREADS"))


def load_into(peer, path):
    """The checkpoint's tensors straight into the Peer's parameters (no second copy of the weights)."""
    import numpy as np
    import torch
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head = json.loads(f.read(n))
        base = 8 + n
        with torch.no_grad():
            for name, key in peer.names.items():
                v = head[name]
                assert v["dtype"] == "F32", (name, v["dtype"])
                p = getattr(peer, key)
                assert list(p.shape) == v["shape"], (name, list(p.shape), v["shape"])
                f.seek(base + v["data_offsets"][0])
                f.readinto(memoryview(p.data.numpy()).cast("B"))


def run_with_cache(peer, tok, names_filter=None):
    """TransformerLens's run_with_cache: a forward hook on each chosen HookPoint stores its output."""
    import torch
    cache, handles = {}, []
    for name, hp in peer.hook_points.items():
        if names_filter is None or names_filter(name):
            handles.append(hp.register_forward_hook(lambda mod, inp, out, name=name: cache.__setitem__(name, out.detach())))
    try:
        with torch.no_grad():
            logits = peer.logits(tok)
    finally:
        for h in handles:
            h.remove()
    return logits, cache


def child_torch(a, cfg):
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import torch_peer  # sets OMP_WAIT_POLICY before torch loads
    import numpy as np
    import torch
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    rss_import = vm("VmRSS")
    att = cfg["attention"]
    pc = torch_peer.make_cfg(d=cfg["d_model"], L=cfg["n_layers"], nh=cfg["n_heads"], nkv=cfg["n_kv_heads"], dff=cfg["d_ff"],
                             V=cfg["vocab_size"], T=a.T, compressed=att["kind"] == "compressed",
                             W=att.get("window", 8), S=att.get("stride", 8), LW=att.get("local_window", 8))
    pc.update(head_dim=cfg["head_dim"], rope_theta=cfg.get("rope_theta", 10000.0), rms_eps=cfg.get("rms_eps", 1e-6))
    t0 = time.perf_counter()
    with torch.no_grad():
        peer = torch_peer.Peer(pc, a.T, hook_points=True)
    load_into(peer, os.path.join(a.model, "model.safetensors"))
    peer.eval()
    load_s = time.perf_counter() - t0
    tok = torch.from_numpy(tokens(a.B, a.T, cfg["vocab_size"]).astype(np.int64))
    rss_load, hwm_load = vm("VmRSS"), vm("VmHWM")
    reset_peak()
    every_s, every_cpu = timed(lambda: run_with_cache(peer, tok), a.reps)
    filt_s, filt_cpu = timed(lambda: run_with_cache(peer, tok, keep), a.reps)
    logits, cache = run_with_cache(peer, tok)
    n_points, cache_mb = len(cache), sum(v.numel() * v.element_size() for v in cache.values()) / 2**20
    np.savez(a.npz, logits=logits[0].numpy(), **{n: cache[n][0].contiguous().numpy() for n in check_names(cfg)})
    return dict(load_s=load_s, rss_load_mb=rss_load, hwm_load_mb=hwm_load, peak_run_mb=vm("VmHWM"),
                rss_import_mb=rss_import, every_s=every_s,
                every_cpu=every_cpu, filt_s=filt_s, filt_cpu=filt_cpu, n_points=n_points, cache_mb=cache_mb,
                threads=torch.get_num_threads(), torch=torch.__version__)


# ---------------------------------------------------------------- the parent


def make_qwen3(exe, cache, compressed, T):
    tag = "qwen3_w8s8" if compressed else "qwen3"
    d = os.path.join(cache, f"{tag}_T{T}")
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return d
    os.makedirs(cache, exist_ok=True)
    model = dict(QWEN3, max_seq_len=T, attention={"kind": "compressed", "window": 8, "stride": 8, "local_window": 8}
                 if compressed else {"kind": "full"})
    full = {"model": model,
            "task": {"kind": "bigram-induction", "seq_len": T, "n_keys": 40, "n_fillers": 8, "n_context": 16,
                     "gap_min": 0, "gap_max": 3, "query_gap": 8, "n_queries": 4},
            "train": {"steps": 1}}
    cpath = os.path.join(cache, f"{tag}_T{T}.json")
    with open(cpath, "w") as f:
        json.dump(full, f)
    t0 = time.perf_counter()
    subprocess.run([exe, "init", "--config", cpath, "--out", d, "--seed", "3"], check=True, stdout=subprocess.DEVNULL)
    print(f"  (phasescope init wrote {d} in {time.perf_counter() - t0:.1f} s)", flush=True)
    return d


def compare(cfg, pa, pb):
    import numpy as np
    a, b = np.load(pa), np.load(pb)
    out = {}
    for k in a.files:
        x, y = a[k].astype(np.float64), b[k].astype(np.float64)
        if x.shape != y.shape:
            out[k] = f"shape {x.shape} vs {y.shape}"
            continue
        out[k] = float(np.abs(x - y).max() / max(np.abs(x).max(), 1e-30))
    top = float((a["logits"].argmax(-1) == b["logits"].argmax(-1)).mean())
    return out, top


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--T", type=int, default=128)
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--models", default="deep,qwen3,qwen3_w8s8")
    ap.add_argument("--cache", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "phasescope-bench-torch"))
    ap.add_argument("--child", choices=("phasescope", "torch"), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--npz", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        with open(os.path.join(a.model, "config.json")) as f:
            cfg = json.load(f)
        res = (child_phasescope if a.child == "phasescope" else child_torch)(a, cfg)
        print("#result " + json.dumps(res))
        return 0
    try:
        import torch  # noqa: F401
    except ImportError:
        print(f"bench_python_torch: skipped: {sys.executable} cannot import torch (Debian: apt-get install python3-torch; "
              "only the bench needs it)")
        return 0
    exe = os.path.join(a.build, "phasescope")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    tmp = tempfile.mkdtemp(prefix="bench_python_torch-")
    print(f"bench_python_torch: run_with_cache, phasescope (Python over libphasescope.so) vs PyTorch forward hooks "
          f"(torch_peer.Peer + HookPoints, the TransformerLens way); {a.threads} threads each, B={a.B}, "
          f"{a.reps} timed calls after a warm-up, each side in its own process; load {os.getloadavg()[0]:.1f}", flush=True)
    hdr = (f"  {'model':12} {'side':10} {'T':>4} {'load s':>7} {'RSS libs':>8} {'RSS load':>8} {'peak load':>9} "
           f"{'every pt s':>10} {'cpu s':>6} {'filter s':>8} {'cpu s':>6} {'peak run':>8} {'cache MB':>8} {'points':>6}"
           "   (memory in MB)")
    rows = []
    for name in a.models.split(","):
        if name == "deep":
            mdir, T = os.path.join(ROOT, "data/models/deep_w8s8"), min(a.T, 96)
        else:
            T = a.T
            mdir = make_qwen3(exe, a.cache, name == "qwen3_w8s8", T)
        with open(os.path.join(mdir, "config.json")) as f:
            cfg = json.load(f)
        res = {}
        print(hdr if not rows else "", end="\n" if not rows else "", flush=True)
        for side in ("phasescope", "torch"):
            npz = os.path.join(tmp, f"{name}-{side}.npz")
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", side, "--model", mdir, "--npz", npz,
                                "--T", str(T), "--B", str(a.B), "--reps", str(a.reps), "--build", a.build],
                               env=env, capture_output=True, text=True)
            line = next((l for l in p.stdout.splitlines() if l.startswith("#result ")), None)
            if p.returncode or not line:
                print(f"  {name} {side}: failed ({p.returncode}): {p.stderr[-1500:]}")
                return 1
            r = res[side] = json.loads(line[8:])
            print(f"  {name:12} {side:10} {T:4d} {r['load_s']:7.2f} {r['rss_import_mb']:8.0f} {r['rss_load_mb']:8.0f} "
                  f"{r['hwm_load_mb']:9.0f} {r['every_s']:10.3f} {r['every_cpu']:6.2f} {r['filt_s']:8.3f} "
                  f"{r['filt_cpu']:6.2f} {r['peak_run_mb']:8.0f} {r['cache_mb']:8.1f} {r['n_points']:6d}", flush=True)
        errs, top = compare(cfg, os.path.join(tmp, f"{name}-phasescope.npz"), os.path.join(tmp, f"{name}-torch.npz"))
        worst = max(v for v in errs.values() if isinstance(v, float))
        ok = all(isinstance(v, float) for v in errs.values()) and worst < 1e-3
        ps_, th = res["phasescope"], res["torch"]
        print(f"  {'':12} torch/phasescope: every point {th['every_s'] / ps_['every_s']:.2f}x time, filter "
              f"{th['filt_s'] / ps_['filt_s']:.2f}x, peak run memory {th['peak_run_mb'] / ps_['peak_run_mb']:.2f}x; "
              f"same logits: max rel. diff {errs['logits']:.1e}, argmax agreement {top:.4f}; cached points "
              + ", ".join(f"{k.split('.', 1)[1]} {v:.1e}" if isinstance(v, float) else f"{k} {v}"
                          for k, v in errs.items() if k != "logits") + (" ok" if ok else " MISMATCH"), flush=True)
        rows.append(dict(model=name, T=T, B=a.B, phasescope=ps_, torch=th, rel_diff=errs, argmax_agree=top, ok=ok))
        if not ok:
            return 1
    subprocess.run(["rm", "-rf", tmp])
    print("#bench_python_torch " + json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/python3
"""torch_decode_peer.py — the PyTorch peer of bench/bench_decode: torch_peer.py's model (Peer: phasescope's
controlled model written plainly in PyTorch) with an incremental decode through a KV cache, as a PyTorch
user would write it, timed on the same shapes as bench_decode (time to first token, batch-1 decode
tokens/s).

The cache (DecodeCache): full attention keeps every raw key and value; the compressed model keeps per
layer the compressed key and value of every window that has ended (pooled when its last token arrives:
softmax gate over per-offset payloads, k_norm and RoPE at the window's start for the key), the raw keys and
values of the last local_window - 1 positions and the RMSNorm'd layer input of the last W - 1 positions (the
open windows). A prompt is appended in chunks of 256 rows (prefill: each chunk's queries against the
entries and the raw rows under masks), a decode step is an append of one token (no mask needed).

Usage (Debian's /usr/bin/python3 with python3-torch; a bench-only dependency):
  torch_decode_peer.py --phasescope BENCH_DECODE_OUTPUT [--threads N]
      time the rows bench_decode printed ('#decode' lines: model and context) and print the ratios
  torch_decode_peer.py --check PHASESCOPE_BINARY
      check the cache against phasescope on the same weights: `phasescope init` a checkpoint (full, W8/S8,
      W8/S4 with a local window of 6), `phasescope generate` greedy tokens with their log-probabilities
      through phasescope's KV cache, and the peer's prefill and decode on the same prompt must give the same
      tokens and log-probabilities (within 1e-4), and its logits at every position the whole-sequence
      Peer's (whose loss and gradients torch_peer.py --check compares with phasescope). Exits 1 when they
      disagree.
"""
import json
import math
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peer  # noqa: E402  (sets OMP_WAIT_POLICY / OPENBLAS_CORETYPE before torch loads)
from torch_peer import Peer, make_cfg, rmsnorm, rope, rope_tables, st_read, st_write, _blas_of  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class DecodeCache:
    """Prefill and decode of one sequence of a Peer's model through a KV cache."""

    def __init__(self, peer, T_max, chunk=256):
        c = peer.cfg
        self.c, self.p, self.chunk, self.T = c, peer.p, chunk, 0
        self.comp = c["kind"] == "compressed"
        L, nkv, hd, d = c["n_layers"], c["n_kv_heads"], c["head_dim"], c["d_model"]
        self.cos, self.sin = rope_tables(T_max, hd, c["rope_theta"])
        if self.comp:
            W, S = c["window"], c["stride"]
            nw = (T_max - W) // S + 1 if T_max >= W else 0
            self.ccos, self.csin = rope_tables(max(nw, 1), hd, c["rope_theta"], step=S)
            self.ck = [torch.zeros(max(nw, 1), nkv, hd) for _ in range(L)]
            self.cv = [torch.zeros(max(nw, 1), nkv, hd) for _ in range(L)]
            self.nW = 0
            self.k = [torch.zeros(0, nkv, hd) for _ in range(L)]  # the last local_window - 1 rows
            self.v = [torch.zeros(0, nkv, hd) for _ in range(L)]
            self.a = [torch.zeros(0, d) for _ in range(L)]  # the last W - 1 layer inputs
        else:
            self.k = [torch.zeros(T_max, nkv, hd) for _ in range(L)]
            self.v = [torch.zeros(T_max, nkv, hd) for _ in range(L)]

    def bytes(self):
        n = sum(t.numel() for t in self.k + self.v)
        if self.comp:
            n += sum(t[: self.nW].numel() for t in self.ck + self.cv) + sum(t.numel() for t in self.a)
        return 4 * n

    @torch.no_grad()
    def append(self, tok, all_rows=False):
        """Append tokens (1-D LongTensor); the logits of the last position [V] (all_rows: of every one)."""
        out = []
        for i in range(0, len(tok), self.chunk):
            out.append(self._step(tok[i:i + self.chunk], all_rows))
        return torch.cat(out) if all_rows else out[-1][-1]

    def _step(self, tok, all_rows):
        c, p = self.c, self.p
        n, t0 = len(tok), self.T
        t1 = t0 + n
        d, nh, nkv, hd, eps = c["d_model"], c["n_heads"], c["n_kv_heads"], c["head_dim"], c["rms_eps"]
        grp = nh // nkv
        cos, sin = self.cos[t0:t1], self.sin[t0:t1]
        pos = torch.arange(t0, t1)
        E = p("model.embed_tokens.weight")
        h = F.embedding(tok, E)  # [n, d]
        if self.comp:
            W, S, LW = c["window"], c["stride"], c["local_window"]
            j_hi = (t1 - W) // S + 1 if t1 >= W else 0  # windows ended by t1 - 1
        for l in range(c["n_layers"]):
            pre = f"model.layers.{l}."
            a = rmsnorm(h, p(pre + "input_layernorm.weight"), eps)
            q = (a @ p(pre + "self_attn.q_proj.weight").t()).view(1, n, nh, hd)
            k = (a @ p(pre + "self_attn.k_proj.weight").t()).view(1, n, nkv, hd)
            v = (a @ p(pre + "self_attn.v_proj.weight").t()).view(n, nkv, hd)
            knorm = p(pre + "self_attn.k_norm.weight")
            q = rope(rmsnorm(q, p(pre + "self_attn.q_norm.weight"), eps), cos, sin)[0]
            k = rope(rmsnorm(k, knorm, eps), cos, sin)[0]
            mask = None
            if self.comp:
                A = torch.cat([self.a[l], a])  # layer inputs of positions [abase, t1)
                abase = t0 - self.a[l].shape[0]
                j_lo = self.nW
                if j_hi > j_lo:  # the windows that close in this chunk
                    j = torch.arange(j_lo, j_hi)
                    aw = A[(j[:, None] * S + torch.arange(W)[None, :]) - abase]  # [nn, W, d]
                    pooled = []
                    for br in ("key", "value"):
                        U = p(pre + f"self_attn.compressor.{br}_gate.weight")  # [W, nkv, d]
                        cb = p(pre + f"self_attn.compressor.{br}_gate.bias")  # [W, nkv]
                        C = p(pre + f"self_attn.compressor.{br}_payload")  # [W, nkv*hd, d]
                        z = torch.einsum("jid,igd->jgi", aw, U) + cb.t()[None]
                        alpha = torch.softmax(z, dim=-1)
                        pay = torch.einsum("jid,ied->jie", aw, C).view(-1, W, nkv, hd)
                        pooled.append(torch.einsum("jgi,jigh->jgh", alpha, pay))  # [nn, nkv, hd]
                    self.ck[l][j_lo:j_hi] = rope(rmsnorm(pooled[0][None], knorm, eps), self.ccos[j_lo:j_hi],
                                                 self.csin[j_lo:j_hi])[0]
                    self.cv[l][j_lo:j_hi] = pooled[1]
                K, V = torch.cat([self.k[l], k]), torch.cat([self.v[l], v])  # raw rows [kbase, t1)
                kbase = t0 - self.k[l].shape[0]
                keys, vals = torch.cat([self.ck[l][:j_hi], K]), torch.cat([self.cv[l][:j_hi], V])
                if n > 1:  # a decode step sees every entry and every raw row kept
                    jj, pp = torch.arange(j_hi), torch.arange(kbase, t1)
                    seen_c = (jj[None, :] * S + W - 1) <= pos[:, None]
                    seen_r = (pp[None, :] <= pos[:, None]) & (pp[None, :] > pos[:, None] - LW)
                    mask = torch.cat([seen_c, seen_r], dim=1)
                keep = min(LW - 1, t1)
                self.k[l], self.v[l] = K[K.shape[0] - keep:], V[V.shape[0] - keep:]
                self.a[l] = A[A.shape[0] - min(W - 1, t1):]
            else:
                self.k[l][t0:t1], self.v[l][t0:t1] = k, v
                keys, vals = self.k[l][:t1], self.v[l][:t1]
                if n > 1:
                    mask = torch.arange(t1)[None, :] <= pos[:, None]
            # grouped-query attention without copies: the grp query heads of KV head g as rows
            qg = q.view(n, nkv, grp, hd).permute(1, 2, 0, 3).reshape(nkv, grp * n, hd)
            s = (qg @ keys.permute(1, 2, 0)) / math.sqrt(hd)  # [nkv, grp*n, entries]
            if mask is not None:
                s = s.masked_fill(~mask.repeat(grp, 1)[None], float("-inf"))
            zz = torch.softmax(s, dim=-1) @ vals.permute(1, 0, 2)  # [nkv, grp*n, hd]
            zz = zz.view(nkv, grp, n, hd).permute(2, 0, 1, 3).reshape(n, nh * hd)
            h = h + zz @ p(pre + "self_attn.o_proj.weight").t()
            m = rmsnorm(h, p(pre + "post_attention_layernorm.weight"), eps)
            g = m @ p(pre + "mlp.gate_proj.weight").t()
            u = m @ p(pre + "mlp.up_proj.weight").t()
            h = h + (F.silu(g) * u) @ p(pre + "mlp.down_proj.weight").t()
        if self.comp:
            self.nW = j_hi
        self.T = t1
        hl = h if all_rows else h[-1:]
        return rmsnorm(hl, p("model.norm.weight"), eps) @ E.t()


# ---------------------------------------------------------------- the check against phasescope


def run_check(exe):
    torch.set_num_threads(1)
    ok = True
    cases = [
        ("full", dict(d=64, L=2, nh=4, nkv=2, dff=96, V=97, T=64), {}, 37),
        ("compressed W8/S8", dict(d=64, L=2, nh=4, nkv=2, dff=96, V=97, T=64), dict(W=8, S=8, LW=8), 37),
        ("compressed W8/S4 LW6", dict(d=64, L=2, nh=4, nkv=2, dff=96, V=97, T=64), dict(W=8, S=4, LW=6), 29),
    ]
    n_gen = 20
    for label, sh, att, P in cases:
        comp = bool(att)
        cfg = make_cfg(**sh, compressed=comp, **att)
        T = sh["T"]
        with tempfile.TemporaryDirectory() as tmp:
            model_cfg = {k: cfg[k] for k in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                                             "d_ff", "max_seq_len")}
            model_cfg["attention"] = {"kind": cfg["kind"]}
            if comp:
                model_cfg["attention"].update(window=cfg["window"], stride=cfg["stride"],
                                              local_window=cfg["local_window"])
            full = {"model": model_cfg,
                    "task": {"kind": "bigram-induction", "seq_len": T, "n_keys": 40, "n_fillers": 8, "n_context": 16,
                             "gap_min": 0, "gap_max": 3, "query_gap": 8, "n_queries": 4},
                    "train": {"steps": 1}}
            cpath, mdir = os.path.join(tmp, "cfg.json"), os.path.join(tmp, "m")
            with open(cpath, "w") as f:
                json.dump(full, f)
            subprocess.run([exe, "init", "--config", cpath, "--out", mdir, "--seed", "3"], check=True,
                           stdout=subprocess.DEVNULL)
            st_path = os.path.join(mdir, "model.safetensors")
            w, meta = st_read(st_path)
            rng = np.random.default_rng(5)
            for k in w:  # larger weights and non-uniform gates: logits far from uniform, a varied greedy path
                if "_gate." in k:
                    w[k] = rng.normal(0, 0.3, w[k].shape).astype(np.float32)
                elif k.endswith("norm.weight") or k.endswith("layernorm.weight"):
                    w[k] = (1 + rng.normal(0, 0.1, w[k].shape)).astype(np.float32)
                else:
                    w[k] = (w[k] * 8).astype(np.float32)
            st_write(st_path, w, meta)
            prompt = rng.integers(0, cfg["vocab_size"], P).tolist()
            tp, od = os.path.join(tmp, "t.json"), os.path.join(tmp, "out")
            json.dump([prompt], open(tp, "w"))
            subprocess.run([exe, "generate", "--model", mdir, "--tokens", tp, "--max-tokens", str(n_gen), "--out", od],
                           check=True, stdout=subprocess.DEVNULL)
            g = json.load(open(os.path.join(od, "generate.json")))["sequences"][0]
            peer = Peer(cfg, T)
            with torch.no_grad():
                for name, key in peer.names.items():
                    getattr(peer, key).copy_(torch.from_numpy(w[name]))
            cache = DecodeCache(peer, T, chunk=16)  # chunks of 16: windows split across prefill chunks
            lg = cache.append(torch.tensor(prompt))
            toks, lps = [], []
            for _ in range(n_gen):
                nxt = int(torch.argmax(lg))
                toks.append(nxt)
                lps.append(float(torch.log_softmax(lg.double(), -1)[nxt]))
                lg = cache.append(torch.tensor([nxt]))
            same_tok = toks == g["tokens"]
            lp_err = max(abs(a - b) for a, b in zip(lps, g["logprobs"])) if same_tok else float("inf")
            # every position's logits against the whole-sequence Peer (the same tokens, no cache)
            seq = torch.tensor(prompt + toks)
            c2 = DecodeCache(peer, T, chunk=16)
            rows = torch.cat([c2.append(seq[:P], all_rows=True)] + [c2.append(seq[P + i:P + i + 1], all_rows=True)
                                                                      for i in range(n_gen)])
            whole = whole_logits(peer, seq)
            rel = float((rows - whole).abs().max() / whole.abs().max())
            good = same_tok and lp_err < 1e-4 and rel < 1e-4
            ok &= good
            print(f"check {label:22} greedy tokens {'equal' if same_tok else 'DIFFER'} ({n_gen}), log-prob max diff "
                  f"{lp_err:.1e}; cache logits vs the whole-sequence Peer rel {rel:.1e}; {'ok' if good else 'MISMATCH'}")
    print("the decode peer computes phasescope's function" if ok else "decode peer and phasescope DISAGREE")
    return 0 if ok else 1


@torch.no_grad()
def whole_logits(peer, seq):
    """Logits of every position of the whole-sequence Peer (its forward, capturing the head's input)."""
    c = peer.cfg
    cap = {}
    orig = torch_peer.F.cross_entropy

    def grab(logits, tgt, **kw):
        cap["x"] = logits
        return orig(logits, tgt, **kw)
    torch_peer.F.cross_entropy = grab
    try:
        T = len(seq)
        p2 = Peer(c, T)
        for name, key in peer.names.items():
            getattr(p2, key).copy_(getattr(peer, key))
        p2(seq[None], torch.zeros(1, T, dtype=torch.long))
    finally:
        torch_peer.F.cross_entropy = orig
    return cap["x"].view(len(seq), -1)


# ---------------------------------------------------------------- timing


def peer_for(model):
    if model == "qwen":
        cfg = dict(vocab_size=151936, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, d_ff=3072,
                   max_seq_len=8, rope=True, rope_theta=1e6, qk_norm=True, rms_eps=1e-6, tie_embeddings=True,
                   kind="compressed", window=8, stride=8, local_window=8)
    else:
        cfg = make_cfg(d=64, L=12, nh=8, nkv=8, dff=128, V=96, T=8, compressed=model == "deep_w8s8")
    torch.manual_seed(1)
    return Peer(cfg, 8)


def time_row(peer, T, steps):
    g = torch.Generator().manual_seed(3)
    tok = torch.randint(0, peer.cfg["vocab_size"], (T + steps + 1,), generator=g)
    cache = DecodeCache(peer, T + steps + 2)
    w0, c0 = time.perf_counter(), time.process_time()
    lg = cache.append(tok[:T])
    ttft, ttft_cpu = time.perf_counter() - w0, time.process_time() - c0
    cache.append(tok[T:T + 1])  # one untimed step, as bench_decode
    w0, c0 = time.perf_counter(), time.process_time()
    for k in range(1, steps + 1):
        lg = cache.append(tok[T + k:T + k + 1])
    dec, dec_cpu = (time.perf_counter() - w0) / steps, (time.process_time() - c0) / steps
    assert torch.isfinite(lg).all()
    return ttft, ttft_cpu, dec, dec_cpu, cache.bytes() / T


def run_bench(path, threads):
    rows = []
    with open(path) as f:
        for line in f:
            if line.startswith("#decode "):
                kv = dict(x.split("=", 1) for x in line.split()[1:])
                rows.append(kv)
    if threads is None:
        threads = _blas_of(path)[1] or (int(rows[0]["threads"]) if rows else None)
    torch.set_num_threads(threads or os.cpu_count())
    print(f"\nPyTorch decode peer (torch {torch.__version__}, {torch.get_num_threads()} threads, float32, CPU; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(library detection)')}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}); wall s (CPU s); ratio = phasescope speed / PyTorch speed\n")
    print("| model | context T | torch TTFT s | phasescope TTFT s | TTFT ratio | torch decode tok/s | phasescope decode tok/s "
          "| decode ratio | phasescope decode / bandwidth bound (CPU) |")
    print("|---|---|---|---|---|---|---|---|---|")
    peers = {}
    for r in rows:
        model, T = r["model"], int(r["T"])
        if model not in peers:
            peers.clear()
            peers[model] = peer_for(model)
        steps = 8 if model == "qwen" else 16
        ttft, ttft_cpu, dec, dec_cpu, _ = time_row(peers[model], T, steps)
        pt, ptc, ps, psc = (float(r[k]) for k in ("ttft", "ttft_cpu", "step", "step_cpu"))
        bound = float(r["bw"]) / float(r["wbytes"])
        bound_cpu = float(r.get("bw_cpu", r["bw"])) / float(r["wbytes"])
        print(f"| {model} | {T} | {ttft:.3f} ({ttft_cpu:.3f}) | {pt:.3f} ({ptc:.3f}) | {ttft / pt:.2f}x ({ttft_cpu / ptc:.2f}x) "
              f"| {1 / dec:.1f} ({1 / dec_cpu:.1f}) | {1 / ps:.1f} ({1 / psc:.1f}) | {dec / ps:.2f}x ({dec_cpu / psc:.2f}x) "
              f"| {100 / ps / bound:.0f}% ({100 / psc / bound_cpu:.0f}%) |")
        print(f"#peer model={model} T={T} ttft={ttft:.6f} ttft_cpu={ttft_cpu:.6f} step={dec:.6f} step_cpu={dec_cpu:.6f}")
        sys.stdout.flush()


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--phasescope", help="bench_decode output with '#decode' lines")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--check", metavar="PHASESCOPE", help="compare the cache's decode with phasescope generate")
    args = ap.parse_args()
    if args.check:
        sys.exit(run_check(args.check))
    if not args.phasescope:
        ap.error("give --phasescope BENCH_DECODE_OUTPUT or --check PHASESCOPE")
    run_bench(args.phasescope, args.threads)


if __name__ == "__main__":
    main()

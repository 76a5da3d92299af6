#!/usr/bin/python3
"""torch_peer.py — the PyTorch peer of bench/bench_train: the same model and training step in plain
PyTorch (float32, CPU), timed the same way, so phasescope's speed can be read against a framework a
user of the paper would otherwise reach for.

The model is phasescope's Qwen3-style block (SPEC §2): RMSNorm, q/k/v/o projections, qk-norm, rotate-half
RoPE, grouped-query attention, SwiGLU MLP, tied embeddings (bench_train's configs), final RMSNorm. The
compressed attention is written the straightforward way: every window of W tokens every S tokens is
pooled by a per-offset softmax gate over per-offset payloads into one compressed key (k_norm, RoPE at
position jS) and value per KV head; each query attends, under masks, to the compressed entries of the
windows that have ended and to the raw keys of its local window. The step is forward, mean
cross-entropy, backward, global gradient-norm clipping at 1.0 and AdamW (betas 0.9/0.95, weight decay
0.1 on matrices, none on norm weights and gate parameters), as in bench_train.

Usage (Debian's /usr/bin/python3 with python3-torch; a bench-only dependency):
  torch_peer.py [--threads N] [--min-s S] [--configs small,medium] [--phasescope BENCH_TRAIN_OUTPUT]
      time the training step; with --phasescope, also print phasescope/PyTorch ratios side by side,
      reading the '#result' lines bench_train printed
  torch_peer.py --check PHASESCOPE_BINARY
      verify the peer computes phasescope's function: for full and compressed attention (GQA, learned
      gates made non-uniform), initialise a checkpoint with `phasescope init`, compute the loss and the
      gradient of every tensor with `phasescope grad`, and compare with this file's model on the same
      weights (read from the safetensors checkpoint). Exits 1 when they disagree.
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np



def _blas_of(path):
    """(kernel family, threads) from bench_train's 'BLAS: OpenBLAS 0.3.21 SkylakeX (...), 2 threads, ...' line."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("BLAS: "):
                    words = line.split()
                    core = words[3] if len(words) > 3 else None
                    th = next((int(w) for w, nxt in zip(words, words[1:]) if nxt.startswith("thread") and w.isdigit()),
                              None)
                    return core, th
    except OSError:
        pass
    return None, None


def _prepare_env(argv):
    """Before torch (and its libgomp and OpenBLAS) load: the same BLAS kernels and wait policy as phasescope.
    Debian's torch calls sgemm in the same OpenBLAS (libblas.so.3), which reads OPENBLAS_CORETYPE at load
    time; libgomp reads OMP_WAIT_POLICY at load time. phasescope sets a passive wait policy itself (spinning
    threads lose most of their time on a shared machine: measured 4-5x on torch's matmul here), so the peer
    gets the same, unless the user set one."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if "--phasescope" in argv and argv.index("--phasescope") + 1 < len(argv):
        core, _ = _blas_of(argv[argv.index("--phasescope") + 1])
        if core and core not in ("unknown",):
            os.environ.setdefault("OPENBLAS_CORETYPE", core)


_prepare_env(sys.argv)

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the Makefile checks first; this is for direct callers
    sys.exit("torch_peer.py: PyTorch is not installed for this python (Debian: apt-get install python3-torch)")

# bench_train's configs (keep in step with bench/bench_train.c)
CONFIGS = {
    "small": dict(d=256, L=4, nh=4, nkv=4, dff=768, V=512, B=4, T=256),
    "medium": dict(d=512, L=8, nh=8, nkv=8, dff=1536, V=512, B=4, T=512),
}
W_DEFAULT = 8


def make_cfg(d, L, nh, nkv, dff, V, T, compressed, W=8, S=8, LW=8, **_):
    return dict(vocab_size=V, d_model=d, n_layers=L, n_heads=nh, n_kv_heads=nkv, head_dim=d // nh, d_ff=dff,
                max_seq_len=T, rope=True, rope_theta=10000.0, qk_norm=True, rms_eps=1e-6, tie_embeddings=True,
                kind="compressed" if compressed else "full", window=W, stride=S, local_window=LW)


# ---------------------------------------------------------------- the model


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(n_pos, hd, theta, step=1):
    # angles in double, cos/sin rounded to float32 (as phasescope)
    i = torch.arange(hd // 2, dtype=torch.float64)
    p = torch.arange(n_pos, dtype=torch.float64) * step
    ang = p[:, None] * theta ** (-2.0 * i / hd)
    return torch.cos(ang).float(), torch.sin(ang).float()


def rope(x, cos, sin):
    # x: [B, T, H, hd]; cos/sin: [T, hd/2]
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


class HookPoint(torch.nn.Module):
    """TransformerLens's HookPoint: an identity module on an activation, where forward hooks attach
    (register_forward_hook) to read it (bench_python_torch.py's run_with_cache caches them this way)."""

    def forward(self, x):
        return x


# phasescope's hook points of a layer (docs/hooks.md), in firing order; gates and compressed entries only
# for compressed attention
POINTS = ("hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_gate_k", "attn.hook_gate_v",
          "attn.hook_ck", "attn.hook_cv", "attn.hook_pattern", "attn.hook_z", "hook_attn_out", "hook_resid_mid",
          "hook_mlp_out", "hook_resid_post")


class Peer(torch.nn.Module):
    """hook_points=True: a HookPoint at each of phasescope's hook points (blocks.{l}.attn.hook_q, ... with
    phasescope's names and layouts, docs/hooks.md), in self.hook_points (name -> HookPoint); False (the
    training benchmark, the checks): none, and nothing in the forward changes."""

    def __init__(self, cfg, T, hook_points=False):
        super().__init__()
        self.cfg, self.T = cfg, T
        c = cfg
        self.hook_points = {}
        if hook_points:
            for l in range(c["n_layers"]):
                for p in POINTS:
                    if c["kind"] == "compressed" or not any(s in p for s in ("gate", "ck", "cv")):
                        self.hook_points[f"blocks.{l}.{p}"] = HookPoint()
            self.hook_modules = torch.nn.ModuleList(self.hook_points.values())
        d, nh, nkv, hd, dff, V = c["d_model"], c["n_heads"], c["n_kv_heads"], c["head_dim"], c["d_ff"], c["vocab_size"]
        P = torch.nn.Parameter
        self.names = {}  # phasescope tensor name -> parameter
        def reg(name, shape, std):
            t = P(torch.randn(*shape) * std if std > 0 else (torch.ones(*shape) if std == 0 else torch.zeros(*shape)))
            key = name.replace(".", "_")
            self.register_parameter(key, t)
            self.names[name] = key
        reg("model.embed_tokens.weight", (V, d), 0.02)
        L = c["n_layers"]
        for l in range(L):
            pre = f"model.layers.{l}."
            reg(pre + "input_layernorm.weight", (d,), 0)
            reg(pre + "self_attn.q_proj.weight", (nh * hd, d), 0.02)
            reg(pre + "self_attn.k_proj.weight", (nkv * hd, d), 0.02)
            reg(pre + "self_attn.v_proj.weight", (nkv * hd, d), 0.02)
            reg(pre + "self_attn.o_proj.weight", (d, nh * hd), 0.02 / math.sqrt(2 * L))
            reg(pre + "self_attn.q_norm.weight", (hd,), 0)
            reg(pre + "self_attn.k_norm.weight", (hd,), 0)
            if c["kind"] == "compressed":
                W = c["window"]
                reg(pre + "self_attn.compressor.key_payload", (W, nkv * hd, d), 0.02)
                reg(pre + "self_attn.compressor.value_payload", (W, nkv * hd, d), 0.02)
                reg(pre + "self_attn.compressor.key_gate.weight", (W, nkv, d), 0.05)
                reg(pre + "self_attn.compressor.key_gate.bias", (W, nkv), -1)
                reg(pre + "self_attn.compressor.value_gate.weight", (W, nkv, d), 0.05)
                reg(pre + "self_attn.compressor.value_gate.bias", (W, nkv), -1)
            reg(pre + "post_attention_layernorm.weight", (d,), 0)
            reg(pre + "mlp.gate_proj.weight", (dff, d), 0.02)
            reg(pre + "mlp.up_proj.weight", (dff, d), 0.02)
            reg(pre + "mlp.down_proj.weight", (d, dff), 0.02 / math.sqrt(2 * L))
        reg("model.norm.weight", (d,), 0)
        cos, sin = rope_tables(T, hd, c["rope_theta"])
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        if c["kind"] == "compressed":
            W, S, LW = c["window"], c["stride"], c["local_window"]
            nW = (T - W) // S + 1 if T >= W else 0
            self.nW = nW
            ccos, csin = rope_tables(nW, hd, c["rope_theta"], step=S)
            self.register_buffer("ccos", ccos)
            self.register_buffer("csin", csin)
            t = torch.arange(T)
            j = torch.arange(nW)
            # query t sees window j once it has ended (jS + W - 1 <= t), and raw keys t' in (t - LW, t]
            seen_c = (j[None, :] * S + W - 1) <= t[:, None]
            seen_r = (t[None, :] <= t[:, None]) & (t[None, :] > t[:, None] - LW)
            self.register_buffer("mask", torch.cat([seen_c, seen_r], dim=1))  # [T, nW + T]
            self.register_buffer("win_idx", (j[:, None] * S + torch.arange(W)[None, :]).reshape(-1))  # [nW*W]
        else:
            self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).tril())

    def p(self, name):
        return getattr(self, self.names[name])

    def hook(self, name, x):
        hp = self.hook_points.get(name) if self.hook_points else None
        return hp(x) if hp is not None else x

    def forward(self, tok, tgt):
        """The mean cross-entropy over the targets (-1: none)."""
        B, T = tok.shape
        logits = self.logits(tok)
        return F.cross_entropy(logits.view(B * T, -1), tgt.view(-1), ignore_index=-1)

    def logits(self, tok):
        """The logits [B, T, V] of tokens [B, T], firing the hook points."""
        c = self.cfg
        B, T = tok.shape
        hk = self.hook
        d, nh, nkv, hd, eps = c["d_model"], c["n_heads"], c["n_kv_heads"], c["head_dim"], c["rms_eps"]
        grp = nh // nkv
        h = F.embedding(tok, self.p("model.embed_tokens.weight"))
        for l in range(c["n_layers"]):
            pre, hp = f"model.layers.{l}.", f"blocks.{l}."
            h = hk(hp + "hook_resid_pre", h)
            a = rmsnorm(h, self.p(pre + "input_layernorm.weight"), eps)
            q = (a @ self.p(pre + "self_attn.q_proj.weight").t()).view(B, T, nh, hd)
            k = (a @ self.p(pre + "self_attn.k_proj.weight").t()).view(B, T, nkv, hd)
            v = (a @ self.p(pre + "self_attn.v_proj.weight").t()).view(B, T, nkv, hd)
            knorm = self.p(pre + "self_attn.k_norm.weight")
            q = rope(rmsnorm(q, self.p(pre + "self_attn.q_norm.weight"), eps), self.cos, self.sin)
            k = rope(rmsnorm(k, knorm, eps), self.cos, self.sin)
            q, k, v = hk(hp + "attn.hook_q", q), hk(hp + "attn.hook_k", k), hk(hp + "attn.hook_v", v)
            if c["kind"] == "compressed" and self.nW > 0:
                W, nW = c["window"], self.nW
                aw = a[:, self.win_idx].view(B, nW, W, d)  # window j, offset i: token jS + i
                pooled = []
                for br in ("key", "value"):
                    U = self.p(pre + f"self_attn.compressor.{br}_gate.weight")  # [W, nkv, d]
                    cb = self.p(pre + f"self_attn.compressor.{br}_gate.bias")  # [W, nkv]
                    C = self.p(pre + f"self_attn.compressor.{br}_payload")  # [W, nkv*hd, d]
                    z = torch.einsum("bjid,igd->bjgi", aw, U) + cb.t()[None, None]  # [B, nW, nkv, W]
                    alpha = hk(hp + f"attn.hook_gate_{br[0]}", torch.softmax(z, dim=-1))
                    pay = torch.einsum("bjid,ied->bjie", aw, C).view(B, nW, W, nkv, hd)
                    pooled.append(torch.einsum("bjgi,bjigh->bjgh", alpha, pay))  # [B, nW, nkv, hd]
                ck = hk(hp + "attn.hook_ck", rope(rmsnorm(pooled[0], knorm, eps), self.ccos, self.csin))
                cv = hk(hp + "attn.hook_cv", pooled[1])
                keys, vals = torch.cat([ck, k], dim=1), torch.cat([cv, v], dim=1)  # [B, nW + T, nkv, hd]
            else:
                keys, vals = k, v
            # GQA: query head n reads KV head n // grp
            keys = keys.repeat_interleave(grp, dim=2).transpose(1, 2)  # [B, nh, n_entries, hd]
            vals = vals.repeat_interleave(grp, dim=2).transpose(1, 2)
            qh = q.transpose(1, 2)  # [B, nh, T, hd]
            s = (qh @ keys.transpose(-1, -2)) / math.sqrt(hd)
            s = s.masked_fill(~self.mask, float("-inf"))
            pattern = hk(hp + "attn.hook_pattern", torch.softmax(s, dim=-1))
            z = hk(hp + "attn.hook_z", (pattern @ vals).transpose(1, 2)).reshape(B, T, nh * hd)
            h = h + hk(hp + "hook_attn_out", z @ self.p(pre + "self_attn.o_proj.weight").t())
            h = hk(hp + "hook_resid_mid", h)
            m = rmsnorm(h, self.p(pre + "post_attention_layernorm.weight"), eps)
            g = m @ self.p(pre + "mlp.gate_proj.weight").t()
            u = m @ self.p(pre + "mlp.up_proj.weight").t()
            h = h + hk(hp + "hook_mlp_out", (F.silu(g) * u) @ self.p(pre + "mlp.down_proj.weight").t())
            h = hk(hp + "hook_resid_post", h)
        hf = rmsnorm(h, self.p("model.norm.weight"), eps)
        return hf @ self.p("model.embed_tokens.weight").t()  # tied head


def make_optimizer(model):
    decay, no_decay = [], []
    for name, key in model.names.items():
        t = getattr(model, key)
        gate = "_gate." in name
        (decay if t.dim() >= 2 and not gate else no_decay).append(t)
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=1e-4, betas=(0.9, 0.95), eps=1e-8)


# ---------------------------------------------------------------- FLOPs (as bench_common.h's forward_flops)


def forward_flops(c, B, T):
    d, hd, nh, nkv = c["d_model"], c["head_dim"], c["n_heads"], c["n_kv_heads"]
    per_tok_layer = 2 * d * (nh + 2 * nkv) * hd + 2 * nh * hd * d + 6 * d * c["d_ff"]
    comp = c["kind"] == "compressed"
    W, S, LW = c["window"], c["stride"], c["local_window"]
    nW = (T - W) // S + 1 if comp and T >= W else 0
    entries = 0
    for t in range(T):
        if not comp:
            entries += t + 1
        else:
            seen = 0 if t < W - 1 else min((t - W + 1) // S + 1, nW)
            entries += seen + min(LW, t + 1)
    attn = 4 * nh * hd * entries
    cmp_ = nW * 2 * (2 * W * nkv * d + 2 * W * d * nkv * hd) if comp else 0
    return B * (c["n_layers"] * (per_tok_layer * T + attn + cmp_) + T * 2 * d * c["vocab_size"])


# ---------------------------------------------------------------- timing


def time_step(cfg, B, T, min_s):
    torch.manual_seed(1)
    model = Peer(cfg, T)
    with torch.no_grad():  # non-uniform gates, as bench_model does
        for name, key in model.names.items():
            if name.endswith("_gate.bias"):
                getattr(model, key).zero_()
    opt = make_optimizer(model)
    params = list(model.parameters())
    g = torch.Generator().manual_seed(2)
    tok = torch.randint(0, cfg["vocab_size"], (B, T), generator=g)
    tgt = torch.cat([tok[:, 1:], torch.full((B, 1), -1, dtype=tok.dtype)], dim=1)  # loss on every position

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(tok, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss

    loss0 = step().item()  # warm-up
    dts, c0, t_start = [], time.process_time(), time.perf_counter()
    while True:
        t0 = time.perf_counter()
        step()
        dts.append(time.perf_counter() - t0)
        if (time.perf_counter() - t_start >= min_s and len(dts) >= 5) or len(dts) >= 1000:
            break
    cpu = (time.process_time() - c0) / len(dts)
    return float(np.median(dts)), cpu, loss0, len(dts)


def parse_phasescope(path):
    res = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#result "):
                parts = line.split()
                kv = dict(p.split("=", 1) for p in parts[3:])
                res[(parts[1], parts[2])] = {k: float(v) for k, v in kv.items()}
    return res


def run_bench(args):
    threads = args.threads
    if threads is None and args.phasescope:
        threads = _blas_of(args.phasescope)[1]  # the thread count phasescope ran with
    torch.set_num_threads(threads or os.cpu_count())
    ps = parse_phasescope(args.phasescope) if args.phasescope else {}
    print(f"PyTorch peer (torch {torch.__version__}, {torch.get_num_threads()} threads, float32, CPU; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(library detection)')}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}): forward + backward + clip + AdamW, same model and "
          "shapes as bench_train")
    print(f"  {'config':8} {'attention':11} {'torch ms':>9} {'cpu-ms':>8} {'GFLOP/s':>8} {'init loss':>9}"
          + (f" {'phasescope ms':>13} {'cpu-ms':>8} {'speed-up':>9} {'cpu speed-up':>12}" if ps else ""))
    for name in args.configs.split(","):
        sh = CONFIGS[name]
        for comp in (False, True):
            cfg = make_cfg(**sh, compressed=comp)
            ms, cpu, loss0, n = time_step(cfg, sh["B"], sh["T"], args.min_s)
            gf = 3 * forward_flops(cfg, sh["B"], sh["T"]) / ms / 1e9
            kind = "compressed" if comp else "full"
            line = f"  {name:8} {kind:11} {ms * 1e3:9.1f} {cpu * 1e3:8.1f} {gf:8.1f} {loss0:9.4f}"
            r = ps.get((name, kind))
            if r:
                line += (f" {r['ms_step']:13.1f} {r.get('cpu_ms_step', float('nan')):8.1f} "
                         f"{ms * 1e3 / r['ms_step']:8.2f}x {cpu * 1e3 / r.get('cpu_ms_step', float('nan')):11.2f}x")
            print(line)
            print(f"#peer {name} {kind} ms_step={ms * 1e3:.3f} cpu_ms_step={cpu * 1e3:.3f} steps={n}")
            sys.stdout.flush()
    print(f"  (init loss ≈ ln V = {math.log(CONFIGS['small']['V']):.4f} for both: the same loss scale; speed-up = "
          "PyTorch time / phasescope time, wall clock medians, and CPU seconds per step)")


# ---------------------------------------------------------------- safetensors and the check


def st_read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[a:b], dtype="<f4").reshape(v["shape"]).copy()
    return out, hdr.get("__metadata__", {})


def st_write(path, tensors, metadata):
    hdr, off, blobs = {}, 0, []
    for k, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        hdr[k] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    if metadata:
        hdr["__metadata__"] = metadata
    h = json.dumps(hdr).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def run_check(args):
    exe = args.check
    torch.set_num_threads(1)
    ok = True
    cases = [
        ("full", dict(d=64, L=2, nh=4, nkv=2, dff=96, V=97, T=40), {}),
        ("compressed W8/S8", dict(d=64, L=2, nh=4, nkv=2, dff=96, V=97, T=40), dict(W=8, S=8, LW=8)),
        ("compressed W8/S4 LW6", dict(d=64, L=2, nh=4, nkv=2, dff=96, V=97, T=37), dict(W=8, S=4, LW=6)),
    ]
    for label, sh, att in cases:
        comp = bool(att)
        cfg = make_cfg(**sh, compressed=comp, **att)
        T, B = sh["T"], 3
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
            for k in w:  # non-uniform gates and non-unit norms, so every path carries a gradient
                if "_gate." in k:
                    w[k] = rng.normal(0, 0.3, w[k].shape).astype(np.float32)
                elif k.endswith("norm.weight") or k.endswith("layernorm.weight"):
                    w[k] = (1 + rng.normal(0, 0.1, w[k].shape)).astype(np.float32)
            st_write(st_path, w, meta)
            tok = rng.integers(0, cfg["vocab_size"], (B, T))
            tgt = np.concatenate([tok[:, 1:], np.full((B, 1), -1)], axis=1)
            tgt[1, ::3] = -1
            tp, yp, gp = (os.path.join(tmp, n) for n in ("t.json", "y.json", "g.safetensors"))
            json.dump(tok.tolist(), open(tp, "w"))
            json.dump(tgt.tolist(), open(yp, "w"))
            subprocess.run([exe, "grad", "--model", mdir, "--tokens", tp, "--targets", yp, "--out", gp], check=True,
                           stdout=subprocess.DEVNULL)
            ref, _ = st_read(gp)
            model = Peer(cfg, T)
            with torch.no_grad():
                for name, key in model.names.items():
                    getattr(model, key).copy_(torch.from_numpy(w[name]))
            loss = model(torch.from_numpy(tok), torch.from_numpy(tgt))
            loss.backward()
            l_ps = float(ref["loss"].reshape(-1)[0])
            rel_l = abs(loss.item() - l_ps) / abs(l_ps)
            worst, worst_name = 0.0, ""
            for name, key in model.names.items():
                gt = getattr(model, key).grad.numpy()
                e = float(np.abs(gt - ref[name]).max() / max(np.abs(ref[name]).max(), 1e-30))
                if e > worst:
                    worst, worst_name = e, name
            good = rel_l < 1e-4 and worst < 1e-3
            ok &= good
            print(f"check {label:22} loss phasescope {l_ps:.6f} torch {loss.item():.6f} (rel {rel_l:.1e}); "
                  f"worst gradient rel. error {worst:.1e} ({worst_name}); {'ok' if good else 'MISMATCH'}")
    print("peer computes phasescope's function" if ok else "peer and phasescope DISAGREE")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default: phasescope's count from --phasescope, else the CPU count)")
    ap.add_argument("--min-s", type=float, default=2.0)
    ap.add_argument("--configs", default="small,medium")
    ap.add_argument("--phasescope", help="bench_train output with '#result' lines")
    ap.add_argument("--check", metavar="PHASESCOPE", help="compare loss and gradients with this phasescope binary")
    args = ap.parse_args()
    if args.check:
        sys.exit(run_check(args))
    run_bench(args)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""torch_gpu_peer.py — the PyTorch peer of bench_gpu: the same Qwen3-0.6B-shaped model and training step
(forward, next-token cross-entropy, backward, gradient-norm clipping, AdamW) in plain PyTorch on the same
GPU, per precision (fp32; tf32: TF32 matmuls; bf16: autocast with fp32 master weights) and attention
(full: scaled_dot_product_attention, causal; W8/S8: the phasescope compressor — per-offset gate softmax
and payloads, pooled keys/values with qk-norm and RoPE at the window's start — and one softmax over the
ended windows and the local raw window, as a boolean mask). Prints one line per configuration and,
with --json FILE, the numbers scripts/gpu_check.sh puts next to bench_gpu's.

usage: torch_gpu_peer.py [--precisions fp32,tf32,bf16] [--steps N] [--tiny] [--json FILE]
"""
import argparse
import json
import math
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--precisions", default="fp32,tf32,bf16")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="a small model (a quick check that the script runs)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json")
    a = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
    except Exception as e:  # noqa: BLE001
        print(f"torch_gpu_peer: FAILED: cannot import torch ({e})")
        return 1
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch_gpu_peer: FAILED: torch sees no CUDA device")
        return 1
    dev = torch.device(a.device)
    if a.tiny:
        V, d, L, nh, nkv, hd, dff, T = 512, 64, 2, 4, 2, 16, 128, 128
    else:
        V, d, L, nh, nkv, hd, dff, T = 151936, 1024, 28, 16, 8, 128, 3072, 4096
    Wn, Sn, LW = 8, 8, 8
    theta, eps = 1e6, 1e-6

    def rms(x, w):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * w

    half = hd // 2
    inv = theta ** (-torch.arange(half, dtype=torch.float64, device=dev) * 2 / hd)
    ang = torch.arange(T, dtype=torch.float64, device=dev)[:, None] * inv[None]
    cos_t, sin_t = ang.cos().float(), ang.sin().float()

    def rope(x, pos):  # x [B, n, rows, hd]; rotate-half, positions pos [rows]
        c, s = cos_t[pos][None, None], sin_t[pos][None, None]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    class Model(torch.nn.Module):
        def __init__(self, comp):
            super().__init__()
            self.comp = comp
            P = torch.nn.Parameter
            self.emb = P(torch.randn(V, d) * 0.02)
            self.layers = torch.nn.ModuleList()
            for _ in range(L):
                m = torch.nn.Module()
                m.n1, m.n2 = P(torch.ones(d)), P(torch.ones(d))
                m.qn, m.kn = P(torch.ones(hd)), P(torch.ones(hd))
                m.wq, m.wk, m.wv = P(torch.randn(nh * hd, d) * 0.02), P(torch.randn(nkv * hd, d) * 0.02), P(torch.randn(nkv * hd, d) * 0.02)
                m.wo = P(torch.randn(d, nh * hd) * 0.02)
                m.wg, m.wu, m.wd = P(torch.randn(dff, d) * 0.02), P(torch.randn(dff, d) * 0.02), P(torch.randn(d, dff) * 0.02)
                if comp:
                    m.kp, m.vp = P(torch.randn(Wn, nkv * hd, d) * 0.02), P(torch.randn(Wn, nkv * hd, d) * 0.02)
                    m.kg, m.vg = P(torch.randn(Wn, nkv, d) * 0.05), P(torch.randn(Wn, nkv, d) * 0.05)
                    m.kb, m.vb = P(torch.zeros(Wn, nkv)), P(torch.zeros(Wn, nkv))
                self.layers.append(m)
            self.nf = P(torch.ones(d))
            if comp:
                nW = (T - Wn) // Sn + 1
                t = torch.arange(T)[:, None]
                j = torch.arange(nW)[None]
                seen = (j * Sn + Wn - 1) <= t                     # [T, nW]
                tp = torch.arange(T)[None]
                local = (tp <= t) & (tp > t - LW)                 # [T, T]
                self.register_buffer("mask", torch.cat([seen, local], 1), persistent=False)
                self.nW = nW

        def compress(self, a, U, bias, C):  # a [B, T, d] -> pooled [B, nkv, nW, hd]
            B = a.shape[0]
            x = a[:, : self.nW * Sn].reshape(B, self.nW, Wn, d)  # W = S: windows tile the sequence
            z = torch.einsum("bjid,igd->bjgi", x, U) + bias.t()[None, None]
            al = z.float().softmax(-1).to(x.dtype)           # [B, nW, nkv, W]
            Pl = torch.einsum("bjid,ind->bjin", x, C).reshape(B, self.nW, Wn, nkv, hd)
            return torch.einsum("bjgi,bjigh->bgjh", al, Pl)

        def forward(self, tok):
            B = tok.shape[0]
            h = self.emb[tok]
            pos = torch.arange(T, device=tok.device)
            for m in self.layers:
                a = rms(h, m.n1)
                q = (a @ m.wq.t()).view(B, T, nh, hd).transpose(1, 2)
                k = (a @ m.wk.t()).view(B, T, nkv, hd).transpose(1, 2)
                v = (a @ m.wv.t()).view(B, T, nkv, hd).transpose(1, 2)
                q, k = rope(rms(q, m.qn), pos), rope(rms(k, m.kn), pos)
                if self.comp:
                    ck = self.compress(a, m.kg, m.kb, m.kp)
                    cv = self.compress(a, m.vg, m.vb, m.vp)
                    ck = rope(rms(ck, m.kn), torch.arange(self.nW, device=tok.device) * Sn)
                    k, v = torch.cat([ck, k], 2), torch.cat([cv, v], 2)
                    z = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, enable_gqa=True)
                else:
                    z = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                h = h + z.transpose(1, 2).reshape(B, T, nh * hd) @ m.wo.t()
                b = rms(h, m.n2)
                h = h + (F.silu(b @ m.wg.t()) * (b @ m.wu.t())) @ m.wd.t()
            return rms(h, self.nf) @ self.emb.t()

    def fwd_flops(comp):  # bench_common.h forward_flops, B = 1
        per_tok = 2 * d * (nh + 2 * nkv) * hd + 2 * nh * hd * d + 6 * d * dff
        if comp:
            nW = (T - Wn) // Sn + 1
            ent = sum(min(nW, (t - Wn + 1) // Sn + 1 if t >= Wn - 1 else 0) + min(LW, t + 1) for t in range(T))
            cflops = nW * 2 * (2 * Wn * nkv * d + 2 * Wn * d * nkv * hd)
        else:
            ent, cflops = T * (T + 1) / 2, 0
        return L * (per_tok * T + 4 * nh * hd * ent + cflops) + T * 2 * d * V

    out = {"device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu", "torch": torch.__version__, "train": []}
    print(f"torch_gpu_peer: PyTorch {torch.__version__} on {out['device']}; {L} layers, d {d}, {nh}/{nkv} heads, "
          f"head_dim {hd}, d_ff {dff}, vocab {V}, T {T}, batch 1")
    print(f"  {'prec':5s} {'attention':18s} {'step ms':>10s} {'tokens/s':>10s} {'TFLOP/s':>9s} {'loss':>10s}")
    fails = 0
    tok = torch.randint(0, V, (1, T + 1), device=dev)
    for comp in (0, 1):
        for prec in a.precisions.split(","):
            name = "compressed W8/S8" if comp else "full"
            try:
                torch.backends.cuda.matmul.allow_tf32 = prec == "tf32"
                torch.backends.cudnn.allow_tf32 = prec == "tf32"
                torch.manual_seed(0)
                model = Model(comp).to(dev)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=a.device == "cuda")
                times, loss_v = [], float("nan")
                for s in range(a.steps + 1):
                    if a.device == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    with torch.autocast(a.device, dtype=torch.bfloat16, enabled=prec == "bf16"):
                        logits = model(tok[:, :T])
                    loss = F.cross_entropy(logits.float().view(-1, V), tok[0, 1:])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    if a.device == "cuda":
                        torch.cuda.synchronize()
                    if s > 0:
                        times.append(time.perf_counter() - t0)
                    loss_v = loss.item()
                    del logits, loss
                st = sorted(times)[len(times) // 2]
                tf = 3 * fwd_flops(comp) / st / 1e12
                print(f"  {prec:5s} {name:18s} {st * 1e3:10.1f} {T / st:10.0f} {tf:9.1f} {loss_v:10.4f}", flush=True)
                out["train"].append({"precision": prec, "attention": "w8s8" if comp else "full", "step_s": st,
                                     "tokens_per_s": T / st, "tflops": tf, "loss": loss_v})
                del model, opt
                if a.device == "cuda":
                    torch.cuda.empty_cache()
            except Exception as e:  # noqa: BLE001
                fails += 1
                print(f"torch_gpu_peer: FAILED {prec}, {name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    out["failures"] = fails
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""bench_select_decode.py — InfLLM-v2 block-sparse selection (MiniCPM4, core/minicpm/) against dense attention
on the same weights: decode per token at long contexts, the prefill, and the KV cache's memory.

Writes a random MiniCPM4-shaped checkpoint twice (config.json in the published MiniCPMForCausalLM layout with
a sparse_config; model.safetensors written by hand: 8-byte header length, JSON header, float32 data): once
with the model card's selection (kernel 32, stride 16, blocks of 64, topk 64, window 2048 so 32 local
blocks, 1 initial block, dense_len 8192: 96 blocks = 6144 keys per row at most) and once dense (dense_len
above every context: ordinary causal attention). For each checkpoint and context it runs
build/bench/bench_select_decode (a prefill of the context, then decode steps on 1 and 2 threads), and
`phasescope info --model DIR` for the cache's bytes per token. Prints a markdown table and writes the raw
results as JSON (default bench/results/select_decode.json).

The machine is shared: the figures are CPU seconds of the whole process (all threads), wall beside them.

  python3 bench/bench_select_decode.py [--build build] [--contexts 16384,32768] [--decode 16]
      [--hidden 256] [--layers 2] [--out bench/results/select_decode.json] [--quick]
  python3 bench/bench_select_decode.py --table FILE   (the summary and table again from a results file)
  (--quick: context 8192 only, 8 steps, a couple of minutes; the default run takes about 10 minutes on 2 cores)
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile

import numpy as np


def write_safetensors(path, tensors):
    """tensors: name -> float32 array. Header: u64 little-endian length, JSON, then the data (8-byte aligned)."""
    header, off, blobs = {}, 0, []
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def config(hidden, layers, heads, kv_heads, ffn, vocab, max_pos, dense_len):
    half = hidden // heads // 2
    return {
        "architectures": ["MiniCPMForCausalLM"],
        "model_type": "minicpm",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "rope_type": "longrope",
            "long_factor": [1.0 + 0.5 * i for i in range(half)],
            "short_factor": [1.0 + 0.02 * i for i in range(half)],
            "original_max_position_embeddings": 32768,
        },
        "scale_emb": 12.0,
        "scale_depth": 1.4,
        "dim_model_base": 256,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
        "sparse_config": {
            "kernel_size": 32,
            "kernel_stride": 16,
            "init_blocks": 1,
            "block_size": 64,
            "window_size": 2048,
            "topk": 64,
            "use_nope": False,
            "dense_len": dense_len,
        },
    }


def weights(c, seed=1, std=0.02):
    rng = np.random.default_rng(seed)
    d, H, Hk, F, V = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"], c["vocab_size"]
    D = d // H
    t = {"model.embed_tokens.weight": rng.normal(0, std, (V, d)), "model.norm.weight": np.ones(d), "lm_head.weight": rng.normal(0, std, (V, d))}
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        # larger q/k so that attention and selection are not flat on random weights
        t[p + "self_attn.q_proj.weight"] = rng.normal(0, 0.1, (H * D, d))
        t[p + "self_attn.k_proj.weight"] = rng.normal(0, 0.1, (Hk * D, d))
        t[p + "self_attn.v_proj.weight"] = rng.normal(0, std, (Hk * D, d))
        t[p + "self_attn.o_proj.weight"] = rng.normal(0, std, (d, H * D))
        t[p + "mlp.gate_proj.weight"] = rng.normal(0, std, (F, d))
        t[p + "mlp.up_proj.weight"] = rng.normal(0, std, (F, d))
        t[p + "mlp.down_proj.weight"] = rng.normal(0, std, (d, F))
        t[p + "input_layernorm.weight"] = np.ones(d)
        t[p + "post_attention_layernorm.weight"] = np.ones(d)
    return t


def write_checkpoint(dirname, cfg, tensors):
    os.makedirs(dirname, exist_ok=True)
    with open(os.path.join(dirname, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_safetensors(os.path.join(dirname, "model.safetensors"), tensors)


def info_bytes_per_token(ps, d):
    out = subprocess.run([ps, "info", "--model", d], check=True, capture_output=True, text=True).stdout
    m = re.search(r"KV cache \(float32, one sequence\)\n\s+([0-9.]+) bytes/token", out)
    at = {int(a): int(b) for a, b in re.findall(r"T = (\d+)\s+(\d+) bytes", out)}
    blas = re.search(r"^compute\s+(.*)$", out, re.M)
    return float(m.group(1)) if m else None, at, blas.group(1) if blas else ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--contexts", default="16384,32768")
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prefill-threads", type=int, default=2)
    ap.add_argument("--out", default="bench/results/select_decode.json")
    ap.add_argument("--keep", default=None, help="write the checkpoints here (default: a temporary directory)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--table", default=None, help="print the table of a results file written before, and stop")
    a = ap.parse_args()
    if a.table:
        with open(a.table) as f:
            res = json.load(f)
        res["summary"] = summarize(res["runs"], res["threads"])
        report(res)
        return
    if a.quick:
        a.contexts, a.decode = "8192", 8
    ctxs = [int(x) for x in a.contexts.split(",")]
    ps, bench = os.path.join(a.build, "phasescope"), os.path.join(a.build, "bench", "bench_select_decode")
    for p in (ps, bench):
        if not os.access(p, os.X_OK):
            sys.exit("bench_select_decode.py: %s is missing (cmake --build %s)" % (p, a.build))
    tmp = a.keep or tempfile.mkdtemp(prefix="ps_select_bench_")
    max_pos = max(65536, max(ctxs) + 64 * a.decode)
    shape = dict(hidden=a.hidden, layers=a.layers, heads=a.heads, kv_heads=2, ffn=a.hidden * 5 // 2, vocab=1024, max_pos=max_pos)
    cs = config(dense_len=8192, **shape)
    tensors = {k: v.astype(np.float32) for k, v in weights(cs).items()}
    dirs = {"sparse": os.path.join(tmp, "sparse"), "dense": os.path.join(tmp, "dense")}
    write_checkpoint(dirs["sparse"], cs, tensors)
    write_checkpoint(dirs["dense"], config(dense_len=max_pos + 1, **shape), tensors)
    rows, infos = [], {}
    for mode, d in dirs.items():
        infos[mode] = info_bytes_per_token(ps, d)
    for T in ctxs:
        for mode, d in dirs.items():
            cmd = [bench, "--model", d, "--context", str(T), "--decode", str(a.decode), "--threads", a.threads,
                   "--prefill-threads", str(a.prefill_threads)]
            r = subprocess.run(cmd, check=True, capture_output=True, text=True)
            sys.stderr.write(r.stderr)
            row = json.loads(r.stdout)
            row["mode"] = mode
            bpt = infos[mode][0]
            row["info_bytes_per_token"] = bpt
            row["info_bytes_at_length"] = None if bpt is None else round(bpt * row["length"])
            rows.append(row)
    thr = [int(x) for x in a.threads.split(",")]
    table = summarize(rows, thr)
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    res = {
        "bench": "bench/bench_select_decode.py",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "load_average_at_end": load, "platform": platform.platform(),
                    "blas": infos["sparse"][2]},
        "shape": dict(shape, head_dim=a.hidden // a.heads, kernel_size=32, kernel_stride=16, block_size=64, topk=64,
                      window_size=2048, init_blocks=1, dense_len_sparse=8192, dense_len_dense=max_pos + 1, dtype="F32"),
        "decode_steps": a.decode, "threads": thr, "prefill_threads": a.prefill_threads,
        "note": "CPU seconds of the whole process (all threads; CLOCK_PROCESS_CPUTIME_ID) on a shared machine; wall beside",
        "summary": table, "runs": rows}
    if a.out:
        os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    report(res)
    if a.out:
        print("raw results: %s" % a.out)


def summarize(rows, thr):
    """per context: decode ms per token (CPU, wall) and the dense / sparse ratios per thread count, the prefill,
    and the cache's memory (the resident pages of its arrays, the process's RSS growth, `info`'s figure)"""
    by = {(r["mode"], r["context"]): r for r in rows}
    table = []
    for T in sorted({r["context"] for r in rows}):
        s, dn = by[("sparse", T)], by[("dense", T)]
        ent = {"context": T}
        for k, t in enumerate(thr):
            sd, dd = s["decode"][k], dn["decode"][k]
            ent["decode_ms_cpu_sparse_%dt" % t], ent["decode_ms_cpu_dense_%dt" % t] = 1e3 * sd["cpu_s_per_token"], 1e3 * dd["cpu_s_per_token"]
            ent["decode_ms_wall_sparse_%dt" % t], ent["decode_ms_wall_dense_%dt" % t] = 1e3 * sd["wall_s_per_token"], 1e3 * dd["wall_s_per_token"]
            ent["decode_speedup_cpu_%dt" % t] = dd["cpu_s_per_token"] / sd["cpu_s_per_token"]
            ent["decode_speedup_wall_%dt" % t] = dd["wall_s_per_token"] / sd["wall_s_per_token"]
        ent["prefill_cpu_s_sparse"], ent["prefill_cpu_s_dense"] = s["prefill_cpu_s"], dn["prefill_cpu_s"]
        ent["prefill_wall_s_sparse"], ent["prefill_wall_s_dense"] = s["prefill_wall_s"], dn["prefill_wall_s"]
        ent["prefill_speedup_cpu"] = dn["prefill_cpu_s"] / s["prefill_cpu_s"]
        for mode, r in (("sparse", s), ("dense", dn)):
            info = r.get("info_bytes_at_length")
            res = r.get("cache_resident_bytes", r["rss_delta_bytes"])
            ent["cache_resident_mib_" + mode] = res / 2**20
            ent["cache_rss_growth_mib_" + mode] = r["rss_delta_bytes"] / 2**20
            ent["cache_info_mib_" + mode] = (info or 0) / 2**20
            ent["cache_resident_over_info_" + mode] = res / info if info else None
        table.append(ent)
    return table


def report(res):
    thr, table, sh = res["threads"], res["summary"], res["shape"]
    print("select decode bench: hidden %d, %d layers, %d heads / %d KV heads x %d, %s; %s, %d cores, load %s" %
          (sh["hidden"], sh["layers"], sh["heads"], sh["kv_heads"], sh["head_dim"], res["date"], res["machine"]["cpu"],
           res["machine"]["cores"], "%.1f" % res["machine"]["load_average_at_end"][0] if res["machine"]["load_average_at_end"] else "?"))
    hdr = "| context | " + " | ".join("decode ms/token CPU sparse / dense (%d thr) | speedup" % t for t in thr) + \
        " | prefill CPU s sparse / dense | speedup | cache MiB sparse: resident / info | dense: resident / info |"
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    for e in table:
        cells = ["%dK" % (e["context"] // 1024)]
        for t in thr:
            cells.append("%.2f / %.2f" % (e["decode_ms_cpu_sparse_%dt" % t], e["decode_ms_cpu_dense_%dt" % t]))
            cells.append("%.2fx" % e["decode_speedup_cpu_%dt" % t])
        cells.append("%.1f / %.1f" % (e["prefill_cpu_s_sparse"], e["prefill_cpu_s_dense"]))
        cells.append("%.2fx" % e["prefill_speedup_cpu"])
        for mode in ("sparse", "dense"):
            cells.append("%.2f / %.2f" % (e["cache_resident_mib_" + mode], e["cache_info_mib_" + mode]))
        print("| " + " | ".join(cells) + " |")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()

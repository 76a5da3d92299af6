#!/usr/bin/env python3
"""The side-by-side table of the weak-phase mitigations (docs/results.md "Closing the weak phase").

usage: scripts/phasefix_summary.py LABEL=RUN_DIR:SWEEP.json [...] > table.md

One row per model: the sweep's mean accuracy, worst residue (and which), gap, chi-square p, repeat
period; KV bytes per token from the model config; from RUN_DIR/train.jsonl the first step whose held-out
accuracy is >= 0.6, the last step, the held-out accuracy there and the training time (the sum over the
train records of tokens / tokens_per_s, so waiting between resumed chunks does not count). Reads only the
files; computes nothing the instruments did not write except those sums.
"""
import json
import sys


def kv_bytes(cfg):
    att = cfg["attention"]
    per = 2 * 4 * cfg["n_layers"] * cfg["n_kv_heads"] * cfg["head_dim"]
    return per / att["stride"] if att.get("kind") == "compressed" else per


def tokens_per_step(run):
    """batch_size x seq_len from the checkpoint's safetensors metadata (phasescope.train: the canonical
    training config)."""
    import struct
    with open(f"{run}/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        meta = json.loads(f.read(n)).get("__metadata__", {})
    tr = json.loads(meta["phasescope.train"])
    return tr["train"]["batch_size"] * tr["task"]["seq_len"]


def train_stats(run):
    first06, last_step, last_acc, secs, tokens_per_step = None, 0, float("nan"), 0.0, None
    try:
        cfg = json.load(open(f"{run}/config.json"))
    except OSError:
        cfg = None
    prev = None
    init = None
    with open(f"{run}/train.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "init":
                init = r.get("from")
            if r.get("type") == "eval":
                if first06 is None and r["accuracy"] >= 0.6 and r["step"] > 0:
                    first06 = r["step"]
                last_step, last_acc = r["step"], r["accuracy"]
            if r.get("type") == "train" and r.get("tokens_per_s", 0) > 0:
                steps = r["step"] - (prev if prev is not None else 0)
                prev = r["step"]
                tok = TOKENS.get(run)
                if tok:
                    secs += steps * tok / r["tokens_per_s"]
    return cfg, first06, last_step, last_acc, secs, init


TOKENS = {}


def main():
    rows = []
    for arg in sys.argv[1:]:
        label, rest = arg.split("=", 1)
        run, sweep = rest.split(":", 1)
        d = json.load(open(sweep))
        c, prov = d["curve"], d["provenance"]
        TOKENS[run] = tokens_per_step(run)
        cfg, first06, last_step, last_acc, secs, init = train_stats(run)
        res = c["residues"]
        worst = min(range(len(res)), key=lambda r: res[r]["accuracy"] if res[r]["n"] else 2)
        rp = c.get("repeat_period", {}).get("period")
        p = c["chi_square"]["p_value"]
        rows.append((label, prov["config"], c, worst, rp, p, first06, last_step, last_acc, secs, init))
    print("| model | P | mean acc | worst residue (ρ) | gap (pp) | chi-square p | repeats every | KV B/token | "
          "held-out ≥ 0.6 at step | trained to step (held-out) | train time |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, cfg, c, worst, rp, p, f06, ls, la, secs, init in rows:
        ptxt = "< 1e-300" if p == 0 else f"{p:.2g}"
        f06t = str(f06) if f06 is not None else "not reached"
        tt = f"{secs / 60:.0f} min" if secs > 0 else "—"
        print(f"| {label} | {len(c['residues'])} | {c['mean_accuracy']:.3f} | {c['min_accuracy']:.3f} ({worst}) | "
              f"{c['gap_pp']:.1f} | {ptxt} | {rp if rp is not None else 'none'} | {kv_bytes(cfg):.0f} | {f06t} | "
              f"{ls} ({la:.3f}) | {tt} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The one table of docs/results.md "The weak phase across designs" (issue 46), from scripts/measure_across.sh.

usage: scripts/across_table.py OUT MODEL [MODEL ...] > table.md

One row per model, read from OUT/MODEL/p{8,16,24}[_move]/sweep.json, OUT/MODEL/info.txt (`phasescope info`)
and data/models/MODEL/train.jsonl:
- design: the sweep's attention label;
- train steps: the last evaluated step; a model trained on from another checkpoint's weights (its train.jsonl
  starts with an "init" record) counts that checkpoint's steps too, written R + C: R from data/models/MODEL_rule
  (its stopped_at, else its last evaluated step) or data/models/MODEL/rule_step;
- held-out: the last evaluation's held-out accuracy in training;
- at P = 8 (pad): mean accuracy, worst residue (which), gap, chi-square p, repeat period;
- the gap at P = 16 and 24 (pad) and at 8 and 24 in move mode;
- KV bytes per token of the cache the model decodes with (`phasescope info`'s line for its own attention);
- target: issue 46's, gap <= 10 pp at P = 8 and at P = 24 (pad) at <= 1.25x the base W8/S8's 768 B/token.
Computes nothing the instruments did not write except the step sums and the verdict.
"""
import json
import os
import re
import sys

BASE_BYTES = 768.0


def sweep(out, model, name):
    path = os.path.join(out, model, name, "sweep.json")
    if not os.path.exists(path):
        return None
    return json.load(open(path))


def evals(run):
    rows, init = [], None
    with open(os.path.join(run, "train.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("type") == "init":
                init = r.get("from")
            elif r.get("type") == "eval":
                rows.append(r)
    return rows, init


def rule_steps(model):
    rule = f"data/models/{model}_rule"
    for path in (os.path.join(rule, "stopped_at"), f"data/models/{model}/rule_step"):
        if os.path.exists(path):
            return int(open(path).read().strip())
    if os.path.exists(os.path.join(rule, "train.jsonl")):
        return evals(rule)[0][-1]["step"]
    return None


def steps(model):
    rows, init = evals(f"data/models/{model}")
    last = rows[-1]
    if init is None:
        return str(last["step"]), last["accuracy"]
    r = rule_steps(model)
    return (f"{r} + {last['step']}" if r is not None else f"? + {last['step']}"), last["accuracy"]


def kv_bytes(out, model):
    """The bytes/token of the model's own attention: info's line after 'full attention', else full's."""
    lines = open(os.path.join(out, model, "info.txt")).read().splitlines()
    vals = [(l, float(m.group(1))) for l in lines for m in [re.search(r"([0-9.]+) bytes/token", l)] if m]
    own = [v for l, v in vals if not l.strip().startswith("full attention")]
    return own[0] if own else vals[0][1]


def gap(s):
    return "—" if s is None else f"{s['curve']['gap_pp']:.1f}"


def fmt_p(p):
    return "< 1e-300" if p == 0 else f"{p:.2g}"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, models = sys.argv[1], sys.argv[2:]
    print("| model | design | train steps | held-out | mean (P 8) | worst residue (ρ) | gap P 8 | gap P 16 "
          "| gap P 24 | gap P 8 move | gap P 24 move | chi-square p (P 8) | repeats every (P 8) | KV B/token "
          "| target |")
    print("|" + "---|" * 15)
    for m in models:
        s8, s16, s24 = (sweep(out, m, f"p{p}") for p in (8, 16, 24))
        m8, m24 = sweep(out, m, "p8_move"), sweep(out, m, "p24_move")
        c = s8["curve"]
        worst = min(c["residues"], key=lambda r: r["accuracy"])
        rep = c["repeat_period"]["period"]
        kv = kv_bytes(out, m)
        st, acc = steps(m)
        ok = (c["gap_pp"] <= 10 and s24 is not None and s24["curve"]["gap_pp"] <= 10
              and kv <= 1.25 * BASE_BYTES)
        label = s8["provenance"].get("label", "")
        print(f"| {m} | {label} | {st} | {acc:.3f} | {c['mean_accuracy']:.3f} | {worst['accuracy']:.3f} "
              f"({worst['rho']}) | {gap(s8)} | {gap(s16)} | {gap(s24)} | {gap(m8)} | {gap(m24)} "
              f"| {fmt_p(c['chi_square']['p_value'])} | {rep if rep is not None else 'none'} | {kv:.0f} "
              f"| {'meets' if ok else 'misses'} |")


if __name__ == "__main__":
    main()

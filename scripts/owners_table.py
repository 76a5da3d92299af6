#!/usr/bin/env python3
"""owners_table.py — who owns each phase residue, from `phasescope knockout` results.

Usage: owners_table.py KNOCKOUT.json [KNOCKOUT.json ...]

For every knockout.json (the exact grid of every layer and KV head) prints one row per residue ρ: the clean
accuracy, then every head whose knockout takes more than 5 pp from that residue (layer, head, Δ pp), largest
first, and the share of the residue's clean accuracy the largest one removes. A residue with one head near
100 % has one owner; several heads at a few tens of pp each mean candidates that share it.
"""
import json
import sys

MIN_PP = 5.0


def owners(path):
    d = json.load(open(path))
    g = d["grid"]
    model = d["provenance"].get("model", path)
    clean = {r["rho"]: r["accuracy"] for r in g["clean"]["residues"]}
    rows = []
    for rho in sorted(clean):
        hits = []
        for c in g["cells"]:
            for r in c["residues"]:
                if r["rho"] == rho and -r["delta_accuracy_pp"] > MIN_PP:
                    hits.append((r["delta_accuracy_pp"], c["layer"], c["head"]))
        hits.sort()
        share = -hits[0][0] / (100.0 * clean[rho]) if hits and clean[rho] > 0 else 0.0
        rows.append((rho, clean[rho], hits, share))
    return model, rows


def main(argv):
    if len(argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    for path in argv[1:]:
        model, rows = owners(path)
        print(f"{model}")
        print("| ρ | clean acc | heads whose knockout takes > 5 pp | largest's share of the residue |")
        print("|---|---|---|---|")
        for rho, acc, hits, share in rows:
            h = ", ".join(f"L{l} h{k} ({pp:+.1f})" for pp, l, k in hits) or "none"
            print(f"| {rho} | {acc:.3f} | {h} | {100 * share:.0f} % |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

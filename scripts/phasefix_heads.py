#!/usr/bin/env python3
"""Per KV head of a knockout.json (and, with --gates, its gates.json): the residue its knockout hurts
most (the largest accuracy drop, pp) and every residue it drops by more than 20 pp; the grid offset and
the key/value gate peaks (gate offset i of a head with grid offset o is absolute phase (o + i) mod S).
usage: scripts/phasefix_heads.py KNOCKOUT.json [GATES.json]"""
import json
import sys

ko = json.load(open(sys.argv[1]))["grid"]
gates = json.load(open(sys.argv[2]))["gates"] if len(sys.argv) > 2 else None
S = gates["stride"] if gates else None
print("| layer | KV head | grid offset | key peak (abs.) | value peak (abs.) | worst residue (Δacc pp) | residues hurt > 20 pp |")
print("|---|---|---|---|---|---|---|")
for c in ko["cells"]:
    res = c["residues"]
    worst = min(res, key=lambda r: r["delta_accuracy_pp"])
    hurt = [str(r["rho"]) for r in res if r["delta_accuracy_pp"] < -20]
    go, kp, vp = "", "", ""
    if gates:
        h = gates["layers"][c["layer"]]["heads"][c["head"]]
        o = h.get("grid_offset", 0)
        go = str(o)
        kp = f"{h['key']['peak']} ({(o + h['key']['peak']) % S})"
        vp = f"{h['value']['peak']} ({(o + h['value']['peak']) % S})"
    print(f"| {c['layer']} | {c['head']} | {go} | {kp} | {vp} | {worst['rho']} ({worst['delta_accuracy_pp']:.1f}) | {', '.join(hurt) or '—'} |")

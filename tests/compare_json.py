#!/usr/bin/env python3
"""compare_json.py A.json B.json [--tol X] — the numbers of two result files, provenance aside.

Every key named "provenance" (and "compute", which names the split) is dropped at any depth; the rest
must have the same keys, the same strings, integers and booleans, and reals equal (--tol 0, the
default: bit for bit) or within X absolute + X relative (a knockout grid without "method" is "exact", as
the validator reads it). Prints the first differences; exit 1 on any."""
import json, math, sys

DROP = {"provenance"}

def walk(a, b, path, tol, out):
    if len(out) >= 8:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        ka = {k for k in a if k not in DROP}
        kb = {k for k in b if k not in DROP}
        for k in sorted(ka ^ kb):
            out.append(f"{path}.{k}: only in {'A' if k in ka else 'B'}")
        for k in sorted(ka & kb):
            walk(a[k], b[k], f"{path}.{k}", tol, out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} vs {len(b)} items")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            walk(x, y, f"{path}[{i}]", tol, out)
    elif isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or a is None or b is None:
        if a != b:
            out.append(f"{path}: {a!r} vs {b!r}")
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            if a != b:
                out.append(f"{path}: {a} vs {b}")
        elif tol == 0:
            if not (a == b or (math.isnan(a) and math.isnan(b))):
                out.append(f"{path}: {a!r} vs {b!r}")
        elif abs(a - b) > tol + tol * max(abs(a), abs(b)):
            out.append(f"{path}: {a!r} vs {b!r} (tolerance {tol})")
    elif a != b:
        out.append(f"{path}: {a!r} vs {b!r}")

def main():
    args = sys.argv[1:]
    tol = 0.0
    if "--tol" in args:
        i = args.index("--tol")
        tol = float(args[i + 1])
        del args[i:i + 2]
    if len(args) != 2:
        sys.exit("usage: compare_json.py A.json B.json [--tol X]")
    with open(args[0]) as f:
        a = json.load(f)
    with open(args[1]) as f:
        b = json.load(f)
    # a knockout grid written before grid.method existed is an exact one
    for d in (a, b):
        g = d.get("grid") if isinstance(d, dict) else None
        if isinstance(g, dict) and d.get("kind") == "knockout":
            g.setdefault("method", "exact")
    out = []
    walk(a, b, "$", tol, out)
    for line in out:
        print("  " + line)
    sys.exit(1 if out else 0)

if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""long_functions.py [--max N] [--self-test] SRC_DIR — list the C functions longer than N lines (default 150)
in the non-test sources (the layers' folders; not tests/, third_party/, build*/) and exit 1 when there is one.

A function is a top-level definition: a `{` at brace depth 0 whose preceding code ends in `)` (an initialiser
`= {`, a struct/enum/union body, `extern "C" {` are not functions). Its length counts the lines from the
line of its name to the line of its closing `}`, both included. Comments, strings and character literals are
blanked before the braces are matched, so a brace inside them does not count; preprocessor lines are skipped.
"""
import os
import re
import sys

LAYERS = ["core", "interventions", "instruments", "api", "cli", "viz", "serve", "probe", "train", "text",
          "gates", "scaleout", "tasks"]
SKIP_DIRS = {"third_party", "tests"}
EXTS = (".c", ".h", ".cu")


def blank(src):
    """src with comments, string and char literals replaced by spaces (newlines kept, so lines still count)."""
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c == "/" and i + 1 < n and src[i + 1] == "*":
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == "/" and i + 1 < n and src[i + 1] == "/":
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + re.sub(r"[^\n]", " ", src[i + 1:j - 1]) + c if j - i >= 2 else src[i:j])
            i = j
        else:
            out.append(c)
            i += 1
    text = "".join(out)
    # preprocessor lines (with their continuations) carry no function braces
    lines = text.split("\n")
    k = 0
    while k < len(lines):
        if lines[k].lstrip().startswith("#"):
            while k < len(lines):
                cont = lines[k].rstrip().endswith("\\")
                lines[k] = ""
                k += 1
                if not cont:
                    break
        else:
            k += 1
    return "\n".join(lines)


NAME_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\($")


def functions(src):
    """(name, first line, last line) of each top-level function definition in src (1-based lines)."""
    text = blank(src)
    found = []
    depth = 0
    stmt_start = 0  # where the current top-level declaration began (after the last ; or } at depth 0)
    body_start = None
    head = None
    i = 0
    for i, c in enumerate(text):
        if c == "{":
            if depth == 0:
                head = text[stmt_start:i]
                body_start = i
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0 and head is not None:
                h = head.rstrip()
                if h.endswith(")") and not re.search(r"=\s*$", h):
                    # the name: the identifier before the parenthesis that matches the last `)`
                    d, j = 0, len(h) - 1
                    while j >= 0:
                        if h[j] == ")":
                            d += 1
                        elif h[j] == "(":
                            d -= 1
                            if d == 0:
                                break
                        j -= 1
                    m = NAME_RE.search(h[:j + 1]) if j >= 0 else None
                    if m and m.group(1) not in ("if", "while", "for", "switch", "return", "sizeof"):
                        name_pos = stmt_start + m.start(1)
                        first = text.count("\n", 0, name_pos) + 1
                        last = text.count("\n", 0, i) + 1
                        found.append((m.group(1), first, last))
                head = None
                stmt_start = i + 1
        elif c == ";" and depth == 0:
            stmt_start = i + 1
    return found


def scan(root, limit):
    long = []
    for layer in LAYERS:
        top = os.path.join(root, layer)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build"))
            for f in sorted(filenames):
                if not f.endswith(EXTS):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    src = fh.read()
                for name, first, last in functions(src):
                    n = last - first + 1
                    if n > limit:
                        long.append((os.path.relpath(path, root), first, name, n))
    return long


SELF_TEST = r'''
#define BRACE {
static const int T[] = { 1, 2, 3 };
struct s { int a; };
/* int fake(void) { */
static int small(int a) { return a ? 1 : 0; }
int big(const char *s,
        int n)
{
    const char *q = "}}}{";
    char c = '}';
    int k = 0;
''' + "    k += n;\n" * 150 + r'''    return k + (s[0] == c) + (q[0] == '{');
}
'''


def self_test():
    """the parser on SELF_TEST (braces in strings, comments, initialisers and macros ignored), then a made-up
    tree: the long function in core/ is named, the same file under tests/ and core/third_party/ is not"""
    import tempfile
    got = functions(SELF_TEST)
    names = {name: last - first + 1 for name, first, last in got}
    ok = set(names) == {"small", "big"} and names["small"] == 1 and names["big"] == 158
    with tempfile.TemporaryDirectory() as t:
        for sub in ("core", "tests", os.path.join("core", "third_party")):
            os.makedirs(os.path.join(t, sub), exist_ok=True)
            with open(os.path.join(t, sub, "big.c"), "w") as fh:
                fh.write(SELF_TEST)
        found = scan(t, 150)
        ok = ok and found == [(os.path.join("core", "big.c"), 7, "big", 158)] and scan(t, 158) == []
    print("long_functions --self-test:", "functions found and counted" if ok else "FAILED: %r" % (got,))
    return 0 if ok else 1


def main(argv):
    limit = 150
    args = list(argv)
    if "--self-test" in args:
        return self_test()
    if "--max" in args:
        k = args.index("--max")
        limit = int(args[k + 1])
        del args[k:k + 2]
    if len(args) != 1:
        print(__doc__.strip().split("\n")[0], file=sys.stderr)
        return 2
    long = scan(args[0], limit)
    for path, line, name, n in long:
        print("%s:%d: %s is %d lines (over %d): split it into named helpers" % (path, line, name, n, limit))
    if long:
        print("%d function(s) over %d lines" % (len(long), limit))
        return 1
    print("no function over %d lines outside tests" % limit)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

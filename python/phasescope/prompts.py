"""prompts.py — a caller's own prompts for the instruments (knockout, sweep): ps.PromptSet.

    ps.PromptSet(tokens, query, answer, residue, alt=None, needle=None)

tokens int [N, T] (one length per set), query int [N] (the position whose next-token prediction is scored,
0 <= query < T), answer int [N] (the expected token there), residue int [N] (the phase label, 0 <= residue < P;
P = period= or max + 1), alt int [N] optional (a second answer: the logit difference answer - alt is reported
beside the NLL), needle int [N] optional (the position of the fact the query retrieves, 0 <= needle <= query:
what ps.recall asks about — is the needle's block among the blocks the model selects). ps.knockout(model, prompts=ps_set, ...) and ps.sweep(model, prompts=ps_set) run on it, as
`phasescope knockout --prompts FILE` runs on the same records as JSON lines (.save(FILE) writes them,
PromptSet.load(FILE) reads them). docs/prompt-sets.md."""
import json
import os

import numpy as np

from .errors import PhasescopeError


def _ints(name, x, ndim):
    a = np.asarray(x)
    if a.dtype == object or (a.size and not np.issubdtype(a.dtype, np.integer)):
        raise PhasescopeError(f"PromptSet: {name} must be integers (got {a.dtype})")
    if a.ndim != ndim:
        raise PhasescopeError(f"PromptSet: {name} must be {ndim}-d (got shape {a.shape})")
    if a.size and a.min() < 0:
        raise PhasescopeError(f"PromptSet: {name} has a negative value ({int(a.min())})")
    return a.astype(np.int64)


class PromptSet:
    """N prompts of T tokens, each scored at one position (see the module's doc)."""

    def __init__(self, tokens, query, answer, residue, alt=None, needle=None):
        self.tokens = _ints("tokens", tokens, 2)
        n, t = self.tokens.shape
        if n == 0 or t == 0:
            raise PhasescopeError(f"PromptSet: tokens is empty (shape {self.tokens.shape})")
        cols = {"query": query, "answer": answer, "residue": residue}
        if alt is not None:
            cols["alt"] = alt
        if needle is not None:
            cols["needle"] = needle
        for k, v in cols.items():
            a = _ints(k, v, 1)
            if a.shape[0] != n:
                raise PhasescopeError(f"PromptSet: {k} has {a.shape[0]} entries for {n} prompts")
            setattr(self, k, a)
        if alt is None:
            self.alt = None
        if needle is None:
            self.needle = None
        bad = np.nonzero(self.query >= t)[0]
        if bad.size:
            i = int(bad[0])
            raise PhasescopeError(f"PromptSet: prompt {i}: query {int(self.query[i])} is past the tokens (0 <= query < {t})")
        if self.needle is not None:
            bad = np.nonzero(self.needle > self.query)[0]
            if bad.size:
                i = int(bad[0])
                raise PhasescopeError(f"PromptSet: prompt {i}: needle {int(self.needle[i])} is after the query "
                                      f"(0 <= needle <= query = {int(self.query[i])})")

    def __len__(self):
        return self.tokens.shape[0]

    @property
    def period(self):
        """max(residue) + 1: the period when none is given."""
        return int(self.residue.max()) + 1

    def records(self):
        """The prompts as the records of --prompts FILE (and of the API's "prompts" request key)."""
        out = []
        for i in range(len(self)):
            r = {"tokens": self.tokens[i].tolist(), "query": int(self.query[i]), "answer": int(self.answer[i]),
                 "residue": int(self.residue[i])}
            if self.alt is not None:
                r["alt"] = int(self.alt[i])
            if self.needle is not None:
                r["needle"] = int(self.needle[i])
            out.append(r)
        return out

    def save(self, path):
        """Write the set as JSON lines (what `--prompts FILE` reads)."""
        with open(os.fspath(path), "w") as f:
            for r in self.records():
                f.write(json.dumps(r) + "\n")

    @classmethod
    def load(cls, path):
        """Read a JSON-lines prompt set (the CLI's --prompts FILE)."""
        rows = []
        with open(os.fspath(path)) as f:
            for line in f:
                if line.strip():
                    rows.append(json.loads(line))
        if not rows:
            raise PhasescopeError(f"{path}: no prompts")
        alt = [r["alt"] for r in rows] if "alt" in rows[0] else None
        needle = [r["needle"] for r in rows] if "needle" in rows[0] else None
        return cls([r["tokens"] for r in rows], [r["query"] for r in rows], [r["answer"] for r in rows],
                   [r["residue"] for r in rows], alt, needle)

    def __repr__(self):
        n, t = self.tokens.shape
        return f"PromptSet(N={n}, T={t}, period={self.period}{', alt' if self.alt is not None else ''}{', needle' if self.needle is not None else ''})"

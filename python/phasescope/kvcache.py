"""kvcache.py — model.kv_cache() and model.generate(): the C API's KV cache (ps_api_cache_*, docs/api.md
"The KV cache") as a KVCache, and generation (ps_api_generate: greedy or sampled, several prompts, cache
edits).

    with model.kv_cache() as kv:
        s = kv.add()
        logits = kv.append(s, prompt)                       # [n, vocab]: the prefill
        kv.edit("blocks.0.attn.cache_ck", head=3, j=0)      # zero entry 0 of KV head 3 from now on
        logits = kv.append(s, [int(logits[-1].argmax())])   # one decode step

The cache uses its model (one call at a time per model, as every run); closing the model frees its caches
(a freed cache's calls raise)."""
import ctypes
import weakref

import numpy as np

from . import _lib
from .errors import PhasescopeError
from ._run import _as_tokens, _HookRun


class KVCache:
    """Sequences that grow by appends, each append returning the logits of the new positions; the cache's
    entries (blocks.{l}.attn.cache_ck / cache_cv; DeepSeek-V4 layers.{L}.attn.cache_kv / cache_ik) read
    with .entry and edited with .edit between steps."""

    def __init__(self, model):
        self.model = model
        h = ctypes.c_void_p()
        err = _lib.errbuf()
        with model._running() as mh:
            _lib.check(_lib.lib.ps_api_cache_new(mh, ctypes.byref(h), err, _lib.ERRLEN), err)
        self._h = h
        if not hasattr(model, "_caches"):
            model._caches = weakref.WeakSet()
        model._caches.add(self)  # Model.close frees it first

    # ---- lifetime ----
    def free(self):
        if getattr(self, "_h", None):
            _lib.lib.ps_api_cache_free(self._h)
            self._h = None

    close = free

    def __del__(self):
        self.free()  # (closing the model frees it first: it is in model._caches)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def _handle(self):
        if not self._h:
            raise PhasescopeError("the KV cache is freed (by .free(), its with block, or closing its model)")
        if not getattr(self.model, "_h", None):
            raise PhasescopeError(f"{self.model.path}: the model is closed (free its KV caches first)")
        return self._h

    def _call(self, fn, *args):
        err = _lib.errbuf()
        h = self._handle()
        with self.model._running():
            rc = fn(h, *args, err, _lib.ERRLEN)
        _lib.check(rc, err)

    # ---- sequences ----
    def add(self):
        """A new empty sequence: its id."""
        s = ctypes.c_int()
        self._call(_lib.lib.ps_api_cache_add, ctypes.byref(s))
        return s.value

    def fork(self, seq):
        """A new sequence sharing everything of sequence seq (copy on write): its id."""
        s = ctypes.c_int()
        self._call(_lib.lib.ps_api_cache_fork, int(seq), ctypes.byref(s))
        return s.value

    def drop(self, seq):
        """Drop sequence seq and its pages."""
        self._call(_lib.lib.ps_api_cache_drop, int(seq))

    def truncate(self, seq, T):
        """Cut sequence seq back to its first T tokens."""
        self._call(_lib.lib.ps_api_cache_truncate, int(seq), int(T))

    def len(self, seq):
        """The tokens of sequence seq."""
        n = _lib.lib.ps_api_cache_len(self._handle(), int(seq))
        if n < 0:
            raise PhasescopeError(f"KV cache: no sequence {seq}", code=_lib.EINPUT)
        return int(n)

    @property
    def nbytes(self):
        """Bytes the cache holds now (pages, each shared page once, and tables)."""
        return int(_lib.lib.ps_api_cache_bytes(self._handle()))

    def append(self, seq, tokens, fwd_hooks=()):
        """Append tokens (a 1-d list or array of ids) to sequence seq and run them: the logits [n, vocab]
        (float32) of the new positions. fwd_hooks as run_with_hooks takes them (T = the appended tokens;
        a compressed entry's points fire when its window closes)."""
        toks = _as_tokens(tokens)
        if toks.shape[0] != 1:
            raise PhasescopeError(f"append: one sequence's tokens (1-d), got shape {list(toks.shape)}")
        n = toks.shape[1]
        logits = np.empty((n, self.model.vocab_size), np.float32)
        run = _HookRun(self.model, fwd_hooks)
        try:
            err = _lib.errbuf()
            h = self._handle()
            with self.model._running():
                rc = _lib.lib.ps_api_cache_append(h, int(seq), toks.ctypes.data_as(_lib.c_int32_p), n, run.h,
                                                  logits.ctypes.data_as(_lib.c_float_p), err, _lib.ERRLEN)
            if rc:
                run.raise_failure(rc, err)
        finally:
            run.close()
        return logits

    # ---- the entries ----
    def width(self, name):
        """The floats of one entry at cache point `name`."""
        w = _lib.lib.ps_api_cache_entry_width(self._handle(), _lib.enc(name))
        if w < 0:
            raise PhasescopeError(f"{name}: not a KV cache point of this model (blocks.{{l}}.attn.cache_ck / cache_cv; "
                                  "DeepSeek-V4: layers.{L}.attn.cache_kv / cache_ik of a layer with compressed entries)",
                                  code=_lib.EINPUT)
        return int(w)

    def n_entries(self, seq, layer, head):
        """The compressed entries sequence seq holds at (layer, KV head)."""
        n = _lib.lib.ps_api_cache_n_entries(self._handle(), int(seq), int(layer), int(head))
        if n < 0:
            raise PhasescopeError(f"KV cache: no sequence {seq}", code=_lib.EINPUT)
        return int(n)

    def entry(self, seq, name, head, j):
        """Entry j of KV head `head` at cache point `name` of sequence seq, as a float32 ndarray [width]."""
        out = np.empty(self.width(name), np.float32)
        self._call(_lib.lib.ps_api_cache_entry, int(seq), _lib.enc(name), int(head), int(j), out.ctypes.data_as(_lib.c_float_p))
        return out

    def edit(self, name, head, j, value=None, seq=-1):
        """Edit entry j of KV head `head` at cache point `name` for the rest of the cache's life: zero it
        (value None) or set it to value (an ndarray [width]: e.g. the mean of the entries, mean
        replacement); in sequence seq, or every sequence (-1, those added later too)."""
        vec = None
        if value is not None:
            v = np.ascontiguousarray(value, dtype=np.float32)
            w = self.width(name)
            if v.shape != (w,):
                raise PhasescopeError(f"{name}: edit value of shape {list(v.shape)}, an entry is [{w}]", code=_lib.EINPUT)
            vec = v.ctypes.data_as(_lib.c_float_p)
        self._call(_lib.lib.ps_api_cache_edit, int(seq), _lib.enc(name), int(head), int(j),
                   b"zero" if value is None else b"set", vec)


def _edit_json(e):
    """One edit of generate's edits as ps_api_generate's JSON: (name, head, j) zero, (name, head, j, "mean")
    mean replacement over the prompts, (name, head, j, value) set to value ([width] numbers)."""
    if not isinstance(e, (tuple, list)) or len(e) not in (3, 4) or not isinstance(e[0], str):
        raise PhasescopeError(f"generate: an edit is (name, head, j), (name, head, j, \"mean\") or (name, head, j, value), "
                              f"not {e!r}", code=_lib.EINPUT)
    name, head, j = e[0], int(e[1]), int(e[2])
    if len(e) == 3 or isinstance(e[3], str):  # "zero" or "mean" (the C side names anything else)
        return f"{name}:{head}:{j}:{e[3] if len(e) == 4 else 'zero'}"
    v = np.asarray(e[3], dtype=np.float32)
    if v.ndim != 1:
        raise PhasescopeError(f"generate: edit {name}:{head}:{j}: value of shape {list(v.shape)}, an entry is 1-d",
                              code=_lib.EINPUT)
    return {"point": name, "head": head, "entry": j, "value": [float(x) for x in v]}  # float32 -> double: exact


def generate(model, tokens, max_tokens=16, edits=(), fwd_hooks=(), temperature=0.0, top_p=1.0, seed=0, progress=None,
             stop=()):
    """Generation through a KV cache (ps_api_generate: the CLI's `generate`). tokens: one prompt (1-d ids)
    or several (a list of 1-d ids, or a 2-d array), generated together; or text (a str, or a list of str)
    with model.tokenizer, as the CLI's --prompt (encoded with its special tokens; the new tokens decoded
    without them), which returns text in place of ids. Every prompt is prefilled, the edits made, then
    max_tokens new tokens decoded for each, stopping at the model's context length (model.n_ctx). Greedy
    (the first maximum of the logits) by default; temperature > 0 samples from softmax(logits / temperature)
    within the nucleus top_p, with seed. edits, from the first generated token on: (name, head, j) zeroes entry
    j of a cache point, (name, head, j, "mean") replaces it with its mean over the prompts that hold it,
    (name, head, j, value) sets it to value. stop: token ids (e.g. the EOS id) after which a sequence stops
    (the token kept). fwd_hooks fire during every append, a sequence at a time.
    progress: fn(tokens so far, max_tokens). Returns (new token ids, their log-probabilities under the
    model) for one prompt, or lists of them (one per prompt)."""
    import json
    from .progress import Call
    texts = [tokens] if isinstance(tokens, str) else (
        tokens if isinstance(tokens, (list, tuple)) and tokens and all(isinstance(t, str) for t in tokens) else None)
    if texts is not None:
        tk = model.tokenizer
        if tk is None:
            raise PhasescopeError(f"generate: a text prompt needs a tokenizer: {model.path} has no tokenizer.json "
                                  "(ps.load(path, tokenizer=...))", code=_lib.EINPUT)
        ids = [tk.encode(t, add_special=True) for t in texts]
        for i, x in enumerate(ids):
            if not x:
                raise PhasescopeError(f"generate: text prompt {i} has no tokens", code=_lib.EINPUT)
        new, lps = generate(model, ids, max_tokens, edits, fwd_hooks, temperature, top_p, seed, progress, stop)
        out = [tk.decode(x, skip_special=True) for x in new]
        return (out[0], lps[0]) if isinstance(tokens, str) else (out, lps)
    one = isinstance(tokens, np.ndarray) and tokens.ndim == 1 or (
        not isinstance(tokens, np.ndarray) and len(tokens) > 0 and np.ndim(tokens[0]) == 0)
    prompts = [np.asarray(tokens)] if one else [np.asarray(p) for p in tokens]
    if not prompts:
        raise PhasescopeError("generate: no prompts", code=_lib.EINPUT)
    for i, p in enumerate(prompts):
        if p.ndim != 1 or p.size == 0 or (p.size and not np.issubdtype(p.dtype, np.integer)):
            raise PhasescopeError(f"generate: prompt {i}: 1-d integer token ids, at least one, got shape {list(p.shape)} "
                                  f"of {p.dtype}", code=_lib.EINPUT)
    cat = np.ascontiguousarray(np.concatenate(prompts), dtype=np.int32)
    lens = np.array([p.size for p in prompts], dtype=np.int64)
    n, mt = len(prompts), int(max_tokens)
    if mt < 0:
        raise PhasescopeError(f"generate: max_tokens {mt} must be >= 0", code=_lib.EINPUT)
    opts = {"temperature": float(temperature), "top_p": float(top_p), "seed": int(seed),
            "stop": [int(t) for t in stop], "edits": [_edit_json(e) for e in edits]}
    toks = np.empty((n, max(mt, 1)), np.int32)
    lps = np.empty((n, max(mt, 1)), np.float64)
    n_gen = np.zeros(n, np.int64)
    run = _HookRun(model, fwd_hooks)
    call = Call(progress)
    try:
        err = _lib.errbuf()
        with model._running() as h, model._progress(h, call):
            rc = _lib.lib.ps_api_generate(h, cat.ctypes.data_as(_lib.c_int32_p), lens.ctypes.data_as(_lib.c_int64_p), n, mt,
                                          _lib.enc(json.dumps(opts)), run.h, toks.ctypes.data_as(_lib.c_int32_p),
                                          lps.ctypes.data_as(_lib.c_double_p), n_gen.ctypes.data_as(_lib.c_int64_p),
                                          err, _lib.ERRLEN)
        call.finish(rc, err, run.raise_failure)
    finally:
        run.close()
    out = [([int(x) for x in toks[i, :n_gen[i]]], [float(x) for x in lps[i, :n_gen[i]]]) for i in range(n)]
    if one:
        return out[0]
    return [o[0] for o in out], [o[1] for o in out]

"""kvcache.py — model.kv_cache() and model.generate(): the C API's KV cache (ps_api_cache_*, docs/api.md
"The KV cache") as a KVCache, and greedy generation written on its append.

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
        from .model import _HookRun, _as_tokens
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


def _log_softmax_at(row, k):
    """log softmax(row)[k] in double (the model's distribution at temperature 1)."""
    x = row.astype(np.float64)
    m = x.max()
    return float(x[k] - m - np.log(np.exp(x - m).sum()))


def generate(model, tokens, max_tokens=16, edits=(), fwd_hooks=()):
    """Greedy decoding through a KV cache (written on KVCache.append): the prompt `tokens` (1-d ids) is
    prefilled, the edits applied (each (name, head, j) to zero, or (name, head, j, value) to set), then
    max_tokens tokens are generated, each the first maximum of the last logits row (core/generate.c's
    greedy pick), stopping at the model's max_tokens. fwd_hooks fire during every append. Returns
    (new token ids, their log-probabilities)."""
    prompt = np.asarray(tokens)
    if prompt.ndim != 1 or prompt.size == 0:
        raise PhasescopeError(f"generate: a 1-d prompt of at least one token, got shape {list(prompt.shape)}")
    out, lps = [], []
    with KVCache(model) as kv:
        s = kv.add()
        logits = kv.append(s, prompt, fwd_hooks)
        for e in edits:
            if len(e) == 3:
                kv.edit(e[0], e[1], e[2], seq=s)
            elif len(e) == 4:
                kv.edit(e[0], e[1], e[2], e[3], seq=s)
            else:
                raise PhasescopeError(f"generate: an edit is (name, head, j) or (name, head, j, value), not {e!r}")
        n = int(prompt.size)
        for _ in range(int(max_tokens)):
            if n >= model.max_tokens:
                break
            row = logits[-1]
            k = int(np.argmax(row))  # the first maximum
            out.append(k)
            lps.append(_log_softmax_at(row, k))
            n += 1
            if len(out) == max_tokens or n >= model.max_tokens:
                break
            logits = kv.append(s, [k], fwd_hooks)
    return out, lps

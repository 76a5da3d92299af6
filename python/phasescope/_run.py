"""_run.py — what a run of the model hands to C and gets back, shared by the Model (model.py) and the KV cache
(kvcache.py): token arrays checked into int32 [B, T], hook registrations (Python functions and backend-side
actions) for one call, and numpy views of memory a C output owns. Neither module imports the other for it."""
import ctypes
import json
import math
import threading

import numpy as np

from . import _lib
from .actions import Action
from .errors import PhasescopeError


class _Owner:
    """Frees a C handle when the last array viewing its memory is gone."""

    __slots__ = ("h", "free")

    def __init__(self, h, free):
        self.h, self.free = h, free

    def __del__(self):
        if self.h:
            self.free(self.h)
            self.h = None


def _view(owner, ptr, shape, ctype, dtype):
    """An ndarray over n = prod(shape) C values at ptr, keeping owner alive."""
    shape = tuple(int(d) for d in shape)
    n = math.prod(shape)
    if n == 0 or not ptr:
        return np.zeros(shape, dtype)
    buf = (ctype * n).from_address(ctypes.addressof(ptr.contents))
    buf._owner = owner  # the array's base is buf; buf keeps the C output
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


class ActivationCache(dict):
    """hook name -> ndarray, in the order the points fired. For a gradient cache, .loss is the mean loss
    and .n_targets the number of target positions."""

    loss = None
    n_targets = None

    def __repr__(self):
        inner = ", ".join(f"{k!r}: {list(v.shape)}" for k, v in self.items())
        return f"ActivationCache({{{inner}}})"


class _HookRun:
    """The ps_api_hooks list of one call: Python functions (as C callbacks) and actions, in order. A
    function's exception is kept and re-raised after the pass the C side aborts."""

    def __init__(self, model, fwd_hooks):
        self.h = _lib.lib.ps_api_hooks_new()
        if not self.h:
            raise PhasescopeError("out of memory for a hook list")
        self.keep = []
        self.exc = None
        try:
            for entry in fwd_hooks or ():
                try:
                    name, what = entry
                except (TypeError, ValueError):
                    raise PhasescopeError(f"fwd_hooks: each entry is (name, function or ps.actions.*), not {entry!r}") from None
                names = [n for n in model.hook_names if name(n)] if callable(name) else [name]
                for n in names:
                    self._add(n, what)
        except BaseException:
            self.close()
            raise

    def _add(self, name, what):
        if not isinstance(name, str):
            raise PhasescopeError(f"fwd_hooks: a hook name is a string or a predicate, not {name!r}")
        if isinstance(what, Action):
            what._add_to(self.h, name)
        elif callable(what):
            cb = _lib.HOOK_FN(self._wrap(what))
            self.keep.append(cb)
            err = _lib.errbuf()
            _lib.check(_lib.lib.ps_api_hooks_add_fn(self.h, _lib.enc(name), cb, None, err, _lib.ERRLEN), err)
        else:
            raise PhasescopeError(f"fwd_hooks: hook {name}: a function fn(activation, name) or a ps.actions.* action, "
                                  f"not {what!r}")

    def _wrap(self, fn):
        def cb(name_b, data, shape_p, rank, user):
            try:
                name = name_b.decode("utf-8")
                shape = tuple(shape_p[i] for i in range(rank))
                n = math.prod(shape)
                view = np.ctypeslib.as_array(data, shape) if n else np.zeros(shape, np.float32)
                act = view.copy()  # a hook may keep what it gets: it never sees memory the pass reuses
                ret = fn(act, name)
                out = act if ret is None else ret
                if not isinstance(out, np.ndarray):
                    raise PhasescopeError(f"returned {type(out).__name__}, not a numpy array (or None after editing in place)")
                if out.shape != shape:
                    raise PhasescopeError(f"returned shape {list(out.shape)}, the activation's is {list(shape)}")
                if out.dtype != np.float32:
                    raise PhasescopeError(f"returned dtype {out.dtype}, the activation's is float32")
                if n:
                    view[...] = out
                return 0
            except BaseException as e:  # KeyboardInterrupt too: the pass stops, the caller gets it
                self.exc = e
                _lib.lib.ps_api_hooks_fail(self.h, _lib.enc(f"{type(e).__name__}: {e}" if not isinstance(e, PhasescopeError) else str(e)))
                return 1

        return cb

    def raise_failure(self, rc, err):
        msg = err.value.decode("utf-8", "replace")
        if self.exc is not None and not isinstance(self.exc, PhasescopeError):
            e, self.exc = self.exc, None
            e.add_note(f"phasescope: {msg}")
            raise e
        self.exc = None
        _lib.check(rc, err)

    def close(self):
        if self.h:
            _lib.lib.ps_api_hooks_free(self.h)
            self.h = None


def _as_tokens(tokens, what="tokens"):
    """tokens (list of lists, 1-d or 2-d integers) -> C-contiguous int32 [B, T]."""
    if isinstance(tokens, np.ndarray):
        a = tokens
    else:
        try:
            a = np.array(tokens)
        except ValueError:
            raise PhasescopeError(f"{what}: a list of equal-length token lists, or an integer array [B, T]") from None
    if a.dtype == object or (a.size and a.dtype.kind not in "iu"):
        raise PhasescopeError(f"{what}: integer token ids in equal-length sequences, got dtype {a.dtype} "
                              f"(ragged lists are not a [B, T] array)")
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise PhasescopeError(f"{what}: shape {list(a.shape)}; give [B, T] with B, T >= 1")
    if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
        raise PhasescopeError(f"{what}: a token id outside the int32 range ({int(a.min())}..{int(a.max())})")
    return np.ascontiguousarray(a, dtype=np.int32)

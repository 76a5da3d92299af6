"""model.py — ps.load and the Model: a checkpoint opened through the C API, run with TransformerLens habits.

    model = ps.load("data/models/deep_w8s8")
    logits, cache = model.run_with_cache([[1, 2, 3, 4]], names=["blocks.10.attn.hook_ck"])
    logits = model.run_with_hooks(tokens, fwd_hooks=[("blocks.10.attn.hook_z", fn),
                                                     ("blocks.10.attn.hook_ck", ps.actions.zero(head=3))])

Arrays handed out (logits, cache entries, gradients) are views of memory the C output owns; each keeps
that output alive, and no later call moves or changes it (the header's ownership rule), so they stay valid
as long as they are referenced."""
import contextlib
import ctypes
import json
import math
import os
import threading

import numpy as np

from . import _lib
from .actions import Action
from .errors import PhasescopeError
from .progress import Call


from ._run import ActivationCache, _as_tokens, _HookRun, _Owner, _view  # noqa: F401 (ActivationCache: ps.ActivationCache)
from .kvcache import KVCache, generate as _generate


class Model:
    """A checkpoint opened by ps.load. Close it with .close() (or a with block); it is closed when
    collected too."""

    def __init__(self, path, device="cpu", tokenizer=None, lazy=None, layers=None):
        if not isinstance(path, (str, os.PathLike)):
            raise PhasescopeError(f"load: a checkpoint directory path, not {path!r}")
        path = os.fspath(path)
        self._h = None
        self._busy = threading.Lock()  # one call at a time: a hook calling its own model, or another thread
        opts = {k: v for k, v in (("lazy", lazy), ("layers", layers)) if v is not None}
        h = ctypes.c_void_p()
        err = _lib.errbuf()
        _lib.check(_lib.lib.ps_api_open_ex(_lib.enc(path), _lib.enc(device), _lib.enc(json.dumps(opts)) if opts else None,
                                           ctypes.byref(h), err, _lib.ERRLEN), err)
        self._h = h
        L = _lib.lib
        self.path = _lib.text(L.ps_api_path(h))
        self.device = _lib.text(L.ps_api_device(h))
        self.family = _lib.text(L.ps_api_family(h))
        self.n_layers = int(L.ps_api_n_layers(h))
        self.vocab_size = int(L.ps_api_vocab_size(h))
        self.n_ctx = int(L.ps_api_context_length(h))  # the context length (TransformerLens cfg.n_ctx)
        self.cfg = json.loads(_lib.text(L.ps_api_config_json(h)))
        self.hook_points = json.loads(_lib.text(L.ps_api_hook_points_json(h)))
        self.hook_names = json.loads(_lib.text(L.ps_api_hook_names_json(h)))
        # the tokenizer: the one given, else the checkpoint's own tokenizer.json when there is one
        self.tokenizer = None
        tok = tokenizer if tokenizer is not None else os.path.join(path, "tokenizer.json")
        if tokenizer is not None or os.path.exists(tok):
            from .tokenizer import Tokenizer
            try:
                self.tokenizer = tok if isinstance(tok, Tokenizer) else Tokenizer(tok)
            except BaseException:
                self.close()
                raise

    # ---- lifetime ----
    def close(self):
        if getattr(self, "_h", None):
            if not self._busy.acquire(blocking=False):
                raise PhasescopeError(f"{self.path}: the model is running; it cannot be closed from a hook or another thread")
            try:
                for kv in list(getattr(self, "_caches", ())):  # its KV caches first: they use the model
                    kv.free()
                _lib.lib.ps_api_close(self._h)
                self._h = None
            finally:
                self._busy.release()

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _handle(self):
        if not self._h:
            raise PhasescopeError(f"{self.path}: the model is closed")
        return self._h

    @contextlib.contextmanager
    def _running(self):
        """The model's handle for one run; a second run while one is in progress (a hook function calling
        its own model, or another thread) is refused: the C API takes one call at a time per model."""
        if not self._busy.acquire(blocking=False):
            raise PhasescopeError(f"{self.path}: the model is already running (a hook function or another thread "
                                  "called it): one call at a time per model; load it twice to run it in two threads")
        try:
            yield self._handle()
        finally:
            self._busy.release()

    def __repr__(self):
        return (f"<phasescope.Model {self.family} {self.path!r} on {self.device}: {self.n_layers} layers, "
                f"vocab {self.vocab_size}, {len(self.hook_names)} hook points>")

    # ---- the table ----
    def hook_shape(self, name, B=1, T=None):
        """The shape of hook `name`'s activation for B sequences of T tokens (T: the context length, n_ctx)."""
        dims = (ctypes.c_int64 * 4)()
        err = _lib.errbuf()
        r = _lib.lib.ps_api_hook_shape(self._handle(), _lib.enc(name), int(B), int(T or self.n_ctx), dims, err, _lib.ERRLEN)
        if r <= 0:
            raise PhasescopeError(err.value.decode("utf-8", "replace"), code=_lib.EINPUT)
        return tuple(dims[i] for i in range(r))

    # ---- running ----
    def _outputs(self, out, with_cache, grads):
        L = _lib.lib
        owner = _Owner(out, L.ps_api_output_free)
        shp = (ctypes.c_int64 * 3)()
        lp = L.ps_api_output_logits(out, shp)  # NULL for a model opened with layers=N: no logits
        logits = _view(owner, lp, tuple(shp), ctypes.c_float, np.float32) if lp else None
        if not with_cache:
            return logits
        cache, gcache = ActivationCache(), ActivationCache()
        rank = ctypes.c_int()
        for i in range(L.ps_api_output_count(out)):
            name = _lib.text(L.ps_api_output_name(out, i))
            sp = L.ps_api_output_shape(out, i, ctypes.byref(rank))
            shape = tuple(sp[k] for k in range(rank.value))
            cache[name] = _view(owner, L.ps_api_output_data(out, i), shape, ctypes.c_float, np.float32)
            if grads:
                g = L.ps_api_output_grad(out, i)
                if g:
                    gcache[name] = _view(owner, g, shape, ctypes.c_float, np.float32)
        if not grads:
            return logits, cache
        gcache.loss = float(L.ps_api_output_loss(out))
        gcache.n_targets = int(L.ps_api_output_n_targets(out))
        return logits, cache, gcache

    @contextlib.contextmanager
    def _progress(self, h, call):
        """The model's progress callback (ps_api_set_progress) for one run: always on the cpu (Ctrl-C);
        on a device only when progress= is given (there the callback's hook point is copied to the host
        at each layer)."""
        if call.fn is None and self.device != "cpu":
            yield
            return
        _lib.lib.ps_api_set_progress(h, call.cb, None)
        try:
            with call:
                yield
        finally:
            _lib.lib.ps_api_set_progress(h, _lib.PROGRESS_FN(), None)

    def run_with_hooks(self, tokens, fwd_hooks=(), progress=None):
        """Forward with fwd_hooks = [(name or predicate, fn(activation, name) or ps.actions.*), ...];
        returns the logits [B, T, vocab] (float32). A function edits its activation (a float32 copy) in
        place or returns a replacement of the same shape and dtype; an exception in it aborts the pass
        and is raised here (the model stays usable). progress: fn(layers done, layers), called as each
        layer starts and at the end; a truthy return stops the pass (ps.Cancelled). Ctrl-C stops it too
        (KeyboardInterrupt), the model usable after either."""
        toks = _as_tokens(tokens)
        run = _HookRun(self, fwd_hooks)
        call = Call(progress)
        try:
            out = ctypes.c_void_p()
            err = _lib.errbuf()
            with self._running() as h, self._progress(h, call):
                rc = _lib.lib.ps_api_run_with_hooks(h, toks.ctypes.data_as(_lib.c_int32_p), toks.shape[0], toks.shape[1],
                                                    run.h, ctypes.byref(out), err, _lib.ERRLEN)
            call.finish(rc, err, run.raise_failure)
        finally:
            run.close()
        return self._outputs(out, False, False)

    def __call__(self, tokens):
        """The logits [B, T, vocab] of tokens."""
        return self.run_with_hooks(tokens)

    def run_with_cache(self, tokens, names=None, grads=False, targets=None, fwd_hooks=(), progress=None):
        """Forward caching hook points: names a list of hook names (or one name), a predicate
        name -> bool, or None (every point); an empty list caches nothing (the logits, an empty cache),
        as TransformerLens's names_filter=[]. Returns (logits, cache); with grads=True
        (logits, cache, grads): grads maps each cached point the backward reaches to the gradient of the
        mean cross-entropy over targets ([B, T] ints, -1 for none; None: the next token), and has .loss
        and .n_targets. fwd_hooks run in the same pass (cached values are after them). progress and Ctrl-C:
        as run_with_hooks."""
        toks = _as_tokens(tokens)
        B, T = toks.shape
        c_names, n_names, filt, filt_exc = None, 0, _lib.FILTER_FN(), []
        if isinstance(names, str):
            names = [names]
        if callable(names):
            pred = names

            def filt_py(name_b, user):
                try:
                    return 1 if pred(name_b.decode("utf-8")) else 0
                except BaseException as e:
                    filt_exc.append(e)
                    return 0

            filt = _lib.FILTER_FN(filt_py)
        elif names is not None:
            names = list(names)
            for n in names:
                if not isinstance(n, str):
                    raise PhasescopeError(f"run_with_cache: a hook name is a string, not {n!r}")
            # an empty list caches nothing (TransformerLens's names_filter=[]): the C API takes a non-NULL
            # names with n_names 0 as that (NULL would mean every point), so the array has a slot to spare
            c_names = (ctypes.c_char_p * (len(names) + 1))(*[_lib.enc(n) for n in names], None)
            n_names = len(names)
        tg = None
        if targets is not None:
            tg = _as_tokens(targets, "targets")
            if tg.shape != toks.shape:
                raise PhasescopeError(f"targets: shape {list(tg.shape)}, the tokens' is {list(toks.shape)}")
        run = _HookRun(self, fwd_hooks)
        call = Call(progress)
        try:
            out = ctypes.c_void_p()
            err = _lib.errbuf()
            with self._running() as h, self._progress(h, call):
                rc = _lib.lib.ps_api_run_with_cache(
                    h, toks.ctypes.data_as(_lib.c_int32_p), B, T, c_names, n_names, filt, None, run.h,
                    1 if grads else 0, None if tg is None else tg.ctypes.data_as(_lib.c_int32_p), ctypes.byref(out), err,
                    _lib.ERRLEN)
            call.finish(rc, err, run.raise_failure)
        finally:
            run.close()
        res = self._outputs(out, True, grads)
        if filt_exc:
            raise filt_exc[0]
        return res

    # ---- the KV cache and generation (kvcache.py) ----
    def kv_cache(self):
        """A KV cache on this model (ps.KVCache): sequences grown by appends, entries read and edited
        between steps (free it, or use a with block; closing the model frees it too)."""
        return KVCache(self)

    def generate(self, tokens, max_tokens=16, edits=(), fwd_hooks=(), temperature=0.0, top_p=1.0, seed=0, progress=None,
                 stop=()):
        """Generation through a KV cache (the CLI's `generate`): one prompt (1-d ids) -> (new token ids,
        their log-probabilities); several (a list of 1-d ids) -> (a list of id lists, a list of log-probability
        lists); text (a str or a list of str, with self.tokenizer) -> the new text in place of the ids. Greedy by default; temperature > 0 samples within top_p, with seed. edits: (name, head, j)
        zeroes, (name, head, j, "mean") mean-replaces, (name, head, j, value) sets entry j of a cache point
        from the first generated token on; fwd_hooks fire during every append; progress:
        fn(tokens so far, max_tokens), a truthy return stops it (ps.Cancelled); stop: token ids (e.g. the EOS
        id) after which a sequence stops, the token kept."""
        return _generate(self, tokens, max_tokens, edits, fwd_hooks, temperature, top_p, seed, progress, stop)


def load(path, device="cpu", tokenizer=None, lazy=None, layers=None):
    """Open the checkpoint directory `path` (any family phasescope reads: its own checkpoints, Hugging Face
    Qwen3 checkpoints, DeepSeek-V4 checkpoints) on `device` ("cpu"; ps.devices() lists this build's).
    tokenizer: a tokenizer.json path or a ps.Tokenizer (default: the checkpoint's own tokenizer.json when
    present) -> model.tokenizer. lazy (DeepSeek-V4: load each layer's weights when it runs) and layers=N
    (stop after layers 0..N-1: no logits) are ps_api_open_ex's options (None: the family's default)."""
    return Model(path, device, tokenizer, lazy, layers)

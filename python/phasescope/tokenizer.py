"""tokenizer.py — a Hugging Face tokenizer.json (byte-level BPE, as `phasescope tokenize` reads it) through
ps_api_tokenizer_open / ps_api_encode / ps_api_decode.

    tok = ps.Tokenizer("tokenizer.json")      # or model.tokenizer, when the checkpoint has one
    ids = tok.encode("The key is 42.")         # a list of ints
    text = tok.decode(ids)"""
import ctypes
import os

import numpy as np

from . import _lib
from .errors import PhasescopeError


class Tokenizer:
    def __init__(self, path):
        self.path = os.fspath(path)
        h = ctypes.c_void_p()
        err = _lib.errbuf()
        _lib.check(_lib.lib.ps_api_tokenizer_open(_lib.enc(self.path), ctypes.byref(h), err, _lib.ERRLEN), err)
        self._h = h
        self.vocab_size = int(_lib.lib.ps_api_tokenizer_vocab_size(h))

    def close(self):
        if getattr(self, "_h", None):
            _lib.lib.ps_api_tokenizer_free(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def __repr__(self):
        return f"<phasescope.Tokenizer {self.path!r}: vocab {self.vocab_size}>"

    def _handle(self):
        if not self._h:
            raise PhasescopeError(f"{self.path}: the tokenizer is closed")
        return self._h

    def encode(self, text, add_special=False):
        """text (str, or UTF-8 bytes) -> list of token ids; add_special: the post-processor's special tokens."""
        b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        ids, n = ctypes.POINTER(ctypes.c_int32)(), ctypes.c_int64()
        err = _lib.errbuf()
        _lib.check(_lib.lib.ps_api_encode(self._handle(), b, len(b), 1 if add_special else 0, ctypes.byref(ids),
                                          ctypes.byref(n), err, _lib.ERRLEN), err)
        try:
            return [ids[i] for i in range(n.value)]
        finally:
            _lib.lib.ps_api_free(ids)

    def decode(self, ids, skip_special=False):
        """token ids (a list or an integer array) -> str."""
        a = np.asarray(ids)
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise PhasescopeError(f"decode: a 1-d list of integer ids, not shape {list(a.shape)} of {a.dtype}")
        if a.size and (a.min() < np.iinfo(np.int32).min or a.max() > np.iinfo(np.int32).max):
            raise PhasescopeError("decode: an id outside the int32 range")
        a = np.ascontiguousarray(a, dtype=np.int32)
        text, n = ctypes.c_void_p(), ctypes.c_size_t()
        err = _lib.errbuf()
        _lib.check(_lib.lib.ps_api_decode(self._handle(), a.ctypes.data_as(_lib.c_int32_p), a.size, 1 if skip_special else 0,
                                          ctypes.byref(text), ctypes.byref(n), err, _lib.ERRLEN), err)
        try:
            return ctypes.string_at(text, n.value).decode("utf-8", "replace")
        finally:
            _lib.lib.ps_api_free(text)

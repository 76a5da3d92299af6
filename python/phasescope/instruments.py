"""instruments.py — every instrument of the CLI as a function (ps_api_instrument underneath).

The CLI's flags are keyword arguments, dashes as underscores, lists as Python lists, switches as True, and
the CLI's defaults and checks apply:

    r = ps.knockout(model, n=16, layers=[10, 11], method="atp", verify=4)
    r.data                                   # the dict knockout.json holds (the same numbers)
    r.arrays["grid.cells.residues.delta_nll"]  # the grid as a numpy array [cells, P]
    r.save("out/knockout")                   # what `phasescope knockout --out out/knockout` writes
    r.figure()                               # its PNG (shown inline in a notebook)

`model` is a ps.Model (its checkpoint and device), a checkpoint path, or None (the request's model=...,
else the CLI's default).

progress=True: a progress bar (tqdm's when installed). progress=fn: fn(done, total) after each unit of the run's work (batches, shifts, candidates, requests;
each phase of a run that has several counts from 0 again); a truthy return stops the run there
(ps.Cancelled). Ctrl-C stops it too (KeyboardInterrupt). Either way nothing of the run is kept and the
model runs again as before (progress.py)."""
import ctypes
import json
import math
import os
import threading
import time

import numpy as np

from . import _lib
from .errors import PhasescopeError
from .model import Model
from .progress import Call
from .prompts import PromptSet


class Figure(bytes):
    """A PNG file's bytes; a notebook shows it inline (IPython's _repr_png_). .save(path) writes it."""

    name = None

    def _repr_png_(self):
        return bytes(self)

    def save(self, path):
        with open(path, "wb") as f:
            f.write(self)

    def __repr__(self):
        return f"<phasescope.Figure {self.name} ({len(self)} bytes of PNG)>"

    __str__ = __repr__


class Result:
    """What one instrument run produced, in memory (the call writes no file). .name the instrument, .kind the
    result's kind, .data the result JSON as a dict (None for a command that writes none, e.g. train), .json its
    text (byte for byte the CLI's file), .arrays the numeric arrays of the JSON (ps_api_result_*: name ->
    float64 ndarray, e.g. "curve.residues.accuracy" [P], "grid.cells.residues.delta_nll" [cells, P]), .files the
    result files' names, .dir the out= directory when one was given (None otherwise). .figure() draws the
    figure in memory; .save(dir) writes what the CLI's --out dir holds."""

    def __init__(self, name, handle):
        self.name = name
        L = _lib.lib
        self._owner = _Handle(handle)
        self.kind = _lib.text(L.ps_api_result_kind(handle))
        self.json = _lib.text(L.ps_api_result_json(handle))
        self.data = json.loads(self.json) if self.json is not None else None
        self.dir = _lib.text(L.ps_api_result_dir(handle))
        self.files = json.loads(_lib.text(L.ps_api_result_files_json(handle)) or "[]")
        self.arrays = {}
        rank = ctypes.c_int()
        for i in range(L.ps_api_result_count(handle)):
            nm = _lib.text(L.ps_api_result_name(handle, i))
            sp = L.ps_api_result_shape(handle, i, ctypes.byref(rank))
            shape = tuple(sp[k] for k in range(rank.value))
            n = math.prod(shape)
            p = L.ps_api_result_data(handle, i)
            a = np.ctypeslib.as_array(p, (n,)).copy() if n and p else np.zeros(n)
            self.arrays[nm] = a.reshape(shape)

    def __repr__(self):
        return f"<phasescope.Result {self.name} kind={self.kind} files={self.files} arrays={list(self.arrays)[:6]}...>"

    @property
    def curve(self):
        """A sweep's (or gatecycle's) accuracy per residue [P]: arrays["curve.residues.accuracy"] (None when
        the result has no curve)."""
        return self.arrays.get("curve.residues.accuracy")

    @property
    def grid(self):
        """A knockout's grid of delta NLL [cells, P]: arrays["grid.cells.residues.delta_nll"], cell i being
        (arrays["grid.cells.layer"][i], arrays["grid.cells.head"][i]) (None when there is no grid)."""
        return self.arrays.get("grid.cells.residues.delta_nll")

    def __getitem__(self, key):
        """result["grid.cells.layer"]: an array of .arrays, else a key of .data."""
        if key in self.arrays:
            return self.arrays[key]
        if self.data is not None and key in self.data:
            return self.data[key]
        raise KeyError(f"{key!r}: not an array of this result ({', '.join(self.arrays)}) nor a key of its JSON")

    def save(self, dir):
        """Write what the CLI's --out dir holds (the JSON and its figures) into dir (created if absent)."""
        err = _lib.errbuf()
        _lib.check(_lib.lib.ps_api_result_save(self._owner.h, _lib.enc(os.fspath(dir)), err, _lib.ERRLEN), err)
        return dir

    def figures(self):
        """The result's figures (the PNGs the CLI draws), drawn in memory: file name -> Figure."""
        L = _lib.lib
        err = _lib.errbuf()
        names = L.ps_api_result_figures_json(self._owner.h, err, _lib.ERRLEN)
        if names is None:
            _lib.check(_lib.EFAIL, err)
        out = {}
        for f in json.loads(_lib.text(names)):
            n = ctypes.c_size_t()
            p = L.ps_api_result_figure(self._owner.h, _lib.enc(f), ctypes.byref(n), err, _lib.ERRLEN)
            if not p:
                _lib.check(_lib.EFAIL, err)
            fig = Figure(ctypes.string_at(p, n.value))
            fig.name = f
            out[f] = fig
        return out

    def figure(self, name=None):
        """The run's figure (PNG bytes, shown inline in a notebook): the first PNG, or the one named."""
        figs = self.figures()
        if not figs:
            raise PhasescopeError(f"{self.name}: the result has no figure (results: {', '.join(self.files) or 'none'})")
        if name is None:
            return next(iter(figs.values()))
        if name not in figs:
            raise PhasescopeError(f"{self.name}: no figure {name!r} (figures: {', '.join(figs)})")
        return figs[name]

    def _repr_png_(self):
        figs = self.figures()
        return bytes(next(iter(figs.values()))) if figs else None


class _Handle:
    __slots__ = ("h",)

    def __init__(self, h):
        self.h = h

    def __del__(self):
        if self.h:
            _lib.lib.ps_api_result_free(self.h)
            self.h = None


def _value(k, v):
    if isinstance(v, PromptSet):  # the API's inline prompt set (the records of --prompts FILE)
        return v.records()
    if isinstance(v, os.PathLike):
        return os.fspath(v)
    if isinstance(v, (list, tuple, range, np.ndarray)):
        return [_value(k, x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, dict):  # a record of an inline prompt set
        return {str(kk): _value(k, x) for kk, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    raise PhasescopeError(f"{k}={v!r}: a flag's value is a string, number, bool, list or None")


def request_json(flags):
    """The request of ps_api_instrument: the flags as a JSON object (None values dropped)."""
    return json.dumps({k: _value(k, v) for k, v in flags.items() if v is not None})


def run(name, model=None, progress=None, _stop=None, **flags):
    """Run instrument `name` (any of ps.instruments()) with the CLI's flags as keyword arguments;
    progress=fn(done, total) as above."""
    h = None
    if isinstance(model, Model):
        h = model._handle()
    elif model is not None:
        if "model" in flags:
            raise PhasescopeError(f"{name}: the model is given twice (argument and model=)")
        flags["model"] = os.fspath(model)
    req = request_json(flags)
    out = ctypes.c_void_p()
    err = _lib.errbuf()
    call = Call(progress, _stop, desc=name)
    with call:
        rc = _lib.lib.ps_api_instrument_ex(h, _lib.enc(name), _lib.enc(req), call.cb, None, ctypes.byref(out), err,
                                           _lib.ERRLEN)
    call.finish(rc, err)
    return Result(name, out)


def instruments():
    """The registry: a list of dicts {name, summary, kind, result, splits, flags: [{name, value, help,
    required}]} (ps_api_instruments_json)."""
    p = _lib.lib.ps_api_instruments_json()
    if not p:
        raise PhasescopeError("out of memory for the instrument registry")
    try:
        return json.loads(ctypes.string_at(p).decode("utf-8"))
    finally:
        _lib.lib.ps_api_free(p)


def sweep(model=None, **flags):
    """`phasescope sweep`: accuracy against the needle's offset (mode="pad"|"move", n=, period=, ...).
    The curve: .arrays["curve.residues.accuracy"] (and the other curve.* arrays). prompts=ps.PromptSet(...)
    (or a JSON-lines file): your own prompts, accuracy and mean log-prob per residue (and the logit
    difference with alt)."""
    return run("sweep", model, **flags)


def knockout(model=None, **flags):
    """`phasescope knockout`: the (layer, head) knockout grid (layers=[...], heads=[...],
    target="raw"|"compressed"|"both", method="exact"|"atp", verify=K, n=, ...). The grid:
    .arrays["grid.cells.residues.delta_nll"] [cells, P] with "grid.cells.layer" / "grid.cells.head".
    prompts=ps.PromptSet(...) (or a JSON-lines file): the grid on your own prompts, every entry of the target
    mean-replaced by its mean over them, position by position (with alt: grid.cells.residues.delta_logit_diff)."""
    return run("knockout", model, **flags)


def recall(model=None, **flags):
    """`phasescope recall`: selection recall per phase residue on a model that selects blocks (the select
    attention kind, MiniCPM4): for each (layer, KV head) the share of queries whose needle's block is among the
    blocks attended at the query's row (layers=[...], mode="pad"|"move", needle_offset=K, n=, period=, ...).
    .arrays["cells.residues.recall"] [cells, P] with "cells.layer" / "cells.head"; the accuracy of the same
    forwards in "curve.residues.accuracy". prompts=ps.PromptSet(..., needle=...) (or a JSON-lines file with a
    "needle" key): your own prompts."""
    return run("recall", model, **flags)


def patch(model=None, clean=None, corrupt=None, **flags):
    """`phasescope patch`: activation patching of every (layer, head) cell of the target from the corrupt run
    into the clean one (TransformerLens's get_act_patch_*, corrupt into clean). clean: a ps.PromptSet (or a
    JSON-lines file; the CLI's --prompts), corrupt: int tokens [N, T] of the same shape (or a JSON-lines file of
    {"tokens": [...]}; the CLI's --corrupt); layers=, heads=, target= as knockout's. The result is knockout's
    grid (kind "patch"): .arrays["grid.cells.residues.delta_nll"] [cells, P] (patched - clean), the clean and
    corrupt runs' curves ("grid.clean.residues.*", "grid.corrupt.residues.*") and, with alt,
    "grid.cells.residues.patch_metric" = (patched - corrupt) / (clean - corrupt) of the logit difference."""
    if "prompts" in flags and clean is not None:
        raise PhasescopeError("patch: the clean prompts are given twice (clean= and prompts=)")
    if clean is not None:
        flags["prompts"] = clean
    if corrupt is not None and not isinstance(corrupt, (str, os.PathLike)):
        a = np.asarray(corrupt)
        if a.dtype == object or a.ndim != 2 or (a.size and not np.issubdtype(a.dtype, np.integer)):
            raise PhasescopeError(f"patch: corrupt must be integer tokens [N, T] (got {a.dtype} of shape {a.shape})")
        corrupt = a.astype(np.int64).tolist()
    flags["corrupt"] = corrupt
    return run("patch", model, **flags)


def gates(model=None, **flags):
    """`phasescope gates`: the gate statistics of every compressed head (log=RUN/train.jsonl, n=, ...)."""
    return run("gates", model, **flags)


def gatecycle(model=None, **flags):
    """`phasescope gatecycle`: cycle one head's gate by shift=K (layer=, head=, branch=, params=, ...)."""
    return run("gatecycle", model, **flags)


def fillers(model=None, **flags):
    """`phasescope fillers`: the filler experiment (experiment=FILE, tokenizer=FILE, ...)."""
    return run("fillers", model, **flags)


def probe(**flags):
    """`phasescope probe`: the instrument against a served model (endpoint=URL, api_model=NAME, ...)."""
    return run("probe", None, **flags)


def train(config, out, progress=None, poll_s=0.2, **flags):
    """`phasescope train --config CONFIG --out OUT` (resume=True, stop_after=N, init_from=DIR, ...).
    progress: called with each record of OUT/train.jsonl as the run writes it (a dict: step, loss, ...),
    from this thread, while the training runs in another (the GIL is released meanwhile); a truthy
    return stops the run (ps.Cancelled). Ctrl-C stops it too (KeyboardInterrupt). A stopped run keeps a
    checkpoint at the step it stopped after (resume=True continues it). Returns a Result whose .dir is
    out; .log is the list of train.jsonl records."""
    flags.update(config=os.fspath(config), out=os.fspath(out))
    if progress is None:
        res = run("train", None, **flags)
        res.log = _read_log(os.path.join(os.fspath(out), "train.jsonl"), 0)[0]
        return res
    box, stop = {}, threading.Event()

    def work():
        try:
            box["res"] = run("train", None, _stop=stop, **flags)
        except BaseException as e:
            box["exc"] = e

    t = threading.Thread(target=work, name="phasescope-train", daemon=True)
    log, seen, pos = os.path.join(os.fspath(out), "train.jsonl"), [], 0
    t.start()
    try:
        while True:
            done = not t.is_alive()
            recs, pos = _read_log(log, pos)
            for r in recs:
                seen.append(r)
                if not stop.is_set() and progress(r):
                    stop.set()  # the worker's C call stops after its current step
            if done:
                break
            t.join(poll_s)
    except BaseException:  # Ctrl-C here, or progress raised: stop the training thread, then raise
        stop.set()
        t.join()
        raise
    if "exc" in box:
        raise box["exc"]
    res = box["res"]
    res.log = seen if pos else _read_log(log, 0)[0]
    return res


def _read_log(path, pos):
    """The complete JSON lines of path from byte pos on, and the new pos."""
    try:
        with open(path, "rb") as f:
            f.seek(pos)
            chunk = f.read()
    except OSError:
        return [], pos
    end = chunk.rfind(b"\n") + 1
    recs = []
    for line in chunk[:end].splitlines():
        if line.strip():
            try:
                recs.append(json.loads(line))
            except ValueError:
                pass
    return recs, pos + end

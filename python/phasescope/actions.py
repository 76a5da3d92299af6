"""actions.py — backend-side hook actions (core/hooks.h's ps_hook_action through ps_api_hooks_add_action).

They go in run_with_hooks' / run_with_cache's fwd_hooks list beside Python functions,
`[("blocks.10.attn.hook_ck", ps.actions.zero(head=3)), ("blocks.11.attn.hook_z", fn)]`, and run inside
the backend with no copy of the activation to the host. Common keywords:
  head       None: the whole position; h >= 0: head h of a 4-d point's axis 2 (hook_k, hook_ck, hook_z, ...)
  positions  None: every position; an int p: position p only; (p0, p1) or slice(p0, p1): positions
             [p0, p1) (p1 None: to the end). "Position" is the point's axis 1 (a window on hook_ck).
  seqs       the same for the sequences of the batch (axis 0).
src arrays are copied when the run is prepared (float32, C order); "inner" is the point's layout after
the position axis ([n_kv, hd] for hook_k, [d] for hook_resid_pre): src always holds every head."""
import numpy as np

from . import _lib
from .errors import PhasescopeError


def _range(r, what):
    if r is None:
        return 0, 0
    if isinstance(r, (int, np.integer)) and not isinstance(r, bool):
        r = int(r)
        if r < 0:
            raise PhasescopeError(f"{what}={r}: a position or sequence index is >= 0")
        return r, r + 1
    if isinstance(r, slice):
        if r.step not in (None, 1):
            raise PhasescopeError(f"{what}: a slice with a step is not supported")
        r = (r.start, r.stop)
    try:
        a, b = r
    except (TypeError, ValueError):
        raise PhasescopeError(f"{what}={r!r}: give None, an index, (start, stop) or a slice") from None
    a = 0 if a is None else int(a)
    if a < 0 or (b is not None and int(b) <= a):
        raise PhasescopeError(f"{what}={r!r}: an empty or negative range")
    return a, (0 if b is None else int(b))


class Action:
    """One backend-side action: kind (ZERO, SET, ADD, MEAN_REPLACE, PATCH), head, seqs, positions, src,
    scale. Build them with the functions below."""

    def __init__(self, kind, head=None, positions=None, seqs=None, src=None, scale=1.0):
        self.kind = kind
        self.head = -1 if head is None else int(head)
        if self.head < -1:
            raise PhasescopeError(f"head={head}: a head index is >= 0 (None: every head)")
        self.pos = _range(positions, "positions")
        self.seq = _range(seqs, "seqs")
        self.scale = float(scale)
        self.src = None
        if src is not None:
            a = np.asarray(src)
            if a.dtype.kind not in "fiu":
                raise PhasescopeError(f"src: a numeric array, not {a.dtype}")
            self.src = np.ascontiguousarray(a, dtype=np.float32)

    _NAMES = {_lib.ZERO: "zero", _lib.SET: "set", _lib.ADD: "add", _lib.MEAN_REPLACE: "mean_replace", _lib.PATCH: "patch"}

    def __repr__(self):
        src = "" if self.src is None else f", src{list(self.src.shape)}"
        return (f"ps.actions.{self._NAMES[self.kind]}(head={None if self.head < 0 else self.head}, "
                f"positions={self.pos}, seqs={self.seq}{src})")

    def _add_to(self, hooks, name):
        """Append this action on hook `name` to a ps_api_hooks list."""
        err = _lib.errbuf()
        if self.src is None:
            ptr, shp, rank = None, None, 0
        else:
            ptr = self.src.ctypes.data_as(_lib.c_float_p)
            shp = (_lib.ctypes.c_int64 * max(1, self.src.ndim))(*self.src.shape)
            rank = self.src.ndim
        rc = _lib.lib.ps_api_hooks_add_action(hooks, _lib.enc(name), self.kind, self.head, self.seq[0], self.seq[1],
                                              self.pos[0], self.pos[1], ptr, shp, rank, self.scale, err, _lib.ERRLEN)
        _lib.check(rc, err)


def zero(head=None, positions=None, seqs=None):
    """x[b, t, head] = 0."""
    return Action(_lib.ZERO, head, positions, seqs)


def set(values, head=None, positions=None, seqs=None):  # noqa: A001 (TransformerLens's name)
    """x[b, t, head] = values[t, head] (values [npos, *inner], indexed by the position itself: it holds
    at least the positions set), or values[head] at every position (values [*inner]: one position's)."""
    return Action(_lib.SET, head, positions, seqs, src=values)


def add(values, scale=1.0, head=None, positions=None, seqs=None):
    """x[b, t, head] += scale * values[t, head] (or values[head] at every position, as set)."""
    return Action(_lib.ADD, head, positions, seqs, src=values, scale=scale)


def mean_replace(acts, head=None, positions=None, seqs=None):
    """x[b, t, head] = mean over s of acts[s, t, head] (acts [S, npos, *inner]: S sequences' activations at
    this point, e.g. cache[name] of another run; the mean is taken in double, in order; t indexes acts)."""
    return Action(_lib.MEAN_REPLACE, head, positions, seqs, src=acts)


def patch(acts, head=None, positions=None, seqs=None):
    """x[b, t, head] = acts[b - seq0, t, head] (acts [S, npos, *inner]: another run's activation at this
    point, e.g. its cache[name]; S >= the sequences patched, t indexes acts)."""
    return Action(_lib.PATCH, head, positions, seqs, src=acts)

"""_lib.py — finds libphasescope.so and declares the C API of include/phasescope.h for ctypes.

Where the library is looked for, first found wins:
  1. $PHASESCOPE_LIB (a path to the .so file);
  2. next to this package (python/phasescope/libphasescope.so: `make python` and `pip install` put it
     there);
  3. the build folder of the source tree this package sits in (build/libphasescope.so);
  4. the system's library path (ctypes.util.find_library, after `cmake --install`).
Every signature below is the header's; ctypes releases the GIL during each call."""
import ctypes
import ctypes.util
import os

from .errors import PhasescopeError

API_VERSION = 7  # include/phasescope.h's PS_API_VERSION this binding was written against

EFAIL = 1
EINPUT = 2
ECANCELLED = 3
ZERO, SET, ADD, MEAN_REPLACE, PATCH = 1, 2, 3, 4, 5

ERRLEN = 8192

c_int64_p = ctypes.POINTER(ctypes.c_int64)
c_float_p = ctypes.POINTER(ctypes.c_float)
c_double_p = ctypes.POINTER(ctypes.c_double)
c_int32_p = ctypes.POINTER(ctypes.c_int32)
c_int_p = ctypes.POINTER(ctypes.c_int)

# typedef int (*ps_api_hook_fn)(const char *name, float *data, const int64_t *shape, int rank, void *user);
HOOK_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, c_float_p, c_int64_p, ctypes.c_int, ctypes.c_void_p)
# typedef int (*ps_api_filter_fn)(const char *name, void *user);
FILTER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
# typedef int (*ps_api_progress_fn)(int64_t done, int64_t total, void *user);
PROGRESS_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)


def _prepare_env():
    """What the CLI's start-up does (core/cpu_env.c) that a library cannot do for its host process: OpenMP
    threads that sleep rather than spin while they wait (OMP_WAIT_POLICY=PASSIVE unless the user set it or
    GOMP_SPINCOUNT). It takes effect only when libgomp is not loaded yet: import phasescope before numpy
    (or set OMP_WAIT_POLICY yourself). Spinning threads cost the Python path 2-3x against the CLI on a
    busy machine (bench/bench_python.py)."""
    if not os.environ.get("OMP_WAIT_POLICY") and not os.environ.get("GOMP_SPINCOUNT"):
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def _candidates():
    env = os.environ.get("PHASESCOPE_LIB")
    if env:
        yield env
        return  # an explicit choice is not second-guessed
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libphasescope.so", "libphasescope.so.0"):
        yield os.path.join(here, name)
    root = os.path.dirname(os.path.dirname(here))  # python/phasescope -> the source tree
    yield os.path.join(root, "build", "libphasescope.so")
    found = ctypes.util.find_library("phasescope")
    if found:
        yield found


def _open():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(f"{path} (absent)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path} ({e})")
    raise PhasescopeError(
        "cannot find libphasescope.so: build it with `make python` (or cmake --build build --target ps_shared), "
        "or set PHASESCOPE_LIB to its path; tried: " + "; ".join(tried or ["nothing"]))


def _declare(lib):
    P, V = ctypes.c_void_p, ctypes.c_void_p
    s, i, i64, sz = ctypes.c_char_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t
    e = [ctypes.c_char_p, sz]  # char *err, size_t errlen (a create_string_buffer passes as char_p)
    sig = {
        "ps_api_version": (i, []),
        "ps_api_release": (s, []),
        "ps_api_devices": (s, []),
        "ps_api_free": (None, [P]),
        "ps_api_open": (i, [s, s, ctypes.POINTER(P)] + e),
        "ps_api_open_ex": (i, [s, s, s, ctypes.POINTER(P)] + e),
        "ps_api_tokenizer_open": (i, [s, ctypes.POINTER(P)] + e),
        "ps_api_tokenizer_free": (None, [P]),
        "ps_api_tokenizer_vocab_size": (i64, [P]),
        "ps_api_encode": (i, [P, ctypes.c_char_p, sz, i, ctypes.POINTER(c_int32_p), c_int64_p] + e),
        "ps_api_decode": (i, [P, c_int32_p, i64, i, ctypes.POINTER(P), ctypes.POINTER(sz)] + e),
        "ps_api_close": (None, [P]),
        "ps_api_set_progress": (None, [P, PROGRESS_FN, V]),
        "ps_api_family": (s, [P]),
        "ps_api_path": (s, [P]),
        "ps_api_device": (s, [P]),
        "ps_api_n_layers": (i64, [P]),
        "ps_api_vocab_size": (i64, [P]),
        "ps_api_context_length": (i64, [P]),
        "ps_api_config_json": (s, [P]),
        "ps_api_hook_points_json": (s, [P]),
        "ps_api_hook_names_json": (s, [P]),
        "ps_api_hook_shape": (i, [P, s, i64, i64, c_int64_p] + e),
        "ps_api_hooks_new": (P, []),
        "ps_api_hooks_free": (None, [P]),
        "ps_api_hooks_clear": (None, [P]),
        "ps_api_hooks_add_fn": (i, [P, s, HOOK_FN, V] + e),
        "ps_api_hooks_fail": (None, [P, s]),
        "ps_api_hooks_add_action": (i, [P, s, i, i, i64, i64, i64, i64, c_float_p, c_int64_p, i, ctypes.c_float] + e),
        "ps_api_hooks_count": (i, [P]),
        "ps_api_run_with_hooks": (i, [P, c_int32_p, i64, i64, P, ctypes.POINTER(P)] + e),
        "ps_api_run_with_cache": (i, [P, c_int32_p, i64, i64, ctypes.POINTER(ctypes.c_char_p), i, FILTER_FN, V, P, i,
                                      c_int32_p, ctypes.POINTER(P)] + e),
        "ps_api_output_free": (None, [P]),
        "ps_api_output_logits": (c_float_p, [P, c_int64_p]),
        "ps_api_output_count": (i, [P]),
        "ps_api_output_name": (s, [P, i]),
        "ps_api_output_data": (c_float_p, [P, i]),
        "ps_api_output_shape": (c_int64_p, [P, i, c_int_p]),
        "ps_api_output_grad": (c_float_p, [P, i]),
        "ps_api_output_find": (i, [P, s]),
        "ps_api_output_loss": (ctypes.c_double, [P]),
        "ps_api_output_n_targets": (i64, [P]),
        "ps_api_cache_new": (i, [P, ctypes.POINTER(P)] + e),
        "ps_api_cache_free": (None, [P]),
        "ps_api_cache_add": (i, [P, c_int_p] + e),
        "ps_api_cache_fork": (i, [P, i, c_int_p] + e),
        "ps_api_cache_drop": (i, [P, i] + e),
        "ps_api_cache_truncate": (i, [P, i, i64] + e),
        "ps_api_cache_len": (i64, [P, i]),
        "ps_api_cache_bytes": (i64, [P]),
        "ps_api_cache_append": (i, [P, i, c_int32_p, i64, P, c_float_p] + e),
        "ps_api_cache_n_entries": (i64, [P, i, i, i]),
        "ps_api_cache_entry_width": (i64, [P, s]),
        "ps_api_cache_entry": (i, [P, i, s, i, i64, c_float_p] + e),
        "ps_api_cache_edit": (i, [P, i, s, i, i64, s, c_float_p] + e),
        "ps_api_generate": (i, [P, c_int32_p, c_int64_p, i, i64, s, P, c_int32_p, c_double_p, c_int64_p] + e),
        "ps_api_instruments_json": (P, []),  # caller frees: a void * so ctypes does not copy and drop it
        "ps_api_instrument": (i, [P, s, s, ctypes.POINTER(P)] + e),
        "ps_api_instrument_ex": (i, [P, s, s, PROGRESS_FN, V, ctypes.POINTER(P)] + e),
        "ps_api_result_free": (None, [P]),
        "ps_api_result_json": (s, [P]),
        "ps_api_result_kind": (s, [P]),
        "ps_api_result_count": (i, [P]),
        "ps_api_result_name": (s, [P, i]),
        "ps_api_result_data": (c_double_p, [P, i]),
        "ps_api_result_shape": (c_int64_p, [P, i, c_int_p]),
        "ps_api_result_find": (i, [P, s]),
        "ps_api_result_dir": (s, [P]),
        "ps_api_result_files_json": (s, [P]),
        "ps_api_result_save": (i, [P, s] + e),
        "ps_api_result_figures_json": (s, [P] + e),
        "ps_api_result_figure": (ctypes.POINTER(ctypes.c_ubyte), [P, s, ctypes.POINTER(sz)] + e),
        "ps_api_serve_start": (i, [s, s, s, ctypes.POINTER(P)] + e),
        "ps_api_serve_port": (i, [P]),
        "ps_api_serve_name": (s, [P]),
        "ps_api_serve_stop": (None, [P]),
    }
    for name, (res, args) in sig.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise PhasescopeError(f"{lib._name} lacks {name}: the library is older than this package") from None
        f.restype = res
        f.argtypes = args


_prepare_env()
lib, path = _open()
_declare(lib)
if lib.ps_api_version() != API_VERSION:
    raise PhasescopeError(f"{path} implements API version {lib.ps_api_version()}, this package version {API_VERSION}: "
                          "rebuild the library and the package from one tree")


def errbuf():
    return ctypes.create_string_buffer(ERRLEN)


def text(b):
    return b.decode("utf-8", "replace") if b is not None else None


def check(rc, err, prefix=""):
    """Raise PhasescopeError with the C message when rc is not 0."""
    if rc:
        msg = err.value.decode("utf-8", "replace") or f"failed with code {rc}"
        if rc == ECANCELLED:
            from .errors import Cancelled
            raise Cancelled(prefix + msg, code=rc)
        raise PhasescopeError(prefix + msg, code=rc)


def enc(s):
    return s.encode("utf-8") if isinstance(s, str) else s

"""phasescope — the phasescope runtime and instruments from Python (numpy arrays, TransformerLens habits),
over libphasescope.so (include/phasescope.h) through ctypes. docs/python.md describes it.

    import phasescope as ps
    model = ps.load("data/models/deep_w8s8")
    logits, cache = model.run_with_cache(tokens, names=lambda n: n.endswith("hook_ck"))
    logits = model.run_with_hooks(tokens, fwd_hooks=[("blocks.10.attn.hook_ck", ps.actions.zero(head=3))])
    r = ps.knockout(model, n=16, layers=[10, 11], method="atp", verify=4)
    with ps.serve("data/models/w8s8", port=0) as s: ...   # an OpenAI-compatible server at s.url

Long calls release the GIL, take progress=fn(done, total) (a truthy return stops them: ps.Cancelled) and
stop on Ctrl-C (KeyboardInterrupt), the model usable after.
"""
from .errors import Cancelled, PhasescopeError
from . import _lib
from . import actions
from .kvcache import KVCache
from .model import ActivationCache, Model, load
from .prompts import PromptSet
from .tokenizer import Tokenizer
from .instruments import (Figure, Result, fillers, gatecycle, gates, instruments, knockout, patch, probe, recall, run, sweep,
                          train)
from .server import Server, serve

__version__ = _lib.text(_lib.lib.ps_api_release())
API_VERSION = _lib.API_VERSION
library_path = _lib.path


def devices():
    """The compute backends this build of libphasescope.so has (["cpu"] or ["cpu", "cuda"])."""
    return [d.strip() for d in _lib.text(_lib.lib.ps_api_devices()).split(",") if d.strip()]


__all__ = ["PhasescopeError", "Cancelled", "actions", "ActivationCache", "KVCache", "Model", "load", "PromptSet", "Tokenizer", "Figure", "Result", "fillers",
           "gatecycle", "gates", "instruments", "knockout", "patch", "probe", "recall", "run", "sweep", "train", "Server", "serve", "devices",
           "library_path", "API_VERSION"]

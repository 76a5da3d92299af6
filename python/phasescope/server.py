"""server.py — `phasescope serve` from Python (ps_api_serve_start underneath): an OpenAI-compatible server in
front of a checkpoint, on threads of the library's own, while Python goes on.

    with ps.serve("data/models/w8s8", port=0) as s:      # port 0: a free port
        urllib.request.urlopen(s.url + "/completions", ...)  # s.url: "http://127.0.0.1:PORT/v1"

The options are the CLI's serve flags as keyword arguments, dashes as underscores (host, port, tokenizer,
name, max_body, max_prompt_tokens, max_logprobs, max_tokens, max_prompts, max_connections, max_batch), with
the CLI's defaults (port 8000, host 127.0.0.1) and checks: an unknown or bad one raises PhasescopeError
naming it. docs/served-models.md describes the endpoints."""
import ctypes
import json
import os

from . import _lib
from .errors import PhasescopeError


class Server:
    """A running server (ps.serve). .port the port it listens on, .host the address, .url the OpenAI base
    URL ("http://HOST:PORT/v1"; 127.0.0.1 when it listens on every interface), .name the model's name in the
    API, .path the checkpoint. .stop() ends it (the requests in flight are answered 503); a with block stops
    it at its end, and it is stopped when collected too."""

    def __init__(self, path, device=None, **options):
        from .model import Model
        if isinstance(path, Model):  # a loaded model: its checkpoint and device (the server loads its own copy)
            path, device = path.path, device or path.device
        if not isinstance(path, (str, os.PathLike)):
            raise PhasescopeError(f"serve: a checkpoint directory path, not {path!r}")
        self._h = None
        self.path = os.fspath(path)
        h = ctypes.c_void_p()
        err = _lib.errbuf()
        opts = json.dumps({k: v for k, v in options.items() if v is not None}) if options else None
        _lib.check(_lib.lib.ps_api_serve_start(_lib.enc(self.path), _lib.enc(device), _lib.enc(opts), ctypes.byref(h), err,
                                               _lib.ERRLEN), err, "serve: ")
        self._h = h
        self.port = int(_lib.lib.ps_api_serve_port(h))
        self.name = _lib.text(_lib.lib.ps_api_serve_name(h))
        self.host = options.get("host") or "127.0.0.1"
        client_host = "127.0.0.1" if self.host == "0.0.0.0" else self.host
        self.url = f"http://{client_host}:{self.port}/v1"

    def stop(self):
        """Stop the server (again: nothing)."""
        h, self._h = self._h, None
        if h:
            _lib.lib.ps_api_serve_stop(h)

    close = stop

    @property
    def running(self):
        return self._h is not None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def __del__(self):
        try:
            self.stop()
        except Exception:
            pass

    def __repr__(self):
        state = "running" if self._h else "stopped"
        return f"<phasescope.Server {self.name!r} at {self.url} ({state})>"


def serve(path, device=None, **options):
    """Serve the checkpoint `path` (or a ps.Model's checkpoint) on `device` (None: "cpu") over the OpenAI
    completions API until .stop() (or the end of a with block). options: the CLI's serve flags (see the
    module's help); port=0 picks a free port (Server.port says which)."""
    return Server(path, device, **options)

"""progress.py — progress callbacks and Ctrl-C for the long C calls (include/phasescope.h, "progress and
cancellation": ps_api_set_progress, ps_api_instrument_ex).

Every long call (an instrument, a run) takes progress=fn: fn(done, total) is called at the end of each
unit of the call's work (progress=True: a progress bar, tqdm's when python3-tqdm is installed, else a line on
stderr) (batches, shifts, candidates, steps; a run's layers), in the calling thread; a
truthy return stops the call there and raises ps.Cancelled ("cancelled after 3 of 16 batches"); an
exception raised by fn stops it too and is raised after it.

Ctrl-C: a ctypes call releases the GIL and runs C code in the main thread, where Python's SIGINT handler
cannot run (the C-level handler only records the signal; the Python-level one, which raises
KeyboardInterrupt, waits for the main thread to run Python code). The progress callback is such code: for
the duration of the call a handler that only records the signal is installed, the callback runs pending
handlers (PyErr_CheckSignals) and, when SIGINT came, returns "stop"; the C call stops at its next unit,
frees what it made, and returns; the old handler is put back and KeyboardInterrupt is raised (the model
runs again as before)."""
import ctypes
import signal
import sys
import threading

from . import _lib
from .errors import Cancelled

_check_signals = ctypes.pythonapi.PyErr_CheckSignals
_check_signals.restype = ctypes.c_int
_check_signals.argtypes = []


class Bar:
    """progress=True: a bar per phase of the call (a new total starts a new bar): tqdm's (tqdm.auto: a widget in a
    notebook) when it is installed, else one line on stderr redrawn in place."""

    def __init__(self, desc=None):
        self.desc, self.total, self.bar = desc, None, None
        try:
            from tqdm.auto import tqdm
            self._tqdm = tqdm
        except ImportError:
            self._tqdm = None

    def __call__(self, done, total):
        if total != self.total or self.bar is None:
            self.close()
            self.total = total
            if self._tqdm is not None:
                self.bar = self._tqdm(total=total, desc=self.desc, leave=False)
            else:
                self.bar = [0]
        if self._tqdm is not None:
            self.bar.update(done - self.bar.n)
        else:
            w = 30
            fill = w * done // total if total else w
            sys.stderr.write(f"\r{self.desc or 'phasescope'} [{'#' * fill}{'.' * (w - fill)}] {done}/{total}")
            sys.stderr.flush()
            self.bar[0] = done
        return False

    def close(self):
        if self.bar is None:
            return
        if self._tqdm is not None:
            self.bar.close()
        else:
            sys.stderr.write("\n")
            sys.stderr.flush()
        self.bar = None


class Call:
    """One long C call's progress callback: `with Call(fn) as c:` then pass c.cb (a PROGRESS_FN) to C,
    and c.finish(rc, err) after it returns (raises what the call's outcome asks for).

    stop_event: a threading.Event another thread sets to stop the call (train runs in a worker thread)."""

    def __init__(self, fn=None, stop_event=None, desc=None):
        self.bar = Bar(desc) if fn is True else None
        self.fn = self.bar if fn is True else fn
        self.stop_event = stop_event
        self.interrupted = False
        self.exc = None
        self._old = None
        self.cb = _lib.PROGRESS_FN(self._call)

    def _on_sigint(self, signum, frame):
        self.interrupted = True

    def _call(self, done, total, user):
        try:
            _check_signals()  # runs a pending SIGINT's handler (ours: it records it)
            if self.interrupted or (self.stop_event is not None and self.stop_event.is_set()):
                return 1
            if self.fn is not None and self.fn(int(done), int(total)):
                return 1
            return 0
        except BaseException as e:  # the callback's exception (or a KeyboardInterrupt of another handler)
            self.exc = e
            return 1

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            old = signal.getsignal(signal.SIGINT)
            if callable(old):  # Python's default_int_handler, or the user's (SIG_IGN / SIG_DFL: left alone)
                self._old = old
                signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
        if self._old is not None:
            try:
                _check_signals()  # a SIGINT that came after the last callback
            finally:
                signal.signal(signal.SIGINT, self._old)
        return False

    def finish(self, rc, err, on_failure=None):
        """After the C call (outside the with block): Ctrl-C -> the old handler (KeyboardInterrupt); the
        callback's exception; else rc's error (ps.Cancelled for a stop asked by progress=), through
        on_failure(rc, err) when given."""
        if self.interrupted:
            msg = err.value.decode("utf-8", "replace") if rc else ""
            handler, self.interrupted = self._old, False
            if handler is not None and handler is not signal.default_int_handler:
                handler(signal.SIGINT, None)  # the user's handler decides
            else:
                e = KeyboardInterrupt()
                if msg:
                    e.add_note(f"phasescope: {msg}")
                raise e
        if self.exc is not None:
            e, self.exc = self.exc, None
            if rc:
                e.add_note(f"phasescope: {err.value.decode('utf-8', 'replace')}")
            raise e
        if rc:
            if on_failure is not None:
                on_failure(rc, err)
            _lib.check(rc, err)
        return rc


__all__ = ["Bar", "Call", "Cancelled"]

"""conftest.py — what the Python package's tests share: the source tree, the build (PHASESCOPE_BUILD, default
build/; the package finds its libphasescope.so through PHASESCOPE_LIB, which tests/CMakeLists.txt sets),
the CLI for the reference numbers, and a reader of the CLI's safetensors output.
Run: PYTHONPATH=python /usr/bin/python3 -m pytest python/tests (from the repository root)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("PHASESCOPE_BUILD", os.path.join(ROOT, "build"))
CLI = os.path.join(BUILD, "phasescope")
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("PHASESCOPE_LIB", os.path.join(BUILD, "libphasescope.so"))
os.environ.setdefault("OMP_NUM_THREADS", "2")

import phasescope as ps  # noqa: E402


def model_path(rel):
    return os.path.join(ROOT, rel)


def cli(*args, cwd=None):
    """Run the CLI; its stdout (raises with its stderr on failure)."""
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, cwd=cwd or ROOT)
    if r.returncode:
        raise AssertionError(f"phasescope {' '.join(map(str, args))} failed ({r.returncode}): {r.stderr[-2000:]}")
    return r.stdout


def read_safetensors(path):
    """name -> float32 ndarray (F32 tensors only: what forward writes)."""
    with open(path, "rb") as f:
        buf = f.read()
    n = int.from_bytes(buf[:8], "little")
    head = json.loads(buf[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        assert v["dtype"] == "F32", f"{k}: {v['dtype']}"
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(buf[8 + n + a:8 + n + b], dtype=np.float32).reshape(v["shape"])
    return out


def bits_equal(a, b):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.fixture(scope="session")
def deep():
    m = ps.load(model_path("data/models/deep_w8s8"))
    yield m
    m.close()


@pytest.fixture(scope="session")
def w8s8():
    m = ps.load(model_path("data/models/w8s8"))
    yield m
    m.close()


def tokens(B, T, V, salt=0):
    i = np.arange(B * T).reshape(B, T)
    return ((i * 37 + 11 + salt * 13 + i // 7) % V).astype(np.int32)

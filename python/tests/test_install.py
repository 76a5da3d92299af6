"""`pip install ./python` into a virtual environment with no network (--no-build-isolation --no-index;
the venv sees Debian's numpy through --system-site-packages): the installed package carries
libphasescope.so next to itself, finds it there with no PHASESCOPE_LIB, and runs a model. The package is
copied out of the tree first, so the test writes nothing into the source."""
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT, model_path


def test_pip_install_offline(tmp_path):
    if subprocess.run([sys.executable, "-c", "import venv, ensurepip, setuptools, wheel"], capture_output=True).returncode:
        pytest.fail("venv, ensurepip, setuptools or wheel missing (Debian: apt-get install python3-venv python3-setuptools "
                    "python3-wheel; scripts/setup.sh installs them)")
    src = tmp_path / "python"
    shutil.copytree(os.path.join(ROOT, "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests", "libphasescope.so*"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps", str(src)]
    env = dict(os.environ)  # PHASESCOPE_LIB (this build's library) tells setup.py what to copy
    r = subprocess.run(pip, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    env.pop("PHASESCOPE_LIB")
    env.pop("PYTHONPATH", None)
    code = ("import phasescope as ps, os; m = ps.load(os.environ['M']); "
            "print(ps.library_path); print(m(list(range(2, 20))).shape)")
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                       env=dict(env, M=model_path("data/models/w8s8")), cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-2000:]
    lib, shape = r.stdout.split("\n")[:2]
    assert lib.startswith(str(venv)) and lib.endswith("phasescope/libphasescope.so"), lib
    assert shape == "(1, 18, 96)"

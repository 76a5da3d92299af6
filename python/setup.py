"""setup.py — only what pyproject.toml cannot say: the built libphasescope.so goes into the package (so the
installed package finds it next to itself), and the wheel is marked platform-specific because of it.
The library is $PHASESCOPE_LIB, else ../build/libphasescope.so (`make python` builds it)."""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def built_library():
    cands = [os.environ.get("PHASESCOPE_LIB"), os.path.join(HERE, "..", "build", "libphasescope.so")]
    for c in cands:
        if c and os.path.exists(c):
            return os.path.realpath(c)
    raise SystemExit("phasescope: libphasescope.so not found: run `make python` in the source tree first, "
                     "or set PHASESCOPE_LIB to the built library")


class BuildPy(build_py):
    def run(self):
        super().run()
        dst = os.path.join(self.build_lib, "phasescope", "libphasescope.so")
        self.mkpath(os.path.dirname(dst))
        shutil.copyfile(built_library(), dst)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)

#!/usr/bin/env bash
# python_tests.sh SRC_DIR BUILD_DIR [PYTEST ARGS...] — the Python package's tests (python/tests, pytest) against
# this build's libphasescope.so and phasescope CLI, with Debian's interpreter (PS_PYTHON, default
# /usr/bin/python3: python3-numpy, python3-pytest; the notebook test also needs python3-nbconvert and
# python3-ipykernel). Fails with the reason when numpy or pytest is missing: scripts/setup.sh installs
# them, so that is never a skip. Not registered in the sanitizer build: a plain interpreter cannot load an
# ASan library.
set -uo pipefail
src=${1:?usage: python_tests.sh SRC_DIR BUILD_DIR [PYTEST ARGS...]}; build=${2:?}; shift 2
py=${PS_PYTHON:-/usr/bin/python3}
if [ ! -x "$py" ]; then echo "FAIL: no $py (Debian: apt-get install python3 python3-numpy python3-pytest; scripts/setup.sh installs them)"; exit 1; fi
for mod in numpy pytest; do
  if ! "$py" -c "import $mod" 2>/dev/null; then
    echo "FAIL: $py cannot import $mod (Debian: apt-get install python3-$mod; scripts/setup.sh installs it)"; exit 1
  fi
done
export PHASESCOPE_LIB="$build/libphasescope.so" PHASESCOPE_BUILD="$build" PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
cd "$src" && exec "$py" -m pytest -q -p no:cacheprovider python/tests "$@"

#!/usr/bin/env bash
# The Python package: `pip install .` into a virtual environment (build-py/venv,
# kept between runs; pip's cache keeps the downloads) and its pytest suite, run
# from outside the source tree so the installed package is what is imported.
# GPU tests skip, saying why, where torch or a GPU is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
venv=build-py/venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q ".[test]"
cd build-py
../"$venv"/bin/python -m pytest -rs ../tests/python

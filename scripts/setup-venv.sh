#!/usr/bin/env bash
# Creates ./.venv with the Python packages the reference scripts, benchmarks and the utility study
# use (none of them is needed by `cargo nextest`). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/pip install --quiet --upgrade pip
# diffprivlib 0.6 needs scikit-learn < 1.6 (it imports sklearn.tree._tree.DOUBLE, removed in 1.6).
# opendp and diffprivlib are pinned: scripts/peer_utility.py compares dpfusion against them and
# docs/UTILITY.md records the versions it ran (OpenDP's Python API changes between minor releases).
.venv/bin/pip install --quiet numpy "scikit-learn<1.6" diffprivlib==0.6.6 dp-accounting matplotlib \
    opendp==0.16.0
.venv/bin/python -c "import importlib.metadata, numpy, sklearn, diffprivlib, dp_accounting, matplotlib, opendp; print('venv ready:', numpy.__version__, sklearn.__version__, 'diffprivlib', diffprivlib.__version__, 'opendp', importlib.metadata.version('opendp'))"

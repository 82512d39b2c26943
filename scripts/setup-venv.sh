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
.venv/bin/pip install --quiet numpy "scikit-learn<1.6" diffprivlib dp-accounting matplotlib
.venv/bin/python -c "import numpy, sklearn, diffprivlib, dp_accounting, matplotlib; print('venv ready:', numpy.__version__, sklearn.__version__)"

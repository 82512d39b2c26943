#!/usr/bin/env bash
# Creates the Python environment of `dpfusion serve`'s third-party client test (tests/it/serve.rs,
# tests/serve_client.py): pyarrow and the ADBC Flight SQL driver. A sibling of setup-venv.sh,
# kept apart so the test installs only what it needs. Idempotent; prints the venv's python.
#
#   DPFUSION_SERVE_VENV   where to create it (default ~/.cache/dpfusion/venv-serve)
set -euo pipefail
venv="${DPFUSION_SERVE_VENV:-$HOME/.cache/dpfusion/venv-serve}"
if ! "$venv/bin/python" -c "import adbc_driver_flightsql.dbapi, pyarrow" 2>/dev/null; then
    mkdir -p "$(dirname "$venv")"
    if [ ! -x "$venv/bin/python" ]; then
        python3 -m venv "$venv"
    fi
    "$venv/bin/pip" install --quiet --disable-pip-version-check adbc-driver-flightsql pyarrow >&2
    "$venv/bin/python" -c "import adbc_driver_flightsql.dbapi, pyarrow" >&2
fi
echo "$venv/bin/python"

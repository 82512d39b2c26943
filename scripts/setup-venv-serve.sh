#!/usr/bin/env bash
# Creates the Python environment of `dpfusion serve`'s client tests (dpfusion-cli/tests/it/serve.rs running
# tests/serve_client.py and python/tests/test_client.py): pyarrow, pandas, the ADBC Flight SQL
# driver, and the project's own Python package (python/, `pip install ./python`), reinstalled
# when its sources change. A sibling of setup-venv.sh, kept apart so the test installs only what
# it needs. Idempotent; prints the venv's python.
#
#   DPFUSION_SERVE_VENV   where to create it (default ~/.cache/dpfusion/venv-serve)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${DPFUSION_SERVE_VENV:-$HOME/.cache/dpfusion/venv-serve}"
pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
# One setup at a time (tests run in parallel).
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if ! "$venv/bin/python" -c "import adbc_driver_flightsql.dbapi, pyarrow, pandas" 2>/dev/null; then
    mkdir -p "$(dirname "$venv")"
    if [ ! -x "$venv/bin/python" ]; then
        python3 -m venv "$venv"
    fi
    "${pip[@]}" adbc-driver-flightsql pyarrow pandas >&2
    "$venv/bin/python" -c "import adbc_driver_flightsql.dbapi, pyarrow, pandas" >&2
fi
# The package, installed as a user would (not editable); the stamp is a hash of its sources.
stamp="$venv/.dpfusion-python.sha256"
sum=$(cd "$root/python" && find . -type f \( -name '*.py' -o -name '*.toml' -o -name '*.md' \) \
    -not -path './build/*' -not -path '*.egg-info/*' | LC_ALL=C sort | xargs sha256sum | sha256sum)
if [ "$(cat "$stamp" 2>/dev/null)" != "$sum" ] || ! "$venv/bin/python" -c "import dpfusion" 2>/dev/null; then
    # A copy: pip's build writes build/ and *.egg-info beside the sources otherwise.
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    cp -r "$root/python" "$tmp/python"
    "${pip[@]}" --force-reinstall --no-deps "$tmp/python" >&2
    echo "$sum" > "$stamp"
fi
echo "$venv/bin/python"

#!/usr/bin/env bash
# The differential fuzzer's long mode (tests/it/fuzz.rs): run before each release.
#   scripts/fuzz.sh --minutes N [--seed S]
# Runs the same test binary as CI for N minutes from seed S (default: the time), and writes the
# shrunk new findings to target/fuzz-findings.sql (kept cases go to
# tests/data/fuzz_regressions.sql). The case under way is kept in target/fuzz-current.sql, so
# that a process abort (which nothing can catch) still names its query.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=10
seed=$(date +%s)
while [ $# -gt 0 ]; do
    case "$1" in
        --minutes) minutes="$2"; shift 2 ;;
        --seed) seed="$2"; shift 2 ;;
        -h|--help) sed -n 2,7p "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
target="${CARGO_TARGET_DIR:-target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
mkdir -p "$target"
echo "fuzzing for $minutes minute(s) from seed $seed"
DPFUSION_FUZZ_MINUTES="$minutes" DPFUSION_FUZZ_SEED="$seed" DPFUSION_FUZZ_SHRINK_OPEN=1 \
DPFUSION_FUZZ_OUT="${DPFUSION_FUZZ_OUT:-$target/fuzz-findings.sql}" \
DPFUSION_FUZZ_CURRENT="$target/fuzz-current.sql" \
    cargo test --test it -- fuzz::differential_fuzz --nocapture || {
    status=$?
    echo "the fuzzer failed (status $status); the case under way: $target/fuzz-current.sql" >&2
    exit $status
}

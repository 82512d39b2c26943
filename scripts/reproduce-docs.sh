#!/usr/bin/env bash
# Reproduces every number and plot of docs/PERFORMANCE.md and docs/UTILITY.md (issue 8):
#   1. the Python virtualenv (.venv: numpy, scikit-learn, diffprivlib, matplotlib);
#   2. the release build (binary, benches, examples);
#   3. the speed benchmarks -> docs/bench/speed.md, docs/bench/models.md, docs/bench/ledger.md
#      (raw outputs);
#   4. the utility study -> docs/UTILITY.md, docs/*.png.
# Honours CARGO_TARGET_DIR. Takes about an hour on 2 cores (the study is most of it).
# Options: --quick (1M-row aggregates, n = 100k models, the study's --quick mode);
#          --no-study / --no-bench to run one half only.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=""; study=1; bench=1
for a in "$@"; do
    case "$a" in
        --quick) quick="--quick" ;;
        --no-study) study=0 ;;
        --no-bench) bench=0 ;;
        *) echo "unknown option: $a" >&2; exit 2 ;;
    esac
done
scripts/setup-venv.sh
cargo build --release --bins --benches --examples
mkdir -p docs/bench
if [ "$bench" = 1 ]; then
    { echo "Machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(free -g | awk '/Mem:/{print $2}') GiB; $(date -u +%Y-%m-%d); load average $(cut -d' ' -f1-3 /proc/loadavg)"; echo; \
      cargo bench --bench speed -- $quick; } | tee docs/bench/speed.md
    { echo "Machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(free -g | awk '/Mem:/{print $2}') GiB; $(date -u +%Y-%m-%d); load average $(cut -d' ' -f1-3 /proc/loadavg)"; echo; \
      cargo bench --bench models -- $quick; } | tee docs/bench/models.md
    { echo "Machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'), $(free -g | awk '/Mem:/{print $2}') GiB; $(date -u +%Y-%m-%d)"; echo; \
      cargo bench --bench ledger; } | tee docs/bench/ledger.md
fi
if [ "$study" = 1 ]; then
    .venv/bin/python scripts/utility_study.py $quick
fi
echo "done: docs/bench/*.md, docs/UTILITY.md, docs/*.png (docs/PERFORMANCE.md quotes these numbers)"

#!/usr/bin/env python3
"""DP-SGD utility (issue 30; docs/UTILITY.md, "DP-SGD"): dp_logreg_sgd (noise 'independent' and
'mf') beside dp_logreg_agd on BANK and IPUMS-BR, through SQL, at eps in {0.1, 0.4, 1.6}.

Pure Python (no numpy): reads $DPFUSION_DATA_DIR/{BANK,IPUMS-BR}.dat (the DP-AGD paper's
preprocessed files, label in the last column; not in this repository), standardises every
feature on the whole file (mean 0, sd 1: public preprocessing, as the defaults assume), splits
70/30 with a fixed seed, writes the training rows to a CSV and fits each model with one query of
the `dpfusion` binary on a fresh ledger (`--filter rdp`, which admits all three charges), with
defaults only (epsilon and delta given). Reports test accuracy (mean +- sd over runs) and the
rows each fit read: q*n*T expected for Poisson DP-SGD, n for 'mf' (one pass), n per iteration
for DP-AGD (one gradient pass per iteration; its step selection reads them once more).

    DPFUSION_DATA_DIR=/path/to/data python3 scripts/sgd_utility.py [--bin target/debug/dpfusion] [--runs 3]
"""
import argparse
import csv
import json
import math
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DELTA = 1e-6
EPSILONS = [0.1, 0.4, 1.6]


def load(path):
    X, y = [], []
    with open(path) as f:
        for line in f:
            v = [float(t) for t in line.split()]
            if v:
                X.append(v[:-1])
                y.append(1.0 if v[-1] > 0 else 0.0)
    d = len(X[0])
    n = len(X)
    for j in range(d):
        m = sum(r[j] for r in X) / n
        sd = math.sqrt(sum((r[j] - m) ** 2 for r in X) / n) or 1.0
        for r in X:
            r[j] = (r[j] - m) / sd
    return X, y


def split(X, y, seed=7):
    idx = list(range(len(y)))
    random.Random(seed).shuffle(idx)
    cut = int(0.7 * len(y))
    tr, te = idx[:cut], idx[cut:]
    return [X[i] for i in tr], [y[i] for i in tr], [X[i] for i in te], [y[i] for i in te]


def write_csv(path, X, y):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"x{i}" for i in range(len(X[0]))] + ["y"])
        for row, t in zip(X, y):
            w.writerow([f"{v:.8g}" for v in row] + [f"{t:g}"])


def fit(binary, path, d, function, eps, extra=""):
    feats = "make_array(" + ", ".join(f"x{i}" for i in range(d)) + ")"
    sql = f"SELECT {function}(y, {feats}, epsilon => {eps}, delta => {DELTA}{extra}) AS m FROM train"
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [binary, "--ledger", os.path.join(tmp, "l.jsonl"), "--filter", "rdp",
             "--epsilon", "100", "--delta", "1e-5",
             "--private", f"train={path}", "--format", "json", "-q", "-c", sql],
            capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    m = json.loads(out.stdout)[0]["m"]
    return [float(c) for c in m["coefficients"]], float(m["intercept"] or 0.0), int(m["iterations"] or 0)


def accuracy(w, b, X, y):
    ok = sum(1 for r, t in zip(X, y) if ((sum(a * c for a, c in zip(w, r)) + b) > 0) == (t == 1.0))
    return ok / len(y)


def mean_sd(v):
    m = sum(v) / len(v)
    sd = math.sqrt(sum((x - m) ** 2 for x in v) / max(1, len(v) - 1))
    return m, sd


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "dpfusion"))
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    data = os.environ.get("DPFUSION_DATA_DIR")
    if not data:
        sys.exit("set DPFUSION_DATA_DIR to the directory holding BANK.dat and IPUMS-BR.dat")
    models = [
        ("dp_logreg_sgd (independent)", "dp_logreg_sgd", "", lambda n, it: 0.01 * n * 1000),
        ("dp_logreg_sgd (mf)", "dp_logreg_sgd", ", noise => 'mf'", lambda n, it: n),
        ("dp_logreg_agd", "dp_logreg_agd", "", lambda n, it: n * it),
    ]
    for name in ["BANK", "IPUMS-BR"]:
        X, y = load(os.path.join(data, f"{name}.dat"))
        Xtr, ytr, Xte, yte = split(X, y)
        d = len(X[0])
        majority = max(sum(yte), len(yte) - sum(yte)) / len(yte)
        print(f"### {name} (n = {len(y)}, d = {d}; train {len(ytr)}, test {len(yte)}; "
              f"test majority {100 * majority:.2f}%)\n")
        print("| ε | " + " | ".join(f"{m[0]}: acc (%) | rows read" for m in models) + " |")
        print("|---|" + "---|---|" * len(models))
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "train.csv")
            write_csv(path, Xtr, ytr)
            for eps in EPSILONS:
                cells = []
                for _, fn, extra, rows in models:
                    accs, its = [], []
                    for _ in range(a.runs):
                        w, b, it = fit(a.bin, path, d, fn, eps, extra)
                        accs.append(100 * accuracy(w, b, Xte, yte))
                        its.append(it)
                    m, sd = mean_sd(accs)
                    cells.append(f"{m:.2f} ± {sd:.2f} | {rows(len(ytr), sum(its) / len(its)):,.0f}")
                print(f"| {eps} | " + " | ".join(cells) + " |", flush=True)
        print()


if __name__ == "__main__":
    main()

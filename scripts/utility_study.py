#!/usr/bin/env python3
"""Utility study (issue 8): accuracy / R² of dpfusion's DP models against baselines, per ε.

For each dataset and each ε in EPSILONS, RUNS fits by the real `dpfusion` binary (a fresh ledger
each time, so budgets never interfere), evaluated on a held-out test split (30%, fixed seed),
beside: the non-private fit (scikit-learn), diffprivlib at the same ε, and the trivial baseline
(majority class / mean). Writes docs/UTILITY.md and docs/utility_*.png.

Datasets (features scaled to [-1, 1] by min-max over the whole table — a public, documented
transformation that uses the data's range; in a real deployment the range comes from the schema —
then rows scaled so that ‖x‖ ≤ 1):
- demo `patients` (disease: logistic; cost: linear), exported from the binary's demo table;
- BANK and IPUMS-BR, the DP-AGD paper's preprocessed data (../shared/data; skipped if absent),
  with the paper's reported DP-AGD accuracy beside ours (research/dpagd.md);
- scikit-learn's bundled breast cancer (classification) and diabetes (regression) datasets.

Run: scripts/setup-venv.sh && .venv/bin/python scripts/utility_study.py [--quick]
(builds `cargo build --release` first). --quick: 3 runs, 3 ε values, small datasets only.
"""
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "dpfusion")
QUICK = "--quick" in sys.argv
EPSILONS = [0.1, 1.0, 5.0] if QUICK else [0.1, 0.5, 1.0, 2.0, 5.0]
RUNS = 3 if QUICK else 10
DELTA = 1e-6
# DP-AGD paper accuracy as reported in research/dpagd.md §3.2 (corrected reference, mode fixed),
# filled by hand from that table where available; None when not reported for that ε.
PAPER = {"BANK": {}, "IPUMS-BR": {}}


def scale(X):
    lo, hi = X.min(axis=0), X.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    Z = 2 * (X - lo) / span - 1
    norms = np.maximum(np.linalg.norm(Z, axis=1, keepdims=True), 1.0)
    return Z / norms


def split(X, y, seed=7):
    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(y))
    cut = int(0.7 * len(y))
    return X[idx[:cut]], y[idx[:cut]], X[idx[cut:]], y[idx[cut:]]


def write_csv(path, X, y):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([f"x{i}" for i in range(X.shape[1])] + ["y"])
        for row, t in zip(X, y):
            w.writerow([f"{v:.10g}" for v in row] + [f"{t:.10g}"])


def dp_fit(function, X, y, eps, extra=""):
    d = X.shape[1]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "train.csv")
        write_csv(path, X, y)
        feats = "make_array(" + ", ".join(f"x{i}" for i in range(d)) + ")"
        sql = f"SELECT {function}(y, {feats}, epsilon => {eps}, delta => {DELTA}{extra}) AS m FROM train"
        out = subprocess.run(
            [BIN, "--ledger", os.path.join(tmp, "l.jsonl"), "--epsilon", str(eps * 1.01 + 1e-9),
             "--delta", str(DELTA * 1.01), "--private", f"train={path}", "--format", "json", "-q", "-c", sql],
            capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        m = json.loads(out.stdout)[0]["m"]
        return np.array(m["coefficients"], dtype=float), float(m["intercept"] or 0.0)


def accuracy(w, b, X, y):
    return float(np.mean(((X @ w + b) > 0).astype(float) == y))


def r2(w, b, X, y):
    pred = X @ w + b
    return float(1 - np.sum((y - pred) ** 2) / np.sum((y - y.mean()) ** 2))


def datasets():
    from sklearn.datasets import load_breast_cancer, load_diabetes
    out = []
    bc = load_breast_cancer()
    out.append(("breast cancer (sklearn)", "classification", scale(bc.data), bc.target.astype(float)))
    db = load_diabetes()
    yd = db.target
    yd = (yd - yd.min()) / (yd.max() - yd.min()) * 2 - 1
    out.append(("diabetes (sklearn)", "regression", scale(db.data), yd))
    # The demo `patients` table, exported by `cargo run --release --example export_demo`.
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["cargo", "run", "--release", "-q", "--example", "export_demo", "--", tmp],
                       cwd=ROOT, check=True, capture_output=True)
        P = np.genfromtxt(os.path.join(tmp, "patients.csv"), delimiter=",", names=True)
    feats = np.column_stack([P[c] for c in ["age", "bmi", "bp", "chol", "smoker"]])
    out.append(("demo patients: disease", "classification", scale(feats), P["disease"].astype(float)))
    cost = P["cost"]
    out.append(("demo patients: cost", "regression", scale(feats), (cost - cost.min()) / (cost.max() - cost.min()) * 2 - 1))
    shared = os.path.join(ROOT, "..", "shared", "data")
    if not QUICK:
        for name in ["BANK", "IPUMS-BR"]:
            p = os.path.join(shared, f"{name}.dat")
            if os.path.exists(p):
                A = np.loadtxt(p)
                X, y = A[:, :-1], A[:, -1]
                y = (y > 0).astype(float)
                out.append((name, "classification", scale(X), y))
    return out


def baselines(kind, Xtr, ytr, Xte, yte, eps):
    from sklearn.linear_model import LinearRegression, LogisticRegression
    res = {}
    if kind == "classification":
        clf = LogisticRegression(max_iter=2000).fit(Xtr, ytr)
        res["non-private"] = float(clf.score(Xte, yte))
        res["majority"] = float(max(np.mean(yte), 1 - np.mean(yte)))
        try:
            from diffprivlib.models import LogisticRegression as DPLR
            accs = []
            for s in range(RUNS):
                m = DPLR(epsilon=eps, data_norm=1.0, random_state=s, max_iter=1000).fit(Xtr, ytr)
                accs.append(float(m.score(Xte, yte)))
            res["diffprivlib"] = (float(np.mean(accs)), float(np.std(accs)))
        except Exception as e:  # noqa: BLE001
            res["diffprivlib"] = f"n/a ({type(e).__name__})"
    else:
        reg = LinearRegression().fit(Xtr, ytr)
        res["non-private"] = float(reg.score(Xte, yte))
        res["mean"] = 0.0
        try:
            from diffprivlib.models import LinearRegression as DPLin
            scores = []
            for s in range(RUNS):
                m = DPLin(epsilon=eps, bounds_X=(-1, 1), bounds_y=(-1, 1), random_state=s).fit(Xtr, ytr)
                scores.append(float(m.score(Xte, yte)))
            res["diffprivlib"] = (float(np.mean(scores)), float(np.std(scores)))
        except Exception as e:  # noqa: BLE001
            res["diffprivlib"] = f"n/a ({type(e).__name__})"
    return res


def fmt(v):
    if isinstance(v, tuple):
        return f"{v[0]:.3f} ± {v[1]:.3f}"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def main():
    if not os.path.exists(BIN):
        subprocess.run(["cargo", "build", "--release"], cwd=ROOT, check=True)
    lines = ["# Utility study", "",
             f"Generated by `scripts/utility_study.py` on {time.strftime('%Y-%m-%d')}; {RUNS} runs per cell, "
             f"δ = {DELTA}; test split 30%. Mean ± standard deviation over runs.", ""]
    plots = []
    for name, kind, X, y in datasets():
        Xtr, ytr, Xte, yte = split(X, y)
        metric = "accuracy" if kind == "classification" else "R²"
        function = "dp_logreg_agd" if kind == "classification" else "dp_linreg_gd"
        lines += [f"## {name} ({kind}, n = {len(y)}, d = {X.shape[1]}; {metric})", "",
                  f"| ε | dpfusion `{function}` | diffprivlib | non-private | trivial |", "|---|---|---|---|---|"]
        series = []
        for eps in EPSILONS:
            scores = []
            for _ in range(RUNS):
                w, b = dp_fit(function, Xtr, ytr, eps)
                scores.append(accuracy(w, b, Xte, yte) if kind == "classification" else r2(w, b, Xte, yte))
            base = baselines(kind, Xtr, ytr, Xte, yte, eps)
            ours = (float(np.mean(scores)), float(np.std(scores)))
            series.append((eps, ours[0], ours[1], base))
            trivial = base.get("majority", base.get("mean"))
            lines.append(f"| {eps} | {fmt(ours)} | {fmt(base['diffprivlib'])} | {fmt(base['non-private'])} | {fmt(trivial)} |")
            print(name, eps, ours, base, flush=True)
        lines.append("")
        plots.append((name, metric, series))
    os.makedirs(os.path.join(ROOT, "docs"), exist_ok=True)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        for name, metric, series in plots:
            fig, ax = plt.subplots(figsize=(5, 3.5))
            eps = [s[0] for s in series]
            ax.errorbar(eps, [s[1] for s in series], yerr=[s[2] for s in series], label="dpfusion", marker="o")
            dpl = [s[3]["diffprivlib"] for s in series]
            if all(isinstance(v, tuple) for v in dpl):
                ax.errorbar(eps, [v[0] for v in dpl], yerr=[v[1] for v in dpl], label="diffprivlib", marker="s")
            ax.axhline(series[0][3]["non-private"], color="k", ls="--", label="non-private")
            ax.set_xscale("log")
            ax.set_xlabel("ε")
            ax.set_ylabel(metric)
            ax.set_title(name)
            ax.legend()
            fn = "utility_" + "".join(c if c.isalnum() else "_" for c in name.lower()) + ".png"
            fig.tight_layout()
            fig.savefig(os.path.join(ROOT, "docs", fn), dpi=110)
            lines.append(f"![{name}]({fn})")
    except ImportError:
        pass
    with open(os.path.join(ROOT, "docs", "UTILITY.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote docs/UTILITY.md")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Seed 001's running example on sklearn's `digits` (issue 30; docs/UTILITY.md, "DP-SGD", "The
seed's running example on digits"), through SQL.

The seed trains a two-layer ReLU network (128 hidden units) on 5,000 MNIST images at eps = 1,
delta = 1e-6, clip 30: DP-SGD with Poisson rate q = 0.05 and T = 200 steps, and the matrix
factorisation mechanism with batches of 25 in one pass. The stand-in is the `digits` data set
bundled with scikit-learn (1,797 images, 8x8, 10 classes): pixels scaled from [0, 16] to [0, 1]
(public preprocessing), a stratified 70/30 train/test split per repeat (seed = the repeat's
index). Each private fit is one query of the `dpfusion` binary on a fresh ledger with the `rdp`
filter (Poisson DP-SGD needs it) and a generous table budget; the call's own (eps, delta) is
(1, 1e-6). Test accuracy is computed here from the returned weights in the layout of
udfs/src/optim/mlp.rs (the same forward pass as `mlp_predict`).

Models (none tuned on the test data):
- `dp_mlp_sgd` with its defaults (hidden 32, q 0.01, 1000 steps, clip 1, learning_rate 0.5);
- `dp_mlp_sgd` in the seed's shape: hidden 128, q 0.05, 200 steps, clip 1 (see docs: the seed's
  clip 30 bounds its un-normalised per-example gradients; dpfusion's step is on the *mean*
  clipped gradient, so a clip far above the gradient norms only adds noise), and the same with
  clip 30 to show it;
- `dp_mlp_sgd` with `noise => 'mf'`, hidden 128, batches of about 25 in one pass (the seed's MF run);
- `dp_logreg_sgd` one-vs-rest: ten binary fits (one query each), each at (eps/10, delta/10), so the
  ten compose to at most (1, 1e-6) by basic composition (the function is binary only);
- non-private baselines: scikit-learn's MLPClassifier (128 hidden, ReLU) and LogisticRegression.

    scripts/setup-venv.sh
    .venv/bin/python scripts/sgd_digits.py [--bin $CARGO_TARGET_DIR/debug/dpfusion] [--runs 3] [--first 0]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPS, DELTA = 1.0, 1e-6
D = 64
FEATURES = "[" + ", ".join(f"p{i}" for i in range(D)) + "]"


def default_bin():
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    return os.path.join(target, "debug", "dpfusion")


def write_csv(path, X, y):
    header = ",".join([f"p{i}" for i in range(D)] + ["y"] + [f"y{k}" for k in range(10)])
    with open(path, "w") as f:
        f.write(header + "\n")
        for xi, yi in zip(X, y):
            onehot = ",".join("1" if yi == k else "0" for k in range(10))
            f.write(",".join(f"{v:.6f}" for v in xi) + f",{int(yi)},{onehot}\n")


def query(binary, path, sql):
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [binary, "--ledger", os.path.join(tmp, "l.jsonl"), "--filter", "rdp", "--epsilon", "100",
             "--delta", "1e-4", "--private", f"train={path}", "--format", "json", "-q", "-c", sql],
            capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout)[0]


def mlp_predict(m, X):
    """Forward pass in the layout [W1 (h x d), b1 (h), W2 (k x h), b2 (k)] of udfs/src/optim/mlp.rs."""
    d, h, c = m["inputs"], m["hidden"], m["classes"]
    k = 1 if c == 2 else c
    w = np.asarray(m["weights"], dtype=float)
    w1 = w[:h * d].reshape(h, d)
    b1 = w[h * d:h * d + h]
    w2 = w[h * d + h:h * d + h + k * h].reshape(k, h)
    b2 = w[h * d + h + k * h:]
    z = np.maximum(X @ w1.T + b1, 0.0) @ w2.T + b2
    return (z[:, 0] > 0).astype(int) if k == 1 else z.argmax(axis=1)


def ovr_predict(rows, X):
    scores = np.stack([X @ np.asarray(r["m"]["coefficients"]) + r["m"]["intercept"] for r in rows],
                      axis=1)
    return scores.argmax(axis=1)


def private_models():
    e, dl = EPS, DELTA
    mlp = f"dp_mlp_sgd(y, {FEATURES}, epsilon => {e}, delta => {dl}, classes => 10"
    # One query per class (as measured in docs/UTILITY.md; one SELECT with the ten fits works too).
    ovr = [f"SELECT dp_logreg_sgd(y{k}, {FEATURES}, epsilon => {e / 10}, delta => {dl / 10}) AS m "
           "FROM train" for k in range(10)]
    return [
        ("dp_mlp_sgd, defaults (hidden 32, q 0.01, 1000 steps, clip 1, lr 0.5)",
         f"SELECT {mlp}) AS m FROM train", "mlp"),
        ("dp_mlp_sgd, seed's shape (hidden 128, q 0.05, 200 steps, clip 1)",
         f"SELECT {mlp}, hidden => 128, sample_rate => 0.05, steps => 200) AS m FROM train", "mlp"),
        ("dp_mlp_sgd, seed's shape with the seed's clip 30",
         f"SELECT {mlp}, hidden => 128, sample_rate => 0.05, steps => 200, clip => 30) AS m FROM train",
         "mlp"),
        ("dp_mlp_sgd, noise 'mf' (hidden 128, 50 batches of ~25, one pass, clip 1)",
         f"SELECT {mlp}, hidden => 128, steps => 50, noise => 'mf') AS m FROM train", "mlp"),
        ("dp_logreg_sgd one-vs-rest (10 fits at ε/10, δ/10; defaults)",
         ovr, "ovr"),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=default_bin())
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--first", type=int, default=0, help="split seed of the first run")
    a = ap.parse_args()
    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    models = private_models()
    names = [m[0] for m in models] + ["sklearn MLPClassifier (128 ReLU), non-private",
                                      "sklearn LogisticRegression, non-private"]
    acc = {n: [] for n in names}
    secs = {n: 0.0 for n in names}
    for run in range(a.first, a.first + a.runs):
        Xtr, Xte, ytr, yte = train_test_split(X, y, test_size=0.3, stratify=y, random_state=run)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "train.csv")
            write_csv(path, Xtr, ytr)
            for name, sql, kind in models:
                t = time.time()
                if kind == "mlp":
                    pred = mlp_predict(query(a.bin, path, sql)["m"], Xte)
                else:
                    pred = ovr_predict([query(a.bin, path, q) for q in sql], Xte)
                secs[name] += time.time() - t
                print(f"run {run}: {name}: {time.time() - t:.1f} s", file=sys.stderr, flush=True)
                acc[name].append(100 * float(np.mean(pred == yte)))
        for name, clf in [(names[-2], MLPClassifier(hidden_layer_sizes=(128,), max_iter=500,
                                                     random_state=run)),
                          (names[-1], LogisticRegression(max_iter=2000))]:
            t = time.time()
            clf.fit(Xtr, ytr)
            secs[name] += time.time() - t
            acc[name].append(100 * float(np.mean(clf.predict(Xte) == yte)))
    print(f"digits: {len(Xtr)} train / {len(Xte)} test images, 64 features in [0, 1], 10 classes; "
          f"ε = {EPS}, δ = {DELTA}; {a.runs} runs (split seeds {a.first} … {a.first + a.runs - 1})\n")
    print("| model | test accuracy (%), mean ± sd | min | seconds per run (all its queries) |")
    print("|---|---|---|---|")
    for n in names:
        v = np.asarray(acc[n])
        print(f"| {n} | {v.mean():.2f} ± {v.std(ddof=1) if len(v) > 1 else 0:.2f} | {v.min():.2f} | "
              f"{secs[n] / a.runs:.1f} |", flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""dp_mlp_sgd against dp_logreg_sgd on a nonlinear synthetic task (issue 30; docs/UTILITY.md,
"DP-SGD"), through SQL, at eps = 1, delta = 1e-6, defaults only.

The task: x uniform on [-sqrt(3), sqrt(3)]^2 (standardised), label 1 iff x1*x2 > 0, 5% of the
labels flipped. Its symmetries make the population logistic optimum theta = 0: a linear model
stays at probability 1/2 (chance log loss ln 2). Pure Python; the same generator as the seeded
10k-row test in udfs/tests/it/sgd.rs.

    python3 scripts/sgd_xor.py [--bin target/debug/dpfusion] [--rows 100000] [--runs 3]
"""
import argparse
import csv
import json
import math
import os
import random
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rows(n, seed):
    g = random.Random(seed)
    s = math.sqrt(3)
    out = []
    for _ in range(n):
        a, b = (2 * g.random() - 1) * s, (2 * g.random() - 1) * s
        y = 1 if a * b > 0 else 0
        if g.random() < 0.05:
            y = 1 - y
        out.append((a, b, y))
    return out


def query(binary, path, sql):
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(
            [binary, "--ledger", os.path.join(tmp, "l.jsonl"), "--filter", "rdp", "--epsilon", "100",
             "--delta", "1e-5", "--private", f"train={path}", "--format", "json", "-q", "-c", sql],
            capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout)[0]["m"]


def sigmoid(z):
    return 1 / (1 + math.exp(-z)) if z >= 0 else math.exp(z) / (1 + math.exp(z))


def mlp_p1(m, x):
    d, h = m["inputs"], m["hidden"]
    w = m["weights"]
    w1, b1, w2, b2 = w[:h * d], w[h * d:h * d + h], w[h * d + h:h * d + 2 * h], w[h * d + 2 * h]
    a = [max(0.0, b1[j] + sum(w1[j * d + i] * x[i] for i in range(d))) for j in range(h)]
    return sigmoid(b2 + sum(w2[j] * a[j] for j in range(h)))


def scores(p1, test):
    acc = loss = 0.0
    for a, b, y in test:
        p = min(max(p1((a, b)), 1e-12), 1 - 1e-12)
        acc += (p > 0.5) == (y == 1)
        loss -= math.log(p if y == 1 else 1 - p)
    return 100 * acc / len(test), loss / len(test)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "debug", "dpfusion"))
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    train, test = rows(a.rows, 1), rows(20_000, 2)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "train.csv")
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["x0", "x1", "y"])
            w.writerows(train)
        print(f"XOR-like task, {a.rows} training rows, 20000 test rows, ε = 1, δ = 1e-6, defaults\n")
        print("| model | test accuracy (%) | test log loss |")
        print("|---|---|---|")
        for fn in ["dp_mlp_sgd", "dp_logreg_sgd"]:
            res = []
            for _ in range(a.runs):
                m = query(a.bin, path, f"SELECT {fn}(y, [x0, x1], epsilon => 1, delta => 1e-6) AS m FROM train")
                if fn == "dp_mlp_sgd":
                    res.append(scores(lambda x: mlp_p1(m, x), test))
                else:
                    c, b = m["coefficients"], m["intercept"]
                    res.append(scores(lambda x: sigmoid(b + c[0] * x[0] + c[1] * x[1]), test))
            accs = [r[0] for r in res]
            losses = [r[1] for r in res]
            print(f"| `{fn}` | {sum(accs) / len(accs):.2f} (min {min(accs):.2f}) | "
                  f"{sum(losses) / len(losses):.3f} |", flush=True)


if __name__ == "__main__":
    main()

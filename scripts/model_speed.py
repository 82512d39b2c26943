#!/usr/bin/env python3
"""Vectorised numpy baselines for the speed of dpfusion's model kernels (issue 8).

The same arithmetic as the Rust kernels, on the same data (a raw little-endian f64 file written
by `cargo bench --bench models`: n·d features row-major, then n labels), timed here and printed as
one JSON object on stdout:

- linreg: `dp_linreg_gd`'s 'gaussian' kernel (udfs/src/optim/linreg.rs, GaussianGd): T iterations
  of residual r = θ·x̃ − y, per-example gradient r·x̃ clipped to L2 norm `clip`, summed, plus
  N(0, σ²) per coordinate, divided by a noisy count, step θ ← θ − η(S̃/ñ + λθ_w); the average of
  the last T/2 iterates is returned. Two variants:
  * "matvec": the clipped sum as X̃ᵀ(f) with f = r·min(1, clip/‖r·x̃‖) (one BLAS matvec; the
    fastest numpy form of the same sum);
  * "materialised": the n×p matrix of clipped per-example gradients formed, then summed.
  * "matvec_with_load": the matvec form timed together with reading the raw file (the
    counterpart of `dp_linreg_gd` from Parquet, which reads and decodes inside the query).
- agd: `dp_logreg_agd` (udfs/src/optim/agd.rs): per gradient pass z = X̃w, r = σ(z) − y, the
  clipped gradient sum (matvec form) plus Gaussian noise; per selection pass b = X̃u and the
  clipped logistic loss min(ℓ(z − α_k·b), C_obj) summed for the 21 candidate steps α_k, then a
  Gumbel-max selection. The number of gradient and selection passes is given (the Rust fit's own
  counts, which depend on the noise), so both sides do the same work.

AGD is timed best of (reps − 1), at least 1 (it is the slow one). Noise is numpy's float Gaussian (the Rust kernels draw exact discrete Gaussians on a grid and sum
in integers: that is the cost of exactness and is part of what is measured).

Usage: model_speed.py DATA_FILE --n N --d D [--iterations T] [--clip C] [--sigma S]
       [--agd-gradients G] [--agd-selections S] [--reps R]
"""
import argparse
import json
import os
import sys
import time

import numpy as np


def load(path, n, d):
    a = np.fromfile(path, dtype="<f8")
    if a.size != n * d + n:
        sys.exit(f"{path}: expected {n * d + n} doubles, got {a.size}")
    X = a[: n * d].reshape(n, d)
    y = a[n * d:]
    # x̃ = (x, 1): the intercept column, as both kernels use (fit_intercept = true).
    Xt = np.empty((n, d + 1))
    Xt[:, :d] = X
    Xt[:, d] = 1.0
    return Xt, y.copy()


def linreg(Xt, y, T, clip, lr, sigma, sigma_count, rng, materialise):
    n, p = Xt.shape
    nx = np.sqrt(np.einsum("ij,ij->i", Xt, Xt))  # ‖x̃ᵢ‖ once, as the kernel does
    denom = max(1.0, n + rng.normal(0.0, sigma_count))
    theta = np.zeros(p)
    avg = np.zeros(p)
    k = 0
    for t in range(1, T + 1):
        r = Xt @ theta - y
        norm = np.abs(r) * nx
        f = np.where(norm <= clip, r, np.sign(r) * (clip / nx))
        if materialise:
            G = Xt * f[:, None]  # n×p per-example clipped gradients
            s = G.sum(axis=0)
        else:
            s = Xt.T @ f
        noisy = s + rng.normal(0.0, sigma, p)
        theta -= lr * (noisy / denom)  # l2 = 0
        if t >= T // 2 + 1:
            k += 1
            avg += (theta - avg) / k
    return avg


def softplus(t):
    return np.logaddexp(0.0, t)


def agd(Xt, y, gradients, selections, clip_grad, clip_obj, rng):
    n, p = Xt.shape
    pos = y > 0.5
    sign = np.where(pos, -1.0, 1.0)  # ℓ = softplus(−z) for y = 1, softplus(z) for y = 0
    nx = np.sqrt(np.einsum("ij,ij->i", Xt, Xt))
    w = np.zeros(p)
    alpha = np.arange(21) * (2.0 / 20)
    sel_left = selections
    q_o = 2.0 ** (np.floor(np.log2(clip_obj)) - 32)
    for g in range(gradients):
        z = Xt @ w
        r = 1.0 / (1.0 + np.exp(-z)) - y
        norm = np.abs(r) * nx
        f = np.where(norm > clip_grad, r * (clip_grad / np.maximum(norm, 1e-300)), r)
        s = Xt.T @ f + rng.normal(0.0, 10.0, p)
        # The Rust fit runs `selections` passes over `gradients` iterations (rejections add
        # passes on the same gradient): spread them the same way, the extra ones first.
        passes = sel_left - (gradients - g - 1) if g == 0 else 1
        passes = max(1, min(passes, sel_left))
        for _ in range(passes):
            u = s / np.linalg.norm(s)
            b = Xt @ u
            t = z[:, None] - b[:, None] * alpha[None, :]  # n×21
            loss = np.minimum(softplus(t * sign[:, None]), clip_obj)
            F = np.floor(loss / q_o).sum(axis=0)
            k = int(np.argmin(F / (clip_obj / q_o) - rng.gumbel(size=F.size)))
            sel_left -= 1
        w -= alpha[max(k, 1)] * u
    return w


def timed(fn, reps):
    best = float("inf")
    out = None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--d", type=int, required=True)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--sigma-count", type=float, default=1.0)
    ap.add_argument("--agd-data")
    ap.add_argument("--agd-gradients", type=int, default=0)
    ap.add_argument("--agd-selections", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(1)
    out = {
        "numpy": np.__version__,
        "threads": {k: os.environ.get(k) for k in ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"]},
    }
    Xt, y = load(a.data, a.n, a.d)
    for name, mat in [("linreg_matvec_s", False), ("linreg_materialised_s", True)]:
        out[name], _ = timed(
            lambda: linreg(Xt, y, a.iterations, a.clip, a.lr, a.sigma, a.sigma_count, rng, mat), a.reps)
    # From the file: reading the raw rows and the fit (the counterpart of dpfusion's query from
    # Parquet, which reads and decodes the file inside the timed query).
    out["linreg_matvec_with_load_s"], _ = timed(
        lambda: linreg(*load(a.data, a.n, a.d), a.iterations, a.clip, a.lr, a.sigma, a.sigma_count,
                       rng, False), a.reps)
    if a.agd_data and a.agd_gradients > 0:
        Xt, y = load(a.agd_data, a.n, a.d)
        sels = max(a.agd_selections, a.agd_gradients)
        out["agd_s"], _ = timed(lambda: agd(Xt, y, a.agd_gradients, sels, 3.0, 3.0, rng), max(1, a.reps - 1))
        out["agd_gradients"] = a.agd_gradients
        out["agd_selections"] = sels
    print(json.dumps(out))


if __name__ == "__main__":
    main()

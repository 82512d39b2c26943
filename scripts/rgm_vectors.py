#!/usr/bin/env python3
"""Test vectors for rgm_mean_by's accountant (issue 5), from the reference accountant.

Writes JSON to stdout; the committed output is udfs/tests/data/rgm_vectors.json, read by
udfs/tests/it/rgm.rs, which checks that the Rust port of the reference (Mironov conversion on the
reference's order list, geometric bisection) reproduces every number to 1e-6 relative.

    python3 scripts/rgm_vectors.py > udfs/tests/data/rgm_vectors.json

`scripts/rgm_accountant.py` is a verbatim copy of the project's reference RGM accountant (kept
here so that a clean clone can regenerate the vectors). Pure standard library; takes a few
seconds.
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rgm_accountant as ra  # noqa: E402

# (K = max_ratio, n = group size, epsilon, delta). Infeasible ones included on purpose.
CASES = [
    (1.2, 100, 1.0, 1e-6),
    (1.2, 100, 0.5, 1e-6),
    (1.2, 20, 1.0, 1e-6),
    (1.2, 20, 0.5, 1e-6),   # infeasible (docs/research/rgm.md 7(a) table)
    (1.5, 50, 1.0, 1e-6),
    (2.0, 10, 1.0, 1e-6),   # infeasible
    (1.5, 500, 1.0, 1e-6),  # the demo salaries table with min_group_size 500
    (1.1, 1000, 0.3, 1e-8),
    (3.0, 5000, 2.0, 1e-5),
]
ORDERS = [1.5, 2.0, 5.0, 10.0, 50.0, 200.0]


def num(x):
    return x if math.isfinite(x) else None


def main():
    out = []
    for K, n, eps, delta in CASES:
        gamma = (K * K - 1) / (K * (n - 1) + 1)
        sigma = ra.calibrate_sigma(eps, delta, gamma, 1)
        floor, floor_alpha = ra.rdp_to_dp(lambda a: ra.rgm_rdp(a, 1e9, gamma, 1), delta, ra.ALPHAS)
        case = {
            "max_ratio": K,
            "n": n,
            "epsilon": eps,
            "delta": delta,
            "gamma": gamma,
            "sigma": num(sigma),
            "feasible": math.isfinite(sigma),
            "eps_floor_sigma_1e9": floor,
            "eps_floor_alpha": floor_alpha,
        }
        if math.isfinite(sigma):
            e, a = ra.rdp_to_dp(lambda a: ra.rgm_rdp(a, sigma, gamma, 1), delta, ra.ALPHAS)
            case["eps_at_sigma"] = e
            case["alpha_at_sigma"] = a
            case["relative_noise_std"] = sigma * gamma
            case["rdp_at_sigma"] = [[a, num(ra.rgm_rdp(a, sigma, gamma, 1))] for a in ORDERS]
        out.append(case)
    json.dump({"source": "scripts/rgm_vectors.py (reference: scripts/rgm_accountant.py)",
               "cases": out}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

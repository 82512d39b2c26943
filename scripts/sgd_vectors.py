#!/usr/bin/env python3
"""Reference vectors for DP-SGD accounting (issue 30), from Google's dp_accounting.

Writes JSON to stdout; the committed output is udfs/tests/data/sgd_vectors.json, read by
udfs/tests/it/sgd_accounting.rs, which checks that dpfusion's PLD accountant
(udfs/src/privacy/pld.rs, sgd.rs) is never below dp_accounting's PLD ε and at most 3% above it,
that its calibration inverts it, and that its RDP curve of one Poisson-subsampled Gaussian step
matches dp_accounting's at integer orders and is above it between them.

    scripts/setup-venv.sh        # once: ./.venv with dp-accounting
    .venv/bin/python scripts/sgd_vectors.py > udfs/tests/data/sgd_vectors.json

Takes about a minute (dp_accounting's PLD accountant at value discretisation 1e-4, its default).
"""
import importlib.metadata
import json
import math
import sys

import dp_accounting
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant as rdp

H = 1e-4  # value_discretization_interval, dp_accounting's default

# (sample_rate q, noise_multiplier z, steps, delta): ε from about 0.05 to 30, including
# q <= 0.001 with 10^4 steps and more, and the unsampled Gaussian (q = 1).
PLD_CASES = [
    (0.001, 0.8, 10000, 1e-5),
    (0.001, 1.0, 10000, 1e-6),
    (0.001, 0.6, 10000, 1e-5),
    (0.0005, 0.7, 20000, 1e-5),
    (0.001, 4.0, 1000, 1e-5),
    (0.004, 1.1, 2500, 1e-5),
    (0.01, 1.0, 1000, 1e-5),
    (0.01, 0.6, 10000, 1e-6),
    (0.01, 2.0, 10000, 1e-5),
    (0.01, 1.5, 100, 1e-7),
    (0.02, 5.0, 200, 1e-6),
    (0.1, 2.0, 100, 1e-6),
    (0.1, 1.0, 1000, 1e-5),
    (0.05, 4.0, 500, 1e-8),
    (0.256, 1.1, 240, 1e-5),
    (1.0, 2.0, 50, 1e-8),
    (1.0, 10.0, 1, 1e-6),
]

# (q, steps, target ε, δ): dp_accounting's calibrated noise multiplier (PLD accountant).
CALIBRATION_CASES = [
    (0.01, 1000, 1.0, 1e-5),
    (0.001, 10000, 1.0, 1e-6),
    (0.1, 100, 4.0, 1e-6),
]

RDP_CASES = [(0.01, 1.0), (0.001, 0.8), (0.1, 2.0), (0.5, 1.5)]
RDP_ORDERS = [1.5, 2.0, 2.5, 3.0, 4.0, 4.5, 8.0, 10.5, 16.0, 32.0, 64.0, 128.0, 256.0]


def event(q, z, steps):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)


def pld_epsilon(q, z, steps, delta):
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=H)
    acc.compose(event(q, z, steps))
    return acc.get_epsilon(delta)


def main():
    out = {
        "source": "dp_accounting " + importlib.metadata.version("dp-accounting")
        + f", PLDAccountant(value_discretization_interval={H}), add-or-remove-one",
        "pld": [],
        "calibration": [],
        "rdp": [],
    }
    for q, z, steps, delta in PLD_CASES:
        e = pld_epsilon(q, z, steps, delta)
        out["pld"].append({"sample_rate": q, "noise_multiplier": z, "steps": steps,
                           "delta": delta, "eps_pld_dp_accounting": e})
        print(q, z, steps, delta, e, file=sys.stderr)
    for q, steps, eps, delta in CALIBRATION_CASES:
        z = dp_accounting.calibrate_dp_mechanism(
            lambda: pld_privacy_accountant.PLDAccountant(value_discretization_interval=H),
            lambda z: event(q, z, steps), eps, delta,
            bracket_interval=dp_accounting.ExplicitBracketInterval(0.1, 50.0), tol=1e-6)
        out["calibration"].append({"sample_rate": q, "steps": steps, "epsilon": eps,
                                   "delta": delta, "noise_multiplier_dp_accounting": z})
        print("calibrated", q, steps, eps, delta, z, file=sys.stderr)
    for q, z in RDP_CASES:
        vals = rdp._compute_rdp_poisson_subsampled_gaussian(q, z, RDP_ORDERS)
        out["rdp"].append({"sample_rate": q, "noise_multiplier": z, "orders": RDP_ORDERS,
                           # None where dp_accounting's series did not converge (it then
                           # excludes that order itself).
                           "rdp_dp_accounting": [float(v) if math.isfinite(v) else None
                                                 for v in vals]})
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

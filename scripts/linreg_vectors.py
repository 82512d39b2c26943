#!/usr/bin/env python3
"""Test vectors for dp_linreg_gd's calibration (issue 6), computed independently of the Rust code.

Writes JSON to stdout; the committed output is udfs/tests/data/linreg_vectors.json, read by
udfs/tests/it/linreg.rs.

    scripts/setup-venv.sh            # or: python3 -m venv .venv && .venv/bin/pip install dp-accounting
    .venv/bin/python scripts/linreg_vectors.py > udfs/tests/data/linreg_vectors.json

'gaussian' mechanism (Google dp-accounting 0.6):
  * mu = 1 / dp_accounting.get_sigma_gaussian(eps, delta): the Gaussian-DP parameter of the whole
    fit (one Gaussian release of sensitivity 1 with that sigma is exactly (eps, delta)-DP, and T
    Gaussian releases compose to mu-GDP with mu^2 = sum of the mu_i^2, Dong-Roth-Su 2019);
  * the split of the Rust code (udfs/src/optim/linreg.rs): mu_count^2 = mu^2/20 and
    T mu_grad^2 = 19 mu^2/20 (all of mu^2 to the gradient under replace_public_n), so
    sigma_grad / clip = (1 or 2) / mu_grad and sigma_count = 1 / mu_count;
  * check of the composition: dp-accounting's PLD accountant (connect-the-dots, value
    discretization 1e-4) on [T x Gaussian(sigma_grad/Delta), Gaussian(sigma_count)] gives
    pld_epsilon at delta, which must be <= eps and close to it.

'rgm' mechanism: dp-accounting has no relative Gaussian mechanism, so the RDP curve of
docs/research/rgm.md eq. (5*) is implemented again here, composed T times, and converted to (eps, delta) with
the conversion of Canonne, Kamath and Steinke 2020 (Prop. 12), minimised over alpha with a fine
grid plus golden-section refinement (the Rust accountant minimises over its fixed 901-order grid,
so its epsilon is >= this one by at most ~1e-4 relative). sigma is found by bisection.
"""
import json
import math
import sys

import dp_accounting
from dp_accounting import pld

COUNT_SHARE = 1.0 / 20.0


def gaussian_case(eps, delta, T, neighbours):
    sigma1 = dp_accounting.get_sigma_gaussian(eps, delta)
    mu = 1.0 / sigma1
    public_n = neighbours == "replace_public_n"
    if public_n:
        mu_g, mu_c = mu / math.sqrt(T), None
    else:
        mu_g = mu * math.sqrt((1.0 - COUNT_SHARE) / T)
        mu_c = mu * math.sqrt(COUNT_SHARE)
    factor = 1.0 if neighbours == "add_remove" else 2.0
    acc = pld.PLDAccountant(value_discretization_interval=1e-4)
    events = [dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(1.0 / mu_g), T)]
    if mu_c is not None:
        events.append(dp_accounting.GaussianDpEvent(1.0 / mu_c))
    acc.compose(dp_accounting.ComposedDpEvent(events))
    return {
        "epsilon": eps,
        "delta": delta,
        "iterations": T,
        "neighbours": neighbours,
        "mu": mu,
        "mu_grad": mu_g,
        "mu_count": mu_c,
        "sigma_grad_over_clip": factor / mu_g,
        "sigma_count": None if mu_c is None else 1.0 / mu_c,
        "pld_epsilon": acc.get_epsilon(delta),
    }


def rgm_rdp(alpha, sigma, gamma, d):
    """docs/research/rgm.md eq. (5*): tight RDP of one RGM call; +inf beyond the order cap."""
    u = gamma * (2.0 + gamma)
    am1 = alpha - 1.0
    if am1 * u >= 1.0:
        return math.inf

    def h(rho):
        return -0.5 * math.log(rho) - math.log(alpha - am1 * rho) / (2.0 * am1)

    r = (1.0 + gamma) ** 2
    loss = max(h(r), h(1.0 / r), 0.0)
    first = 0.0 if math.isinf(sigma) else alpha / (2.0 * sigma * sigma * (1.0 - am1 * u))
    return first + d * loss


def cks(rdp, alpha, delta):
    am1 = alpha - 1.0
    return rdp + (math.log(1.0 / delta) + am1 * math.log1p(-1.0 / alpha) - math.log(alpha)) / am1


def rgm_epsilon(sigma, gamma, d, T, delta):
    def f(la):  # la = log10(alpha - 1)
        a = 1.0 + 10.0 ** la
        e = T * rgm_rdp(a, sigma, gamma, d)
        return cks(e, a, delta) if math.isfinite(e) else math.inf

    grid = [-4.0 + 0.002 * k for k in range(0, 5501)]  # alpha - 1 in [1e-4, 1e7]
    vals = [f(x) for x in grid]
    k = min(range(len(grid)), key=lambda i: vals[i])
    lo, hi = grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)]
    g = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, dd = b - g * (b - a), a + g * (b - a)
    for _ in range(100):
        if f(c) < f(dd):
            b = dd
        else:
            a = c
        c, dd = b - g * (b - a), a + g * (b - a)
    return max(min(vals[k], f((a + b) / 2.0)), 0.0)


def rgm_sigma(eps, delta, gamma, d, T):
    floor = rgm_epsilon(math.inf, gamma, d, T, delta)
    if floor >= eps:
        return None, floor
    lo, hi = 1e-6, 1.0
    while rgm_epsilon(hi, gamma, d, T, delta) > eps:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        if hi / lo <= 1.0 + 1e-12:
            break
        mid = math.sqrt(lo * hi)
        if rgm_epsilon(mid, gamma, d, T, delta) <= eps:
            hi = mid
        else:
            lo = mid
    return hi, floor


def main():
    gaussian = []
    for eps, delta, T in [(1.0, 1e-6, 50), (0.5, 1e-7, 100), (3.0, 1e-6, 20), (0.1, 1e-5, 50),
                          (1.0, 1e-7, 1)]:
        for nb in ["add_remove", "replace", "replace_public_n"]:
            gaussian.append(gaussian_case(eps, delta, T, nb))
    rgm = []
    # (eps, delta, gamma, d, T): gamma = 2 C^2 / (n lambda) for a few (C, n, lambda)
    for eps, delta, gamma, d, T in [
        (1.0, 1e-6, 2 * 2.0 / (100_000 * 0.1), 11, 50),
        (3.0, 1e-7, 2 * 5.0 / (20_000 * 0.1), 6, 50),
        (0.5, 1e-6, 2 * 2.0 / (1_000_000 * 0.05), 11, 20),
        (1.0, 1e-6, 2 * 5.0 / (10_000 * 0.05), 6, 50),  # infeasible: floor > eps
    ]:
        sigma, floor = rgm_sigma(eps, delta, gamma, d, T)
        rgm.append({
            "epsilon": eps,
            "delta": delta,
            "gamma": gamma,
            "dims": d,
            "iterations": T,
            "sigma": sigma,
            "floor": floor,
            "epsilon_at_sigma": None if sigma is None else rgm_epsilon(sigma, gamma, d, T, delta),
        })
    json.dump({
        "generator": "scripts/linreg_vectors.py",
        "dp_accounting_version": getattr(dp_accounting, "__version__", "0.6.0"),
        "count_share": COUNT_SHARE,
        "gaussian": gaussian,
        "rgm": rgm,
    }, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Fits the polynomial Q of GELU's erfc in src/device/cpu/act_lanes.h (vphi_cdf).

erfc(z) = t e^(-z^2) Q(t) with t = 1 / (1 + z / 2), so Q(t) = erfcx(z) / t over t in (0, 1].
The fit is a least-squares fit of a degree-10 Chebyshev series for relative error, reweighted
towards the largest errors (Lawson's iteration, close to minimax), then written as monomials in
t. It prints the coefficients (lowest degree first), the relative error in exact arithmetic and
the relative error of the float evaluation in the kernel's Estrin order.

Needs numpy and mpmath (the PyTorch venv's pip: /tmp/pt2/bin/pip install mpmath).
Usage: tools/fit-erfc.py [--degree 10] [--points 40001]
"""
import argparse

import mpmath as mp
import numpy as np
from numpy.polynomial import chebyshev as cheb
from numpy.polynomial import polynomial as poly


def target(t):
    """erfcx(z) / t at z = 2 / t - 2, in 30 digits."""
    mp.mp.dps = 30
    out = np.empty_like(t)
    for i, ti in enumerate(t):
        z = 2 / mp.mpf(ti) - 2
        out[i] = float(mp.erfc(z) * mp.exp(z * z) / mp.mpf(ti))
    return out


def fit(t, r, degree, rounds=60):
    """Chebyshev coefficients on u = 2t - 1 with the smallest largest relative error."""
    v = cheb.chebvander(2 * t - 1, degree)
    w = np.ones_like(t)
    coef = None
    for _ in range(rounds):
        coef, *_ = np.linalg.lstsq(v * (w / r)[:, None], w, rcond=None)
        err = v @ coef / r - 1
        w = w * np.sqrt(np.abs(err)) + 1e-30
        w /= w.max()
    return coef


def monomials(coef):
    """The series in u = 2t - 1 as coefficients of 1, t, t^2, ..."""
    p = cheb.cheb2poly(coef)
    out = np.zeros(len(p))
    power = np.array([1.0])
    for c in p:
        out[: len(power)] += c * power
        power = poly.polymul(power, [-1.0, 2.0])
    return out


def estrin_f32(m, t):
    """The kernel's evaluation order, in float: pairs, then t^2, t^4 and t^8."""
    f = np.float32
    t = t.astype(f)
    m = [f(c) for c in m] + [f(0)] * (12 - len(m))
    t2 = t * t
    t4 = t2 * t2
    t8 = t4 * t4
    a = [m[2 * i] + m[2 * i + 1] * t for i in range(6)]
    return ((a[0] + a[1] * t2) + (a[2] + a[3] * t2) * t4) + (a[4] + a[5] * t2) * t8


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--degree", type=int, default=10, help="degree of Q (at most 11)")
    ap.add_argument("--points", type=int, default=40001, help="fit points over (0, 1]")
    args = ap.parse_args()
    if not 1 <= args.degree <= 11:
        ap.error("--degree: 1..11 (the kernel's Estrin order takes at most 12 terms)")
    t = np.linspace(1e-6, 1.0, args.points)
    r = target(t)
    m = monomials(fit(t, r, args.degree))
    exact = np.abs(np.polyval(m[::-1], t) / r - 1).max()
    in_float = np.abs(estrin_f32(m, t).astype(np.float64) / r - 1).max()
    print("Q(t), lowest degree first:")
    print(", ".join("%.9gf" % c for c in m))
    print("largest relative error: %.3g exact, %.3g in float (Estrin)" % (exact, in_float))


if __name__ == "__main__":
    main()

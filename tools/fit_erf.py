"""Fit the coefficients of hmct-quant's vectorizable f32 erf (ops/fastmath.rs).

Two pieces, both computed for every lane and selected, so loops vectorize:
  |x| <  SPLIT: erf(x) = x * P(x^2)                     (P of degree SMALL_DEG)
  |x| >= SPLIT: erf(|x|) = 1 - exp(Q(min(|x|, CLAMP)))  (Q of degree LARGE_DEG)
Q approximates ln(erfc(t)); beyond CLAMP erf rounds to 1 in f32.

Near-minimax relative error by Lawson's iteration on weighted least squares, in
float64 against mpmath. Prints the coefficients as Rust literals (f32, highest
degree first, for Horner) and the worst error of the f32 evaluation, with every
multiply-add rounded once as `mul_add` does. Needs numpy and mpmath (mpmath comes
with torch in target/zoo-venv):  target/zoo-venv/bin/python tools/fit_erf.py
"""

import mpmath
import numpy as np

SPLIT = 0.921875
CLAMP = 4.0
SMALL_DEG = 5
LARGE_DEG = 8
mpmath.mp.dps = 40


def lawson(basis, target, scale, iterations=60):
    """Coefficients c minimising max |basis @ c - target| / scale."""
    a = basis / scale[:, None]
    b = target / scale
    w = np.ones(len(b)) / len(b)
    for _ in range(iterations):
        sw = np.sqrt(w)
        c, *_ = np.linalg.lstsq(a * sw[:, None], b * sw, rcond=None)
        err = np.abs(a @ c - b)
        w = w * err
        w /= w.sum()
    return c


def cheb_nodes(lo, hi, n):
    k = np.arange(n)
    return (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / n)


def fit_small():
    x = cheb_nodes(1e-4, SPLIT, 4000)
    target = np.array([float(mpmath.erf(v) / v) for v in x])
    basis = np.stack([x ** (2 * i) for i in range(SMALL_DEG + 1)], axis=1)
    return lawson(basis, target, np.abs(target))


def fit_large():
    t = cheb_nodes(SPLIT, CLAMP, 4000)
    target = np.array([float(mpmath.log(mpmath.erfc(v))) for v in t])
    # The error of Q is the relative error of erfc; erf's error is that times
    # erfc/erf, so weight by erf/erfc (large errors allowed where erfc is tiny).
    weight = np.array([float(mpmath.erf(v) / mpmath.erfc(v)) for v in t])
    basis = np.stack([t**i for i in range(LARGE_DEG + 1)], axis=1)
    return lawson(basis, target, weight)


def f32(v):
    return np.float32(v)


def fma(a, b, c):
    # Exact product in float64, one rounding of the sum (double rounding is rare
    # enough for an error estimate; the Rust test is the judge).
    return f32(np.float64(a) * np.float64(b) + np.float64(c))


def horner(coeffs, x):
    p = coeffs[-1]
    for c in coeffs[-2::-1]:
        p = fma(p, x, c)
    return p


def exp_ref(v):
    return f32(np.exp(np.float64(v)))


def erf32(x, small, large):
    ax = f32(abs(x))
    if ax < SPLIT:
        return fma(horner(small, f32(ax * ax)), ax, 0.0)
    t = f32(min(ax, CLAMP))
    return f32(1.0 - exp_ref(horner(large, t)))


def main():
    small = [f32(c) for c in fit_small()]
    large = [f32(c) for c in fit_large()]
    worst = (0.0, 0.0)
    for x in np.linspace(1e-3, 5.0, 200_001):
        x = f32(x)
        got = erf32(x, small, large)
        want = f32(float(mpmath.erf(float(x))))
        ulp = abs(int(np.float32(got).view(np.int32)) - int(want.view(np.int32)))
        worst = max(worst, (ulp, float(x)))
    print("small (x^0 first):", ", ".join(str(c) for c in small))
    print("large (t^0 first):", ", ".join(str(c) for c in large))
    print(f"worst {worst[0]} ulp at x = {worst[1]} (exp taken exact here)")


if __name__ == "__main__":
    main()

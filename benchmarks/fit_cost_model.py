#!/usr/bin/env python3
"""Fit the greedy strategy's cost model (engine/include/treeattn/cost_model.hpp) to measured times.

Input: `treeattn bench --json` files with timed rows (any strategies and cost models: each row carries the
plan's pass, tile and partial counts under the model it was planned with). The model is

    run_us = (pass_ns * passes + tile_ns_large * large_tiles + tile_ns_small * small_tiles
              + partial_ns * partial_rows) / slots / 1000 + launch_us

fitted by least squares on relative error (every row weighs the same whatever its size), with coefficients
kept non-negative. Prints the coefficients as `--cost` takes them and the fit's error.

Example: benchmarks/fit_cost_model.py benchmarks/h100/greedy_fit_*.json --slots 396
"""
import argparse
import json
import math

FEATURES = ["pass_ns", "tile_ns_large", "tile_ns_small", "partial_ns", "launch_us"]


def features(row):
    return [row["large_passes"] + row["small_passes"], row["large_tiles"], row["small_tiles"], row["partial_rows"], 1.0]


def solve(a, b):
    """Least squares through the normal equations (a few unknowns, well scaled)."""
    n = len(a[0])
    m = [[sum(r[i] * r[j] for r in a) for j in range(n)] for i in range(n)]
    v = [sum(r[i] * y for r, y in zip(a, b)) for i in range(n)]
    for i in range(n):
        pivot = max(range(i, n), key=lambda r: abs(m[r][i]))
        m[i], m[pivot], v[i], v[pivot] = m[pivot], m[i], v[pivot], v[i]
        for r in range(n):
            if r != i:
                f = m[r][i] / m[i][i]
                m[r] = [x - f * y for x, y in zip(m[r], m[i])]
                v[r] -= f * v[i]
    return [v[i] / m[i][i] for i in range(n)]


def fit(rows):
    active = list(range(len(FEATURES)))
    while True:  # drop the most negative coefficient until all are >= 0
        a = [[features(r)[j] / r["run_median_us"] for j in active] for r in rows]
        c = solve(a, [1.0] * len(rows))
        if min(c) >= 0:
            break
        del active[c.index(min(c))]
    coef = [0.0] * len(FEATURES)
    for value, j in zip(c, active):
        coef[j] = value
    return coef


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="+", help="treeattn bench --json files with timed rows")
    parser.add_argument("--slots", type=float, default=396.0, help="CTAs in flight (H100: 132 SMs x 3)")
    args = parser.parse_args()
    rows = [r for path in args.json for r in json.load(open(path)) if "run_median_us" in r and "large_passes" in r]
    if len(rows) < len(FEATURES):
        raise SystemExit(f"{len(rows)} timed rows with plan counts: too few to fit {len(FEATURES)} coefficients")
    coef = fit(rows)
    errors = sorted(abs(math.log(sum(x * c for x, c in zip(features(r), coef)) / r["run_median_us"])) for r in rows)
    scaled = [c * args.slots * 1000.0 for c in coef[:4]]
    print(",".join(f"{name}={value:.0f}" for name, value in zip(FEATURES[:4], scaled)) + f",slots={args.slots:g}")
    print(f"launch_us {coef[4]:.1f}; {len(rows)} rows; |log error| median {errors[len(errors) // 2]:.3f}, "
          f"90th percentile {errors[int(len(errors) * 0.9)]:.3f}, max {errors[-1]:.3f}")


if __name__ == "__main__":
    main()

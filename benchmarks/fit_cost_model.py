#!/usr/bin/env python3
"""Fit the greedy strategy's cost model (engine/include/treeattn/cost_model.hpp) to measured times.

Input: `treeattn bench --json` files with timed rows (any strategies and cost models: each row carries the
plan's pass, tile and partial counts under the model it was planned with, and its longest pass). The model is

    run_us = max(throughput, critical path) + launch_us
    throughput    = (pass_ns * passes + tile_ns_large * large_tiles + tile_ns_small * small_tiles
                     + partial_ns * partial_rows) / slots / 1000 + fanin_ns * max_fanin / 1000
    critical path = (pass_ns + tile_ns * longest_pass_tiles) / solo_speedup / 1000

fitted by least squares on relative error (every row weighs the same whatever its size), with coefficients
kept non-negative: for each solo_speedup of a grid, the rows are split by which term the model says
binds, the linear fit is redone on that split until it stops changing, and the solo_speedup with the
smallest median error wins (rows without the longest pass only take the throughput term; fanin_ns is held
at 0 when no row has the plan's max_fanin). Prints the
coefficients as `--cost` takes them and the fit's error.

Example: benchmarks/fit_cost_model.py benchmarks/h100/greedy_fit_flatten_greedy.json --slots 396
         benchmarks/fit_cost_model.py vulkan_rows.json --slots 264 --fix partial_ns=169
"""
import argparse
import json
import math

FEATURES = ["pass_ns", "tile_ns_large", "tile_ns_small", "partial_ns", "fanin_ns", "launch_us"]
SLOT_SCALED = 5  # the first five are ns per CTA slot as --cost takes them; launch_us is not


def throughput_features(row, slots):
    # max_fanin's term is a latency, not spread over the slots: its feature carries them.
    return [row["large_passes"] + row["small_passes"], row["large_tiles"], row["small_tiles"], row["partial_rows"],
            row.get("max_fanin", 0) * slots, 1.0]


def critical_features(row, slots, solo):
    """The longest pass alone, in the units of throughput_features' coefficients (ns per slot / slots / 1000)."""
    tiles = row["longest_pass_tiles"]
    large = row["longest_pass_large"]
    k = slots / solo
    return [k, k * tiles if large else 0.0, 0.0 if large else k * tiles, 0.0, 0.0, 1.0]


def predict(features, coef):
    return sum(x * c for x, c in zip(features, coef))


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


def fit_linear(rows, feats, fixed):
    """Non-negative least squares on relative error; `fixed` maps a coefficient's index to its value,
    which is taken off each row's time instead of fitted."""
    active = [j for j in range(len(FEATURES)) if j not in fixed]
    target = [1.0 - sum(f[j] * c for j, c in fixed.items()) / r["run_median_us"] for r, f in zip(rows, feats)]
    while True:  # drop the most negative coefficient until all are >= 0
        a = [[f[j] / r["run_median_us"] for j in active] for r, f in zip(rows, feats)]
        c = solve(a, target)
        if min(c) >= 0:
            break
        del active[c.index(min(c))]
    coef = [0.0] * len(FEATURES)
    for j, value in fixed.items():
        coef[j] = value
    for value, j in zip(c, active):
        coef[j] = value
    return coef


def fit(rows, slots, solo, fixed):
    """Coefficients for one solo_speedup: alternate between the binding terms and the linear fit."""
    binding = [False] * len(rows)  # True: the critical path binds
    for _ in range(20):
        feats = [critical_features(r, slots, solo) if b else throughput_features(r, slots) for r, b in zip(rows, binding)]
        coef = fit_linear(rows, feats, fixed)
        new = [
            "longest_pass_tiles" in r and predict(critical_features(r, slots, solo), coef) > predict(throughput_features(r, slots), coef)
            for r in rows
        ]
        if new == binding:
            break
        binding = new
    return coef


def errors(rows, coef, slots, solo):
    out = []
    for r in rows:
        t = predict(throughput_features(r, slots), coef)
        if "longest_pass_tiles" in r:
            t = max(t, predict(critical_features(r, slots, solo), coef))
        out.append(abs(math.log(t / r["run_median_us"])))
    return sorted(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", nargs="+", help="treeattn bench --json files with timed rows")
    parser.add_argument("--slots", type=float, default=396.0, help="CTAs in flight (H100: 132 SMs x 3)")
    parser.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                        help="hold a coefficient (pass_ns, tile_ns_large, tile_ns_small, partial_ns, fanin_ns, as --cost takes "
                             "them; or launch_us) at a value and fit the others; may be given several times")
    args = parser.parse_args()
    fixed = {}
    for item in args.fix:
        name, _, value = item.partition("=")
        if name not in FEATURES or not value:
            raise SystemExit(f"--fix {item!r}: expected NAME=VALUE with NAME one of {', '.join(FEATURES)}")
        try:
            number = float(value)
        except ValueError:
            raise SystemExit(f"--fix {item!r}: {value!r} is not a number")
        # --cost's units are ns per CTA; the fit's are us of the layer (divided by slots).
        fixed[FEATURES.index(name)] = number if name == "launch_us" else number / (args.slots * 1000.0)
    # `sequence` rows stay out: long single-query runs are a regime greedy never plans (README).
    rows = [r for path in args.json for r in json.load(open(path))
            if "run_median_us" in r and "large_passes" in r and r["strategy"] != "sequence"]
    if not any(r.get("max_fanin", 0) for r in rows):
        fixed.setdefault(FEATURES.index("fanin_ns"), 0.0)  # nothing to fit it to
    if len(rows) < len(FEATURES) - len(fixed):
        raise SystemExit(f"{len(rows)} timed rows with plan counts: too few to fit {len(FEATURES) - len(fixed)} coefficients")
    with_longest = any("longest_pass_tiles" in r for r in rows)
    best = None
    for solo in [1.0 + 0.125 * i for i in range(17)] if with_longest else [1.0]:  # 1 .. 3
        coef = fit(rows, args.slots, solo, fixed)
        err = errors(rows, coef, args.slots, solo)
        if best is None or err[len(err) // 2] < best[2][len(best[2]) // 2]:
            best = (solo, coef, err)
    solo, coef, err = best
    scaled = [c * args.slots * 1000.0 for c in coef[:SLOT_SCALED]]
    print(",".join(f"{name}={value:.0f}" for name, value in zip(FEATURES[:SLOT_SCALED], scaled)) + f",slots={args.slots:g}" +
          (f",solo_speedup={solo:g}" if with_longest else "  (solo_speedup not fitted: no row has its longest pass)"))
    print(f"launch_us {coef[SLOT_SCALED]:.1f}; {len(rows)} rows; |log error| median {err[len(err) // 2]:.3f}, "
          f"90th percentile {err[int(len(err) * 0.9)]:.3f}, max {err[-1]:.3f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compares `treeattn bench --json` runs: the A/B behind every speedup docs/performance.md quotes.

Two forms:
    compare_runs.py BASE.json VARIANT.json [VARIANT2.json ...]   builds against each other
    compare_runs.py RUN.json --by-cost                             the --cost variants of one run,
                                                                   the first given as the baseline

Rows are matched by workload, head configuration, strategy and backend (and, in the first form, by
cost model too, when both runs swept the same ones; a variant that swept several --cost models
against a baseline run at one is compared model by model). For each variant and strategy it prints the
geometric-mean speed over the baseline (baseline time / variant time: above 1 is faster), its range,
and which plans differ (block size, passes or partials), with --rows every matched row.

Example: benchmarks/compare_runs.py main.json branch.json --rows
         benchmarks/compare_runs.py sweep.json --by-cost
"""
import argparse
import json
import re
import signal
from collections import OrderedDict
from statistics import geometric_mean as geomean


def plan_shape(row):
    return (row.get("block_tokens"), row.get("passes"), row.get("partials"))


def row_key(row, with_cost):
    key = (row["workload"], f'{row["heads_q"]}/{row["heads_kv"]}', row["strategy"], row["backend"])
    return key + ((row.get("cost_model", ""),) if with_cost else ())


def timed_rows(path):
    rows = json.load(open(path))
    if not isinstance(rows, list):
        raise SystemExit(f"{path}: not a `treeattn bench --json` file (a list of rows)")
    return [r for r in rows if "run_median_us" in r]


def cost_models(rows):
    """The run's cost models, in order of first appearance."""
    return list(OrderedDict.fromkeys(r.get("cost_model") for r in rows))


def swept(rows):
    """Whether the run swept --cost: some backend ran under several models (a run of several backends
    holds each backend's own model, which is no sweep)."""
    per_backend = {}
    for r in rows:
        per_backend.setdefault(r["backend"], set()).add(r.get("cost_model"))
    return any(len(models) > 1 for models in per_backend.values())


def keyed(rows, with_cost):
    return {row_key(r, with_cost): r for r in rows}


def cost_label(model, baseline_model):
    """The coefficients where a cost model differs from the baseline's, e.g. `merge_ns=4500`."""
    ours = dict(re.findall(r"(\w+)=([^,]+)", model))
    base = dict(re.findall(r"(\w+)=([^,]+)", baseline_model))
    return ",".join(f"{k}={v}" for k, v in ours.items() if base.get(k) != v) or model


def compare(label, base, variant, show_rows):
    keys = [k for k in base if k in variant]
    if not keys:
        print(f"{label}: no rows in common")
        return
    several_backends = len({k[3] for k in keys}) > 1
    for backend, strategy in OrderedDict.fromkeys((k[3], k[2]) for k in keys):
        ks = [k for k in keys if k[2] == strategy and k[3] == backend]
        if several_backends:
            strategy = f"{backend} {strategy}"
        speed = {k: base[k]["run_median_us"] / variant[k]["run_median_us"] for k in ks}
        changed = [k for k in ks if plan_shape(base[k]) != plan_shape(variant[k])]
        print(f"{label} | {strategy}: {geomean(speed.values()):.4f}x over {len(ks)} rows "
              f"({min(speed.values()):.3f}-{max(speed.values()):.3f}x); {len(changed)} plans differ"
              + (f", {geomean([speed[k] for k in changed]):.4f}x on those" if changed else ""))
        for k in ks if show_rows else changed:
            b, v = base[k], variant[k]
            shape = "" if plan_shape(b) == plan_shape(v) else f"  block/passes/partials {plan_shape(b)} -> {plan_shape(v)}"
            print(f"    {k[0][:48]:48s} {k[1]:6s} {b['run_median_us']:9.2f} -> {v['run_median_us']:9.2f} us "
                  f"{speed[k]:.3f}x{shape}")


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: stop quietly
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="bench JSON files: the baseline first")
    parser.add_argument("--by-cost", action="store_true", help="compare the --cost variants within the one run given")
    parser.add_argument("--rows", action="store_true", help="print every matched row, not only the changed plans")
    args = parser.parse_args()

    if args.by_cost:
        if len(args.runs) != 1:
            parser.error("--by-cost takes one run")
        by_model = OrderedDict()
        for row in timed_rows(args.runs[0]):
            by_model.setdefault(row.get("cost_model", ""), {})[row_key(row, False)] = row
        if len(by_model) < 2:
            parser.error(f"{args.runs[0]} has one cost model; run bench with --cost given several times")
        models = list(by_model)
        for model in models[1:]:
            compare(cost_label(model, models[0]), by_model[models[0]], by_model[model], args.rows)
        return
    if len(args.runs) < 2:
        parser.error("give a baseline and at least one variant (or one run with --by-cost)")
    base_rows = timed_rows(args.runs[0])
    base_models = cost_models(base_rows)
    for path in args.runs[1:]:
        variant_rows = timed_rows(path)
        variant_models = cost_models(variant_rows)
        if not swept(base_rows) and not swept(variant_rows):
            # Each backend at one model (its own defaults, whatever the build): match rows by backend.
            compare(path, keyed(base_rows, False), keyed(variant_rows, False), args.rows)
        elif len(base_models) == 1 and not swept(base_rows):
            # A sweep against one build's defaults: each of the variant's models against them.
            (base_model,) = base_models
            for model in variant_models:
                label = cost_label(model, base_model) if model != base_model else "the baseline's cost model"
                variant = keyed([r for r in variant_rows if r.get("cost_model") == model], False)
                compare(f"{path} [{label}]", keyed(base_rows, False), variant, args.rows)
        elif base_models == variant_models:
            compare(path, keyed(base_rows, True), keyed(variant_rows, True), args.rows)
        else:
            parser.error(f"{args.runs[0]} and {path} swept different cost models: compare each with --by-cost")

if __name__ == "__main__":
    main()

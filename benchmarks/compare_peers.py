#!/usr/bin/env python3
"""Compares a `treeattn bench --workload levels --json` run with the peer timings
of benchmarks/peers_h100.csv (same tree shapes and head configurations; docs/performance.md
says how the peers were measured).

usage: benchmarks/compare_peers.py BENCH.json [PEERS.csv] [--strategy flatten] [--block-tokens auto] [--bound]
       benchmarks/compare_peers.py --bench-args [PEERS.csv]
The second form prints the `treeattn bench` arguments that time the peers' tree
shapes and head configurations (the BENCH.json of the first):
    treeattn bench $(benchmarks/compare_peers.py --bench-args) --backend cuda --layers 32 --json BENCH.json
The first prints one Markdown row per configuration and the geometric-mean speedup over
the best peer. With --bound, also what no kernel can beat on the H100: the best
peer's time over the larger of the HBM time of the tree's unique KV bytes and the
tensor-core time of its attention (every query a leaf, reading the whole path:
QK^T and PV, 4 FLOP per query head, token and dimension), plus --floor-us, a
fixed cost per layer; so a speedup target above the bound's geometric mean is out
of reach on these configurations."""
import argparse
import csv
import json
import os
import re
from statistics import geometric_mean as geomean

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("bench", nargs="?")
parser.add_argument("peers", nargs="?", default=os.path.join(os.path.dirname(__file__), "peers_h100.csv"))
parser.add_argument("--strategy", default="flatten")
parser.add_argument("--block-tokens", help="only the rows of this --block-tokens value (a bench sweep has several)")
parser.add_argument("--bound", action="store_true", help="add the roofline bound on each speedup (see above)")
parser.add_argument("--peak-gbps", type=float, default=3352.32, help="HBM bandwidth of the bound (H100 SXM: 3352.32)")
parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense f16 tensor-core peak of the bound (H100 SXM: 989)")
parser.add_argument("--floor-us", type=float, default=0.0, help="fixed cost per layer added to the bound (the CUDA backend's: 3.95)")
parser.add_argument("--target", type=float, default=2.5, help="the speedup target whose reach the bound is counted against (the CUDA issue's: 2.5)")
parser.add_argument("--bench-args", action="store_true", help="print the treeattn bench arguments for the peers' shapes (see above)")
args = parser.parse_args()
if args.bench_args and args.bench is not None and args.bench.endswith(".csv"):
    args.peers = args.bench  # --bench-args PEERS.csv: the one positional is the peers file
elif args.bench is None and not args.bench_args:
    parser.error("BENCH.json is required (or --bench-args)")


def bound_us(row, contexts):
    """The fastest a layer of this tree can run: HBM or tensor cores, plus the floor."""
    hbm_us = row["unique_kv_bytes"] / (args.peak_gbps * 1e3)
    flop = 4.0 * row["queries"] * row["heads_q"] * sum(contexts) * row["head_dim"]
    return max(hbm_us, flop / (args.peak_tflops * 1e6)) + args.floor_us


best = {}
for row in csv.DictReader(open(args.peers)):
    key = (row["levels_N"], row["context_C"], int(row["heads_q"]), int(row["heads_kv"]))
    t = float(row["per_layer_us"])
    if key not in best or t < best[key][0]:
        best[key] = (t, row["method"])

if args.bench_args:
    # llama3-8b gives 32/8/128; the others go to --heads. Shapes in the file's order.
    shapes = list(dict.fromkeys((n, c) for n, c, _, _ in best))
    heads = sorted({(q, kv) for _, _, q, kv in best} - {(32, 8)})
    print("--workload levels --model llama3-8b" + (" --heads " + ",".join(f"{q}/{kv}/128" for q, kv in heads) if heads else "")
          + "".join(f" --levels {n.replace('/', ',')}:{c.replace('/', ',')}" for n, c in shapes))
    raise SystemExit(0)

speedups, bounds = [], []
print("| shape (nodes/context per level) | heads | best peer µs | treeattn µs | speedup |" + (" bound µs | bound speedup |" if args.bound else ""))
print("|---|---|---|---|---|" + ("---|---|" if args.bound else ""))
for row in json.load(open(args.bench)):
    if row["strategy"] != args.strategy or "run_median_us" not in row:
        continue
    if args.block_tokens is not None and row.get("block_tokens_option") != args.block_tokens:
        continue
    levels = re.findall(r"(\d+)x(\d+)", row["workload"])
    key = ("/".join(n for n, _ in levels), "/".join(c for _, c in levels), row["heads_q"], row["heads_kv"])
    if key not in best:
        continue
    peer, method = best[key]
    ours = row["run_median_us"]
    speedups.append(peer / ours)
    line = f"| {key[0]} : {key[1]} | {key[2]}/{key[3]} | {peer:.1f} ({method}) | {ours:.1f} | {peer / ours:.2f}x |"
    if args.bound:
        bound = bound_us(row, [int(c) for _, c in levels])
        bounds.append(peer / bound)
        line += f" {bound:.1f} | {peer / bound:.2f}x |"
    print(line)

if speedups:
    faster = sum(s > 1 for s in speedups)
    print(f"\n{len(speedups)} configurations: geometric-mean speedup over the best peer {geomean(speedups):.2f}x; faster on {faster}")
if bounds:
    print(f"bound (HBM {args.peak_gbps:g} GB/s, tensor cores {args.peak_tflops:g} TFLOPS, floor {args.floor_us:g} us): "
          f"geometric mean {geomean(bounds):.2f}x; below {args.target:g}x on {sum(b < args.target for b in bounds)}")

#!/usr/bin/env python3
"""Compares a `treeattn bench --workload levels --json` run with the peer timings
of ../shared/anchors/peers_h100.csv (same tree shapes and head configurations).

usage: benchmarks/compare_peers.py BENCH.json [PEERS.csv] [--strategy flatten] [--block-tokens auto]
Prints one Markdown row per configuration and the geometric-mean speedup over
the best peer."""
import argparse
import csv
import json
import math
import os
import re

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("bench")
parser.add_argument("peers", nargs="?", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "anchors", "peers_h100.csv"))
parser.add_argument("--strategy", default="flatten")
parser.add_argument("--block-tokens", help="only the rows of this --block-tokens value (a bench sweep has several)")
args = parser.parse_args()

best = {}
for row in csv.DictReader(open(args.peers)):
    key = (row["levels_N"], row["context_C"], int(row["heads_q"]), int(row["heads_kv"]))
    t = float(row["per_layer_us"])
    if key not in best or t < best[key][0]:
        best[key] = (t, row["method"])

speedups = []
print("| shape (nodes/context per level) | heads | best peer µs | treeattn µs | speedup |")
print("|---|---|---|---|---|")
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
    print(f"| {key[0]} : {key[1]} | {key[2]}/{key[3]} | {peer:.1f} ({method}) | {ours:.1f} | {peer / ours:.2f}x |")
if speedups:
    geo = math.exp(sum(math.log(s) for s in speedups) / len(speedups))
    faster = sum(s > 1 for s in speedups)
    print(f"\n{len(speedups)} configurations: geometric-mean speedup over the best peer {geo:.2f}x; faster on {faster}")

#!/usr/bin/env bash
# README command 1: set up, build, and run tree attention on the example tree
# (a 600-token prompt with branches and a causal draft query) through the CLI.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
out=build/example
mkdir -p "$out"
treeattn=build/bin/treeattn
tree=examples/fewshot.json

$treeattn random-inputs --tree "$tree" --out-dir "$out" --seed 1
$treeattn run --tree "$tree" --q "$out/q.npy" --k "$out/k.npy" --v "$out/v.npy" \
  --out "$out/o.npy" --lse "$out/lse.npy" --verbose
echo "wrote $out/o.npy and $out/lse.npy"
echo
$treeattn plan --tree "$tree" --block-tokens 128

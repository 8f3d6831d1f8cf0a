"""Speculative decoding's verification step with treeattn: a Medusa token tree
(DeFT's APPS topology) of random draft tokens on a long prefix, scored by one
forward pass of a random Llama, checked against the same model with transformers'
sdpa and the tree as a 4D mask.

    python examples/python/transformers_tree_verify.py --device cuda --prefix-tokens 4000 --tree-size 64
"""

from __future__ import annotations

import argparse
import copy
import json
import pathlib
import sys
import time

import torch
from transformers import DynamicCache

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import transformers_generate as example  # noqa: E402

import treeattn.transformers_tree as tt  # noqa: E402

WORKLOADS = pathlib.Path(__file__).resolve().parents[2] / "data" / "workloads" / "deft" / "speculative"


def medusa_parents(tree_size):
    """Parents of the token tree: its root (the last accepted token) and one token per Tree_Structure path."""
    paths = json.loads((WORKLOADS / f"APPS_tree_size{tree_size}.json").read_text())["Tree_Structure"]
    index = {(): 0}
    parents = [-1]
    for path in sorted(paths, key=len):
        index[tuple(path)] = len(parents)
        parents.append(index[tuple(path[:-1])])
    return parents


def timed(device, fn):
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    example.add_model_arguments(parser)
    parser.add_argument("--dtype", default=None, help="float16 on CUDA, float32 on the CPU by default")
    parser.add_argument("--prefix-tokens", type=int, default=4000)
    parser.add_argument("--tree-size", type=int, default=64, choices=[32, 64, 128, 256])
    parser.add_argument("--logprob-tolerance", type=float, default=0.1,
                        help="largest log-probability difference accepted over every token and vocabulary entry")
    parser.add_argument("--json")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float16 if args.device == "cuda" else torch.float32)
    model = example.random_llama(args.layers, args.hidden, args.heads, args.kv_heads, args.head_dim, args.vocab,
                                 args.device, dtype, args.seed)
    generator = torch.Generator().manual_seed(args.seed + 1)
    prefix = torch.randint(1, args.vocab, (1, args.prefix_tokens), generator=generator).to(args.device)
    parents = medusa_parents(args.tree_size)
    draft = torch.randint(1, args.vocab, (1, len(parents)), generator=generator).to(args.device)
    tree = tt.TokenTree(args.prefix_tokens, parents)
    tt.register()

    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        cache = DynamicCache(config=model.config)
        model(prefix, past_key_values=cache)
        positions = tree.position_ids(args.device)
        reference, reference_s = timed(args.device, lambda: model(
            draft, past_key_values=copy.deepcopy(cache), position_ids=positions,
            attention_mask=tree.attention_mask(dtype, args.device)).logits[0].float())
        model.set_attn_implementation(tt.NAME)
        ours, ours_s = timed(args.device, lambda: model(
            draft, past_key_values=copy.deepcopy(cache), position_ids=positions, token_tree=tree).logits[0].float())
    difference = (torch.log_softmax(ours, -1) - torch.log_softmax(reference, -1)).abs().max().item()
    same_argmax = (ours.argmax(-1) == reference.argmax(-1)).sum().item()
    result = {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "dtype": str(dtype),
              "prefix_tokens": args.prefix_tokens, "tree_tokens": len(parents), "layers": args.layers,
              "argmax_equal": same_argmax, "max_logprob_difference": difference,
              "distinct_argmax": len(set(ours.argmax(-1).tolist())), "treeattn_seconds": ours_s,
              "sdpa_seconds": reference_s}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    raise SystemExit(0 if same_argmax == len(parents) and difference <= args.logprob_tolerance else 1)


if __name__ == "__main__":
    main()

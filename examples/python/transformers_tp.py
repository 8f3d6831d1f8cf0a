"""Tensor-parallel decoding with treeattn as the attention: a random Llama saved
once and decoded on one GPU, then under torchrun on several, greedy-decoding
requests that share a prompt through continuous batching; rank 0 compares the
tokens with the single-GPU run's.

  * --attn paged|treeattn (or transformers' own, e.g. paged|sdpa): the model
    loaded with tp_plan="auto", every layer split over the ranks; each rank runs
    its heads' attention. The projections' split changes the model's numerics.
  * --attn paged|treeattn_heads: every rank holds the whole model; the attention
    heads are split over the ranks (treeattn on each rank's heads, read in place
    from the cache, the outputs all-gathered over NCCL). Each head's output is the
    single-GPU run's bit for bit, so the tokens are too.

    python examples/python/transformers_tp.py --attn paged|treeattn_heads --save /tmp/tp_model --single /tmp/single.json
    torchrun --nproc-per-node 2 examples/python/transformers_tp.py --attn paged|treeattn_heads --load /tmp/tp_model --single /tmp/single.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import transformers_generate as example  # noqa: E402

import treeattn.transformers_paged  # noqa: E402


def prompts_for(args):
    generator = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(1, args.vocab, (args.prompt_tokens,), generator=generator).tolist()
    return [prompt + torch.randint(1, args.vocab, (8,), generator=generator).tolist() for _ in range(args.branches)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--save", help="make the random model, save it here and decode on one GPU")
    parser.add_argument("--load", help="load the saved model with tp_plan='auto' (under torchrun) and decode")
    parser.add_argument("--single", required=True, help="the single-GPU run's tokens (written by --save, read by --load)")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--branches", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attn", default="paged|treeattn",
                        help="the attention (paged|sdpa decodes the same way without treeattn: a control)")
    parser.add_argument("--json", help="rank 0 writes the comparison here")
    args = parser.parse_args()
    treeattn.transformers_paged.register()
    prompts = prompts_for(args)
    if args.save:
        if not os.path.exists(args.save):
            example.random_llama(2, 4096, 32, 8, 128, args.vocab, "cuda", torch.float16, args.seed).save_pretrained(args.save)
        # Loaded back as the ranks load it: a model made in memory differs from its saved
        # self (its rotary frequencies were cast to float16 with the weights).
        model = AutoModelForCausalLM.from_pretrained(args.save, dtype=torch.float16, attn_implementation=args.attn)
        model = model.to("cuda").eval()
        tokens, logprobs, seconds = example.generate(model, args.attn, prompts, args.new_tokens, 256)
        with open(args.single, "w") as f:
            json.dump({"tokens": tokens, "logprobs": logprobs, "seconds": seconds}, f)
        print(f"single GPU: {len(tokens)} requests x {args.new_tokens} tokens in {seconds:.2f} s")
        return
    rank = int(os.environ.get("RANK", "0"))
    split = args.attn == treeattn.transformers_paged.SPLIT_NAME
    if split:  # the whole model on every rank, the attention heads split
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        torch.distributed.init_process_group("nccl", device_id=torch.device("cuda", local))
        model = AutoModelForCausalLM.from_pretrained(args.load, dtype=torch.float16, attn_implementation=args.attn)
        model = model.to(f"cuda:{local}").eval()
    else:
        model = AutoModelForCausalLM.from_pretrained(args.load, dtype=torch.float16, tp_plan="auto",
                                                     attn_implementation=args.attn)
    tokens, logprobs, seconds = example.generate(model, args.attn, prompts, args.new_tokens, 256)
    if rank == 0:
        with open(args.single) as f:
            single = json.load(f)
        first = [next((i for i, (a, b) in enumerate(zip(ta, tb)) if a != b), len(ta))
                 for ta, tb in zip(tokens, single["tokens"])]
        worst = max((abs(a - b) for la, lb, n in zip(logprobs, single["logprobs"], first) for a, b in zip(la[:n + 1], lb[:n + 1])),
                    default=0.0)
        result = {"attention": args.attn, "world_size": int(os.environ.get("WORLD_SIZE", "1")),
                  "split": "attention heads (the model on every rank)" if split else "transformers' tp_plan='auto'",
                  "tokens_identical": tokens == single["tokens"],
                  "first_difference": first, "max_logprob_difference": worst, "tp_seconds": seconds,
                  "single_seconds": single["seconds"],
                  "heads_per_rank": treeattn.transformers_paged.heads_seen}
        print(json.dumps(result, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    if split:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()

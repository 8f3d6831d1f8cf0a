"""Greedy decoding of a random Llama through transformers' continuous batching,
with treeattn as the attention, checked against transformers' own paged attention.

One long prompt shared by many requests (each with a short suffix of its own):
continuous batching shares the prompt's cache blocks, and treeattn reads them once
per step for all requests. The model is randomly initialised (no download), with
weights large enough that greedy decoding does not collapse onto one token.

    python examples/python/transformers_generate.py --device cuda --prompt-tokens 4000 --branches 32

In float32 (--dtype float32) both attentions compute in f32 and the greedy tokens agree
exactly; in float16 or bfloat16 a request may part from the reference at a near-tie.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import AttentionInterface, ContinuousBatchingConfig, GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.integrations.sdpa_paged import sdpa_attention_paged_forward

import treeattn.transformers_paged


def add_model_arguments(parser):
    """The device and the random Llama's shape (llama3-8b's heads, few layers)."""
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=32000)


def random_llama(layers, hidden, heads, kv_heads, head_dim, vocab, device, dtype, seed):
    config = LlamaConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                         intermediate_size=2 * hidden, num_hidden_layers=layers, vocab_size=vocab,
                         max_position_embeddings=16384, initializer_range=0.08)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()
    return model


class AttentionTimer:
    """Registers `name` as `function` timed around every call: the time of the
    attention alone (its cache write included), read after the run. On CUDA, events
    on the stream (GPU time); on the CPU, the calls' wall time."""

    def __init__(self, name, function, cuda=True):
        self.events = []
        self.host_seconds = 0.0

        def timed(module, *args, **kwargs):
            if not cuda:
                start = time.perf_counter()
                result = function(module, *args, **kwargs)
                self.host_seconds += time.perf_counter() - start
                return result
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = function(module, *args, **kwargs)
            end.record()
            self.events.append((start, end))
            return result

        AttentionInterface.register(name, timed)

    def seconds(self):
        if self.events:
            torch.cuda.synchronize()
        total = self.host_seconds + sum(start.elapsed_time(end) for start, end in self.events) / 1e3
        self.events, self.host_seconds = [], 0.0
        return total


def compare(a, b):
    """(tokens, log-probabilities) of two decodes, request by request: the first step
    whose token differs in each, and the largest log-probability difference up to it
    (the same context on both sides, so a difference is the attention's, not a
    diverged prefix's)."""
    first = [next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), len(ta)) for ta, tb in zip(a[0], b[0])]
    worst = max((abs(x - y) for la, lb, n in zip(a[1], b[1], first) for x, y in zip(la[:n + 1], lb[:n + 1])),
                default=0.0)
    return first, worst


def generate(model, implementation, prompts, new_tokens, block_size):
    model.set_attn_implementation(implementation)
    generation = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    # Cache blocks for every request unshared (block sharing needs fewer), and a batch that holds the longest prompt.
    longest = max(len(p) for p in prompts) + new_tokens
    blocks = len(prompts) * (longest + block_size - 1) // block_size + len(prompts)
    batching = ContinuousBatchingConfig(block_size=block_size, num_blocks=blocks, max_batch_tokens=max(longest, 1024),
                                        allow_block_sharing=True, return_logprobs=True, use_cuda_graph=False,
                                        use_async_batching=False)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = model.generate_batch(prompts, generation_config=generation, continuous_batching_config=batching,
                                   warmup=False)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    ordered = sorted(outputs.values(), key=lambda o: int(o.request_id.split("_")[-1]))
    short = [o.request_id for o in ordered if len(o.generated_tokens) != new_tokens]
    if len(ordered) != len(prompts) or short:  # continuous batching logs a request's failure and goes on
        raise RuntimeError(f"{implementation}: {len(ordered)} of {len(prompts)} requests came back, "
                           f"{short} without {new_tokens} tokens (the log above says why)")
    return [o.generated_tokens for o in ordered], [o.logprobs for o in ordered], seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_arguments(parser)
    parser.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on the CPU by default")
    parser.add_argument("--prompt-tokens", type=int, default=4000, help="tokens of the shared prompt")
    parser.add_argument("--suffix-tokens", type=int, default=8, help="tokens of each request's own suffix")
    parser.add_argument("--branches", type=int, default=32, help="requests sharing the prompt")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--block-size", type=int, default=256, help="continuous batching's KV block size")
    parser.add_argument("--reference", default="paged|sdpa", help="transformers' attention to check against")
    parser.add_argument("--control", help="another of transformers' attentions, checked against the reference the same "
                                          "way: how far two implementations of the same attention drift apart")
    parser.add_argument("--logprob-tolerance", type=float, default=0.05)
    parser.add_argument("--json", help="write the comparison and timings here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device == "cuda" else torch.float32)
    model = random_llama(args.layers, args.hidden, args.heads, args.kv_heads, args.head_dim, args.vocab, args.device,
                         dtype, args.seed)
    generator = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(1, args.vocab, (args.prompt_tokens,), generator=generator).tolist()
    prompts = [prompt + torch.randint(1, args.vocab, (args.suffix_tokens,), generator=generator).tolist()
               for _ in range(args.branches)]

    treeattn.transformers_paged.register()
    timers = {}
    if args.device == "cuda" and args.reference == "paged|sdpa":
        timers = {treeattn.transformers_paged.NAME: AttentionTimer(treeattn.transformers_paged.NAME,
                                                                   treeattn.transformers_paged.paged_attention),
                  "paged|sdpa": AttentionTimer("paged|sdpa", sdpa_attention_paged_forward)}
    ours = generate(model, treeattn.transformers_paged.NAME, prompts, args.new_tokens, args.block_size)
    ours_attention = timers[treeattn.transformers_paged.NAME].seconds() if timers else None
    theirs = generate(model, args.reference, prompts, args.new_tokens, args.block_size)
    theirs_attention = timers["paged|sdpa"].seconds() if timers else None
    if timers:  # transformers' own function back
        AttentionInterface.register("paged|sdpa", sdpa_attention_paged_forward)

    same_tokens = ours[0] == theirs[0]
    distinct = len({t for tokens in ours[0] for t in tokens})
    first_difference, worst = compare(ours, theirs)
    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "prompt_tokens": args.prompt_tokens, "branches": args.branches, "new_tokens": args.new_tokens,
        "layers": args.layers, "heads": [args.heads, args.kv_heads, args.head_dim],
        "tokens_identical": same_tokens, "distinct_tokens": distinct, "max_logprob_difference": worst,
        "first_difference": first_difference,
        "treeattn_seconds": ours[2], "reference_seconds": theirs[2], "reference": args.reference,
        "attention_gpu_seconds": {"treeattn": ours_attention, args.reference: theirs_attention},
        "tokens_per_second": {"treeattn": args.branches * args.new_tokens / ours[2],
                              args.reference: args.branches * args.new_tokens / theirs[2]},
    }
    if args.control:
        control = generate(model, args.control, prompts, args.new_tokens, args.block_size)
        control_first, control_worst = compare(control, theirs)
        result["control"] = {"implementation": args.control, "first_difference": control_first,
                             "max_logprob_difference": control_worst, "seconds": control[2]}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    ok = same_tokens and worst <= args.logprob_tolerance and distinct > 1
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""treeattn as the attention of five architectures built through transformers' own
classes (random weights, no download): Llama 3, Qwen3, Gemma 2, gpt-oss and
DeepSeek-V3, each with its attention features passed through.

Every model decodes one shared prompt continued by `--branches` requests (each with
a short suffix of its own), greedily, for `--new-tokens` tokens, once with treeattn
and once with transformers' default attention, and the two are compared: the
greedy tokens of every request, and the log-probability of each generated token
up to the first step where a request's tokens part (in float32 they must not).

    architecture  features                                   treeattn's path
    llama3        GQA 32/8, head_dim 128                     paged|treeattn (continuous batching)
    qwen3         GQA 32/8, head_dim 128, QK norm            paged|treeattn
    gpt-oss       sinks (s_aux), 128-token windows on every  paged|treeattn; reference paged|eager
                  other layer, head_dim 64, MoE              (paged|sdpa has no sinks)
    gemma2        soft-capping (softcap 50), windows on      treeattn_tree (the tree as the mask);
                  every other layer, head_dim 256, scaling   reference eager (sdpa does not soft-cap,
                  query_pre_attn_scalar**-0.5                 and paged|eager neither)
    deepseek-v3   MLA without absorption: QK head dim 192,   treeattn_tree; its cache holds latents,
                  V 128, MoE                                  not the paged cache's K/V rows

Continuous batching (paged|treeattn against paged|sdpa or paged|eager) shares the
prompt's cache blocks between requests; the tree path keeps the prompt and every
request's tokens in one cache (treeattn.transformers_tree.GrowingRequests: each
step's rows appended to a treeattn.Planner), and its reference decodes the requests
as a batch, each with its own copy of the prompt. Windows are planned once per
distinct window per forward pass. Gemma 2's real
window (4096) does not bind on a 2000-token prompt, so it takes --gemma2-window.

With --fp8 the Llama model also decodes in float16 with its cache in fp8 e4m3
(paged|treeattn_fp8, scales 1) against its own float16 treeattn decode (how far
quantizing K and V moves it), and against float16 K and V rounded through e4m3
(the fp8 kernels' own error: none expected beyond float16 rounding).

    # the H200: float32 (tokens identical, log-probs within 1e-3), then bf16
    python examples/python/transformers_models.py --dtype float32 --fp8 --json f32.json
    python examples/python/transformers_models.py --dtype bfloat16 --json bf16.json
    # the CPU: small models and a short prompt
    python examples/python/transformers_models.py --device cpu --small --prompt-tokens 300 --branches 4 --new-tokens 8

Exits 1 when an architecture's tokens differ (float32) or a log-probability differs
by more than --logprob-tolerance before the tokens part; in bfloat16, when treeattn's
decode is farther from the float32 decode of the same weights than transformers' own
by more than --logprob-tolerance, on average over the steps where both decodes still
follow the float32 one (the largest difference is reported too: one step near a tie
sets it, so it says little about a rounding). Each attention decodes two tokens untimed before its timed decode (its
kernels loaded, its workspaces made).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch
import transformers
from transformers import (AttentionInterface, AutoModelForCausalLM, DeepseekV3Config, DynamicCache, Gemma2Config,
                          GptOssConfig, LlamaConfig, Qwen3Config)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import transformers_generate as paged_example  # noqa: E402

import treeattn.transformers_paged as tp  # noqa: E402
import treeattn.transformers_tree as tt  # noqa: E402

ALTERNATING = ["sliding_attention", "full_attention"]


def configs(args):
    """Each architecture's config: (class, keyword arguments) at the GPU's size, or
    with --small at a CPU's (fewer heads and a narrower model; the head dims kept)."""
    small = args.small
    hidden = 512 if small else 4096
    common = dict(num_hidden_layers=args.layers, vocab_size=args.vocab or (2000 if small else 32000),
                  initializer_range=0.08, max_position_embeddings=8192, intermediate_size=2 * hidden)
    return {
        "llama3": (LlamaConfig, dict(common, hidden_size=hidden, num_attention_heads=4 if small else 32,
                                     num_key_value_heads=2 if small else 8, head_dim=128)),
        "qwen3": (Qwen3Config, dict(common, hidden_size=hidden, num_attention_heads=4 if small else 32,
                                    num_key_value_heads=2 if small else 8, head_dim=128)),
        "gpt-oss": (GptOssConfig, dict(common, hidden_size=512 if small else 2880, intermediate_size=512 if small else 2880,
                                       num_attention_heads=8 if small else 64, num_key_value_heads=2 if small else 8,
                                       head_dim=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=128,
                                       layer_types=ALTERNATING * (args.layers // 2) + ALTERNATING[:args.layers % 2])),
        "gemma2": (Gemma2Config, dict(common, hidden_size=512 if small else 3584, num_attention_heads=4 if small else 16,
                                      num_key_value_heads=2 if small else 8, head_dim=256, query_pre_attn_scalar=256,
                                      sliding_window=args.gemma2_window, attn_logit_softcapping=50.0,
                                      final_logit_softcapping=30.0, tie_word_embeddings=False,
                                      layer_types=ALTERNATING * (args.layers // 2) + ALTERNATING[:args.layers % 2])),
        "deepseek-v3": (DeepseekV3Config, dict(common, hidden_size=512 if small else 2048,
                                               num_attention_heads=4 if small else 16,
                                               num_key_value_heads=4 if small else 16, q_lora_rank=256 if small else 768,
                                               kv_lora_rank=256 if small else 512, qk_nope_head_dim=128,
                                               qk_rope_head_dim=64, v_head_dim=128,
                                               moe_intermediate_size=256 if small else 1024, n_routed_experts=4,
                                               num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                                               n_group=1, topk_group=1)),
    }


PAGED = {"llama3", "qwen3", "gpt-oss"}  # where transformers' continuous batching computes the model's attention


def build(args, architecture, dtype):
    config_class, kwargs = configs(args)[architecture]
    torch.manual_seed(args.seed)
    return AutoModelForCausalLM.from_config(config_class(**kwargs)).to(device=args.device, dtype=dtype).eval()


def reference_attention(model):
    """transformers' default attention for the model, where it computes the model's
    attention: eager where the layers soft-cap (sdpa leaves soft-capping out)."""
    if getattr(model.config, "attn_logit_softcapping", None):
        return "eager"
    return model.config._attn_implementation


def timed_reference(name, model, cuda):
    """An AttentionTimer on transformers' own `name` (eager: the model module's
    eager_attention_forward, looked up there when none is registered), and a
    function that puts the interface back as it was."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    registered = name in AttentionInterface._global_mapping
    function = ALL_ATTENTION_FUNCTIONS[name] if registered else sys.modules[type(model).__module__].eager_attention_forward
    timer = paged_example.AttentionTimer(name, function, cuda)

    def restore():
        if registered:
            AttentionInterface.register(name, function)
        else:
            del AttentionInterface._global_mapping[name]

    return timer, restore


def next_tokens(logits):
    logprobs = torch.log_softmax(logits.float(), -1)
    tokens = logprobs.argmax(-1)
    return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]


def decode_tree(model, prompt, suffixes, new_tokens):
    """treeattn's tree path: the prompt once, then every request's suffix and tokens
    in the same cache (each request's rows: the prompt's and its own), the decode's
    steps planned incrementally (GrowingRequests). Returns each request's generated
    tokens and their log-probabilities."""
    device = model.device
    cache, length = DynamicCache(), 0  # no config: every layer keeps every row

    def forward(ids, packed, last):
        nonlocal length
        logits = model(torch.tensor([ids], device=device), past_key_values=cache, token_tree=packed,
                       position_ids=packed.position_ids(device), use_cache=True).logits[0]
        length += len(ids)
        return next_tokens(logits[last])

    prompt_rows = list(range(len(prompt)))
    forward(prompt, tt.PackedRequests([prompt_rows], [len(prompt)]), [len(prompt) - 1])
    rows = [prompt_rows + list(range(length + r * len(s), length + (r + 1) * len(s))) for r, s in enumerate(suffixes)]
    ends = [(r + 1) * len(s) - 1 for r, s in enumerate(suffixes)]
    requests = tt.GrowingRequests(rows, [len(s) for s in suffixes])  # planned step by step from here on
    token, logprob = forward([t for s in suffixes for t in s], requests, ends)
    generated, logprobs = [token.tolist()], [logprob.tolist()]
    for _ in range(new_tokens - 1):
        requests.step([[length + r] for r in range(len(suffixes))])
        token, logprob = forward(generated[-1], requests, list(range(len(suffixes))))
        generated.append(token.tolist())
        logprobs.append(logprob.tolist())
    return [list(t) for t in zip(*generated)], [list(p) for p in zip(*logprobs)]


def decode_batch(model, prompt, suffixes, new_tokens):
    """The reference: the requests as one batch, each its own sequence (the prompt
    copied), through transformers' cache for the model."""
    ids = torch.tensor([prompt + s for s in suffixes], device=model.device)
    out = model(ids, use_cache=True, logits_to_keep=1)
    generated, logprobs = [], []
    for step in range(new_tokens):
        token, logprob = next_tokens(out.logits[:, -1])
        generated.append(token.tolist())
        logprobs.append(logprob.tolist())
        if step + 1 < new_tokens:
            out = model(token[:, None], past_key_values=out.past_key_values, use_cache=True)
    return [list(t) for t in zip(*generated)], [list(p) for p in zip(*logprobs)]


def run(model, implementation, decode, prompt, suffixes, new_tokens):
    """(tokens, log-probabilities, seconds) of one decode with `implementation`."""
    model.set_attn_implementation(implementation)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        tokens, logprobs = decode(model, prompt, suffixes, new_tokens)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return tokens, logprobs, time.perf_counter() - start


def paged_decode(block_size):
    """Continuous batching's decode (transformers_generate.generate) as run() takes it."""

    def decode(model, prompt, suffixes, new_tokens):
        tokens, logprobs, _ = paged_example.generate(model, model.config._attn_implementation,
                                                     [prompt + s for s in suffixes], new_tokens, block_size)
        return tokens, logprobs

    return decode


def distance_from(exact, decodes):
    """How far each decode is from `exact`: the step where its tokens part from it,
    per request, and the log-probability differences over the steps every decode
    still follows it (the same steps for all, each a token of the same context: a
    decode that follows `exact` longer is not measured over more steps), as their
    mean and largest."""
    firsts = {name: paged_example.compare(decoded, exact)[0] for name, decoded in decodes.items()}
    shared = [min(steps) for steps in zip(*firsts.values())]
    result = {"shared_steps": sum(shared)}
    for name, decoded in decodes.items():
        differences = [abs(x - y) for ld, le, n in zip(decoded[1], exact[1], shared) for x, y in zip(ld[:n], le[:n])]
        result[name] = {"first_difference": firsts[name], "max_logprob_difference": max(differences, default=0.0),
                        "mean_logprob_difference": sum(differences) / max(len(differences), 1),
                        "logprob_differences": differences}
    return result


def compare_architecture(args, architecture, dtype, prompt, suffixes):
    """One architecture: treeattn's decode against the reference's, timed."""
    model = build(args, architecture, dtype)
    cuda = args.device == "cuda"
    generated = len(suffixes) * args.new_tokens
    paged = architecture in PAGED and args.path == "auto"
    if paged:
        ours_name, decode = tp.NAME, paged_decode(args.block_size)
        reference = "paged|" + model.config._attn_implementation
        ours_function = tp.paged_attention
    else:
        ours_name, decode, reference, ours_function = tt.NAME, decode_tree, reference_attention(model), tt.tree_attention
    ours_timer = paged_example.AttentionTimer(ours_name, ours_function, cuda)
    reference_timer, restore = timed_reference(reference, model, cuda)
    reference_decode = decode if paged else decode_batch
    try:
        # Each attention's first calls (kernels loaded, workspaces and library handles made) untimed.
        for name, timer, how in ((ours_name, ours_timer, decode), (reference, reference_timer, reference_decode)):
            run(model, name, how, prompt, suffixes, min(args.new_tokens, 2))
            timer.seconds()
        ours = run(model, ours_name, decode, prompt, suffixes, args.new_tokens)
        ours_attention = ours_timer.seconds()
        theirs = run(model, reference, reference_decode, prompt, suffixes, args.new_tokens)
        theirs_attention = reference_timer.seconds()
    finally:
        restore()
        AttentionInterface.register(ours_name, ours_function)
    first, worst = paged_example.compare(ours, theirs)
    result = {
        "path": ours_name, "reference": reference,
        "tokens_identical": ours[0] == theirs[0], "first_difference": first, "max_logprob_difference": worst,
        "distinct_tokens": len({t for tokens in ours[0] for t in tokens}),
        # far from 0: the distributions are not saturated, so a log-probability difference shows
        "mean_logprob": sum(map(sum, ours[1])) / generated,
        "attention_seconds": {"treeattn": ours_attention, "reference": theirs_attention},
        "seconds": {"treeattn": ours[2], "reference": theirs[2]},
        "tokens_per_second": {"treeattn": generated / ours[2], "reference": generated / theirs[2]},
    }
    if dtype != torch.float32:
        # The anchor both roundings are measured from: the same weights (bf16 values) decoded in float32
        # with the reference attention.
        exact = run(model.float(), reference, reference_decode, prompt, suffixes, args.new_tokens)
        result["from_float32"] = distance_from(exact, {"treeattn": ours, "reference": theirs})
    return result


ROUNDED = "paged|treeattn_e4m3_rounded"


def rounded_attention(module, query, key, value, *args, **kwargs):
    """paged|treeattn on float16 keys and values rounded through e4m3: what an fp8
    cache holds, in a float16 one (the control that separates the kernels' error
    from the quantization's)."""
    e4m3 = torch.float8_e4m3fn
    return tp.paged_attention(module, query, key.to(e4m3).to(key.dtype), value.to(e4m3).to(value.dtype), *args, **kwargs)


def compare_fp8(args, prompt, suffixes):
    """The Llama model in float16: treeattn with an fp8 e4m3 cache against its own
    float16 cache (the quantization's effect), and against float16 rows rounded
    through e4m3 (the fp8 kernels' own error)."""
    model = build(args, "llama3", torch.float16)
    decode = paged_decode(args.block_size)
    AttentionInterface.register(ROUNDED, rounded_attention)
    f16 = run(model, tp.NAME, decode, prompt, suffixes, args.new_tokens)
    fp8 = run(model, tp.FP8_NAME, decode, prompt, suffixes, args.new_tokens)
    rounded = run(model, ROUNDED, decode, prompt, suffixes, args.new_tokens)
    first, worst = paged_example.compare(fp8, f16)
    rounded_first, rounded_worst = paged_example.compare(fp8, rounded)
    return {"kv_dtype": "float8_e4m3fn", "scales": 1.0, "against": "the same model's float16 treeattn decode",
            "tokens_identical": fp8[0] == f16[0], "first_difference": first, "max_logprob_difference": worst,
            "against_rounded_kv": {"tokens_identical": fp8[0] == rounded[0], "max_logprob_difference": rounded_worst,
                                   "first_difference": rounded_first},
            "seconds": {"fp8": fp8[2], "float16": f16[2]}}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="the models' dtype: float32 for the exactness check (tokens identical), bfloat16 to time")
    parser.add_argument("--architectures", default="llama3,qwen3,gemma2,gpt-oss,deepseek-v3",
                        help="comma-separated, of: llama3, qwen3, gemma2, gpt-oss, deepseek-v3")
    parser.add_argument("--path", default="auto", choices=["auto", "tree"],
                        help="auto: continuous batching where it computes the model's attention, else the tree path; "
                             "tree: the tree path for every architecture")
    parser.add_argument("--small", action="store_true", help="CPU-sized models (fewer heads, narrower; head dims kept)")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (2: one windowed, one full where alternating)")
    parser.add_argument("--vocab", type=int, help="vocabulary (default 32000, or 2000 with --small)")
    parser.add_argument("--gemma2-window", type=int, default=1024, help="Gemma 2's sliding window (its own is 4096)")
    parser.add_argument("--prompt-tokens", type=int, default=2000, help="tokens of the prompt every request shares")
    parser.add_argument("--suffix-tokens", type=int, default=4, help="tokens of each request's own suffix")
    parser.add_argument("--branches", type=int, default=16, help="requests continuing the prompt")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens decoded greedily per request")
    parser.add_argument("--block-size", type=int, default=256, help="continuous batching's KV block size")
    parser.add_argument("--logprob-tolerance", type=float,
                        help="float32: the largest log-probability difference from the reference accepted (default "
                             "1e-3; the tokens must be identical). bfloat16 and float16, where two attentions round "
                             "differently and requests part at near-ties: both decodes are compared with the float32 "
                             "decode of the same weights, and treeattn's mean log-probability difference from it may be "
                             "at most this much more than the reference's (default 0.02), over the steps where both "
                             "still follow it")
    parser.add_argument("--fp8", action="store_true", help="also decode Llama in float16 with an fp8 e4m3 KV cache")
    parser.add_argument("--fp8-kernel-tolerance", type=float, default=1e-2,
                        help="largest log-probability difference of the fp8 decode from float16 K/V rounded through e4m3")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype)
    if args.logprob_tolerance is None:
        args.logprob_tolerance = 1e-3 if args.dtype == "float32" else 0.02
    vocab = args.vocab or (2000 if args.small else 32000)
    generator = torch.Generator().manual_seed(args.seed + 1)
    prompt = torch.randint(1, vocab, (args.prompt_tokens,), generator=generator).tolist()
    suffixes = [torch.randint(1, vocab, (args.suffix_tokens,), generator=generator).tolist() for _ in range(args.branches)]
    tp.register()
    tt.register()
    results = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "transformers": transformers.__version__, "dtype": args.dtype,
        "prompt_tokens": args.prompt_tokens, "branches": args.branches, "new_tokens": args.new_tokens,
        "layers": args.layers, "small": args.small, "logprob_tolerance": args.logprob_tolerance, "architectures": {},
    }
    ok = True
    for architecture in args.architectures.split(","):
        result = compare_architecture(args, architecture, dtype, prompt, suffixes)
        results["architectures"][architecture] = result
        ok &= result["distinct_tokens"] > 1
        if args.dtype == "float32":
            ok &= result["tokens_identical"] and result["max_logprob_difference"] <= args.logprob_tolerance
        else:
            far = result["from_float32"]
            ok &= far["treeattn"]["mean_logprob_difference"] <= far["reference"]["mean_logprob_difference"] + \
                args.logprob_tolerance
        shown = ("path", "tokens_identical", "max_logprob_difference", "from_float32", "attention_seconds",
                 "tokens_per_second")
        summary = {k: result[k] for k in shown if k in result}
        if "from_float32" in summary:  # the per-step differences stay in --json
            summary["from_float32"] = {name: {k: v for k, v in far.items() if k != "logprob_differences"}
                                       if isinstance(far, dict) else far for name, far in summary["from_float32"].items()}
        print(architecture, json.dumps(summary), flush=True)
    if args.fp8:
        results["fp8"] = compare_fp8(args, prompt, suffixes)
        ok &= results["fp8"]["against_rounded_kv"]["max_logprob_difference"] <= args.fp8_kernel_tolerance
        print("fp8", json.dumps(results["fp8"]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()

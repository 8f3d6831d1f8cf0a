"""treeattn as an attention implementation of transformers' continuous batching.

    import treeattn.transformers_paged
    treeattn.transformers_paged.register()        # adds "paged|treeattn" to AttentionInterface
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="paged|treeattn")
    outputs = model.generate_batch(prompts, generation_config)

Continuous batching packs a step's requests into one varlen batch whose KV lives
in a paged cache, and (with block sharing) requests with a common prompt read the
same cache blocks. Each forward pass turns the cache's read indices into one tree:
requests whose rows begin alike share those nodes, and each new token is a query
that sees its request's rows up to itself. The tree is planned once per distinct
sliding window per forward pass (a model alternating windowed and full layers
plans twice; full layers once per cache group, whose blocks are their own), and
every layer runs its window's plan on its own cache tensors.
Full-attention layers write the new keys and values into the cache first, as
transformers' own paged implementations do, and read it in place; sliding layers
read the window's rows that transformers' cache gathers. The layer's `scaling`,
gpt-oss's sinks (`s_aux`) and Gemma 2's `softcap` pass through.

`paged|treeattn_fp8` (registered beside it) keeps the full-attention layers'
cache in float8_e4m3fn. `paged|treeattn_heads` splits the attention heads over the
ranks of torch.distributed's group, each holding the whole model: every rank runs
treeattn on its heads and the outputs are all-gathered, bit for bit the one-GPU run.
"""

from __future__ import annotations

from . import context_for
from .adapters import tree_from_block_tables, tree_from_packed_sequences
from .transformers_tree import variant_arguments

NAME = "paged|treeattn"
SPLIT_NAME = "paged|treeattn_heads"
FP8_NAME = "paged|treeattn_fp8"
SPLIT_BLOCK_TOKENS = 256  # the head split's block size: fixed, so a rank's plan does not depend on its share

_step = {}  # id(cache) -> the plan of the forward pass in progress
heads_seen = None  # (heads_q, heads_kv) of the last batch planned: a rank's own under tensor parallelism


def _packed_tree(rows, cu_seq_lens_k, cu_seq_lens_q, block_size, heads_q, heads_kv, head_dim, scale, head_dim_v):
    """The tree of a packed batch. Where every request's rows run through its cache
    blocks in order (token t in row block[t // block_size] * block_size + t %
    block_size, as the paged cache lays them out), it is built from the blocks,
    checked on the device, and only they come to the host; else from every row."""
    import torch

    cu = cu_seq_lens_k.to(device=rows.device, dtype=torch.int64)
    lengths = cu[1:] - cu[:-1]
    token = torch.arange(rows.numel(), device=rows.device) - torch.repeat_interleave(cu[:-1], lengths)
    rows = rows.to(torch.int64)
    block_start = token % block_size == 0
    page = rows // block_size
    page_of_block = page[block_start]
    in_order = ((rows % block_size) == (token % block_size)) & (page == page_of_block[torch.cumsum(block_start, 0) - 1])
    if not bool(in_order.all()):
        return tree_from_packed_sequences(rows, cu_seq_lens_k, cu_seq_lens_q, heads_q, heads_kv, head_dim, scale,
                                          head_dim_v)
    seq_lens = lengths.tolist()
    pages = page_of_block.tolist()
    table, at = [], 0
    for n in seq_lens:
        blocks = (n + block_size - 1) // block_size
        table.append(pages[at:at + blocks])
        at += blocks
    new_tokens = (cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]).tolist()
    return tree_from_block_tables(table, seq_lens, block_size, heads_q, heads_kv, head_dim, scale, new_tokens, head_dim_v)


def _cache_tensors(cache, in_group, kv_dtype):
    """The group's cache tensors for this layer; under an fp8 KV cache, transformers'
    tensors are replaced at their first use by fp8 ones of the same shape."""
    import torch

    k_cache, v_cache = cache.key_cache[in_group], cache.value_cache[in_group]
    if kv_dtype is not None and k_cache.dtype != kv_dtype:
        k_cache = cache.key_cache[in_group] = torch.empty(k_cache.shape, dtype=kv_dtype, device=k_cache.device)
        v_cache = cache.value_cache[in_group] = torch.empty(v_cache.shape, dtype=kv_dtype, device=v_cache.device)
    return k_cache, v_cache


def _layer_rows(module, key, value, cache, cu_seq_lens_k, kwargs, kv_dtype=None):
    """The rows this layer's attention reads: (K rows, V rows, the packed batch's row
    of every request's tokens, its cu_seq_lens_k, the window, the plan's key). A full-attention layer
    writes its new keys and values into the cache first, as transformers' own paged
    implementations do, and reads the cache in place (rows of the whole pool,
    strided). A sliding layer's cache is a ring of the last `window` rows that the
    new ones may overwrite: transformers' cache.update gathers them, in path order,
    and the layer reads that copy. kv_dtype (a torch float8 dtype): full-attention
    layers keep their cache in it (k_scale = v_scale = 1, as vLLM's default); a
    sliding layer's ring stays in the model's dtype."""
    import torch

    group, in_group = cache.layer_index_to_group_indices[module.layer_idx]
    cache_dim = cache.key_cache[in_group].shape[-1]
    if key.shape[-1] != cache_dim or value.shape[-1] != cache_dim:
        raise ValueError(f"`{NAME}`: layer {module.layer_idx} has keys of head dim {key.shape[-1]} and values of "
                         f"{value.shape[-1]}, but transformers' paged cache holds rows of {cache_dim} (a model whose "
                         f"cache is not its keys and values, as DeepSeek-V3's latent one): use the tree path, "
                         f"treeattn.transformers_tree")
    window = cache.sliding_windows[module.layer_idx]
    kind = "full_attention" if window in (None, 0, 1) else "sliding_attention"
    if isinstance(cu_seq_lens_k, dict):
        cu_seq_lens_k = cu_seq_lens_k[kind]
    read, write = kwargs["read_index"][group], kwargs["write_index"][group]
    if kind == "sliding_attention":
        k, v = cache.update(key, value, module.layer_idx, kwargs["read_index"], kwargs["write_index"])
        k, v = k.contiguous(), v.contiguous()  # a prefill's are its new rows, a transposed view
        return k, v, torch.arange(k.shape[0], device=k.device), cu_seq_lens_k, window, ("window", window)
    k_cache, v_cache = _cache_tensors(cache, in_group, kv_dtype)
    for rows, new in ((k_cache, key), (v_cache, value)):
        new = new.transpose(1, 2).squeeze(0).to(rows.dtype)
        if rows.element_size() == 1:  # fp8: torch copies its bytes (index_copy_ has no fp8 kernels)
            rows, new = rows.view(torch.uint8), new.view(torch.uint8)
        rows.index_copy_(0, write, new)
    # A batch of prefills only reads nothing: its KV rows are the ones just written.
    # Each group of full layers has its own blocks, so its own tree.
    return k_cache, v_cache, read if read.numel() > 0 else write, cu_seq_lens_k, 0, ("group", group)


def _attend(module, query, key, value, cache, cu_seq_lens_q, cu_seq_lens_k, kwargs, strategy, block_tokens, rank, world,
            kv_dtype=None):
    """The batch's attention on this rank's share of the heads (all of them for
    world 1): [tokens, heads_q / world, head_dim_v]. Planned once per distinct
    window per forward pass (at the first layer of each; full layers once per
    cache group, whose blocks are their own), every other layer of the same window
    running that plan on its own cache."""
    if cache is None:
        raise ValueError(f"`{NAME}` needs transformers' paged cache: use it through continuous batching "
                         "(generate_batch), or another attention implementation for a plain forward")
    heads_q, heads_kv, head_dim = query.shape[1], key.shape[1], query.shape[3]
    if heads_q % world or heads_kv % world:
        raise ValueError(f"{heads_q} query heads and {heads_kv} KV heads do not split over {world} ranks")
    q_heads = slice(rank * heads_q // world, (rank + 1) * heads_q // world)
    kv_heads = slice(rank * heads_kv // world, (rank + 1) * heads_kv // world)
    scale, softcap, sinks = variant_arguments(module, kwargs.get("scaling"), kwargs.get("softcap"), kwargs.get("s_aux"))
    k_rows, v_rows, rows, cu_k, window, plan_key = _layer_rows(module, key, value, cache, cu_seq_lens_k, kwargs, kv_dtype)
    context = context_for(query)
    if module.layer_idx == min(cache.layer_index_to_group_indices) or id(cache) not in _step:
        _step[id(cache)] = {}
    plans = _step[id(cache)]
    if plan_key not in plans:
        global heads_seen
        heads_seen = (heads_q // world, heads_kv // world)
        tree = _packed_tree(rows, cu_k, cu_seq_lens_q, cache.block_size, heads_q // world, heads_kv // world,
                            head_dim, scale, value.shape[3])
        plans[plan_key] = context.plan(tree, strategy, block_tokens, window=window, kv_dtype=k_rows.dtype)
    if sinks is not None:
        sinks = sinks[q_heads].contiguous()
    out, _ = context.attention(plans[plan_key], query[0, q_heads].transpose(0, 1).contiguous(), k_rows[:, kv_heads],
                               v_rows[:, kv_heads], sinks=sinks, logit_softcap=softcap)
    return out


def paged_attention(module, query, key, value, attention_mask=None, cache=None, cu_seq_lens_q=None,
                    cu_seq_lens_k=None, strategy="flatten", **kwargs):
    """The attention function transformers calls: query [1, heads_q, tokens, head_dim],
    key and value [1, heads_kv, tokens, head_dim] of the batch's new tokens; returns
    ([1, tokens, heads_q, head_dim], None). Under transformers' tensor parallelism
    (tp_plan) the heads are the rank's own."""
    out = _attend(module, query, key, value, cache, cu_seq_lens_q, cu_seq_lens_k, kwargs, strategy, None, 0, 1)
    return out.unsqueeze(0), None


def fp8_paged_attention(module, query, key, value, attention_mask=None, cache=None, cu_seq_lens_q=None,
                        cu_seq_lens_k=None, strategy="flatten", **kwargs):
    """`paged|treeattn_fp8`: paged_attention with the full-attention layers' cache in
    float8_e4m3fn (half the bytes of f16; scales 1). The model runs in float16 or
    bfloat16 (treeattn takes fp8 K and V beside f16/bf16 Q)."""
    import torch

    if query.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"`{FP8_NAME}` needs a float16 or bfloat16 model (queries beside fp8 K and V); got {query.dtype}")
    out = _attend(module, query, key, value, cache, cu_seq_lens_q, cu_seq_lens_k, kwargs, strategy, None, 0, 1,
                  torch.float8_e4m3fn)
    return out.unsqueeze(0), None


def head_split_attention(module, query, key, value, attention_mask=None, cache=None, cu_seq_lens_q=None,
                         cu_seq_lens_k=None, strategy="flatten", **kwargs):
    """`paged|treeattn_heads`: the attention heads split over the ranks of
    torch.distributed's default group, every rank holding the whole model and
    cache (one rank without torch.distributed). Rank r runs treeattn on its
    share of the query heads and their KV heads, read in place from the cache,
    and the ranks all-gather the outputs over NCCL. Planned at a fixed block size
    (SPLIT_BLOCK_TOKENS), a rank's plan is the whole run's for its heads, so every
    head's output, and each token generated, is bit for bit the one-rank run's."""
    import torch
    import torch.distributed as dist

    split = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if split else (0, 1)
    out = _attend(module, query, key, value, cache, cu_seq_lens_q, cu_seq_lens_k, kwargs, strategy,
                  SPLIT_BLOCK_TOKENS, rank, world)
    if world > 1:
        gathered = torch.empty((world,) + tuple(out.shape), dtype=out.dtype, device=out.device)
        dist.all_gather_into_tensor(gathered, out)
        out = gathered.permute(1, 0, 2, 3).reshape(out.shape[0], world * out.shape[1], out.shape[2])
    return out.unsqueeze(0), None


def register(name=NAME, split_name=SPLIT_NAME, fp8_name=FP8_NAME):
    """Adds treeattn to transformers' AttentionInterface under `name`, the head
    split under `split_name` and the fp8 KV cache under `fp8_name` (`paged|` names,
    so continuous batching keeps them). Returns `name`."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, paged_attention)
    AttentionInterface.register(split_name, head_split_attention)
    AttentionInterface.register(fp8_name, fp8_paged_attention)
    return name

"""treeattn as an attention implementation of transformers' continuous batching.

    import treeattn.transformers_paged
    treeattn.transformers_paged.register()        # adds "paged|treeattn" to AttentionInterface
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="paged|treeattn")
    outputs = model.generate_batch(prompts, generation_config)

Continuous batching packs a step's requests into one varlen batch whose KV lives
in a paged cache, and (with block sharing) requests with a common prompt read the
same cache blocks. Each forward pass turns the cache's read indices into one tree:
requests whose rows begin alike share those nodes, and each new token is a query
that sees its request's rows up to itself. The tree is planned at the model's
first attention layer and every layer runs that plan on its own cache tensors.
The new keys and values are written into the cache first, as transformers' own
paged implementations do.

`paged|treeattn_heads` (registered beside it) splits the attention heads over the
ranks of torch.distributed's group, each holding the whole model: every rank runs
treeattn on its heads and the outputs are all-gathered, bit for bit the one-GPU run.
"""

from __future__ import annotations

from . import context_for
from .adapters import tree_from_block_tables, tree_from_packed_sequences

NAME = "paged|treeattn"
SPLIT_NAME = "paged|treeattn_heads"
SPLIT_BLOCK_TOKENS = 256  # the head split's block size: fixed, so a rank's plan does not depend on its share

_step = {}  # id(cache) -> the plan of the forward pass in progress
heads_seen = None  # (heads_q, heads_kv) of the last batch planned: a rank's own under tensor parallelism


def _packed_tree(rows, cu_seq_lens_k, cu_seq_lens_q, block_size, heads_q, heads_kv, head_dim, scale):
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
        return tree_from_packed_sequences(rows, cu_seq_lens_k, cu_seq_lens_q, heads_q, heads_kv, head_dim, scale)
    seq_lens = lengths.tolist()
    pages = page_of_block.tolist()
    table, at = [], 0
    for n in seq_lens:
        blocks = (n + block_size - 1) // block_size
        table.append(pages[at:at + blocks])
        at += blocks
    new_tokens = (cu_seq_lens_q[1:] - cu_seq_lens_q[:-1]).tolist()
    return tree_from_block_tables(table, seq_lens, block_size, heads_q, heads_kv, head_dim, scale, new_tokens)


def _attend(module, query, key, value, cache, cu_seq_lens_q, cu_seq_lens_k, kwargs, strategy, block_tokens, rank, world):
    """The batch's attention on this rank's share of the heads (all of them for
    world 1): [tokens, heads_q / world, head_dim]."""
    if cache is None:
        raise ValueError(f"`{NAME}` needs transformers' paged cache: use it through continuous batching "
                         "(generate_batch), or another attention implementation for a plain forward")
    group, in_group = cache.layer_index_to_group_indices[module.layer_idx]
    if cache.sliding_windows[module.layer_idx] != 1:
        raise ValueError(f"`{NAME}` runs full attention; layer {module.layer_idx} has a sliding window")
    read, write = kwargs["read_index"][group], kwargs["write_index"][group]
    if isinstance(cu_seq_lens_k, dict):
        cu_seq_lens_k = cu_seq_lens_k["full_attention"]
    k_cache, v_cache = cache.key_cache[in_group], cache.value_cache[in_group]
    k_cache.index_copy_(0, write, key.transpose(1, 2).squeeze(0))
    v_cache.index_copy_(0, write, value.transpose(1, 2).squeeze(0))

    heads_q, heads_kv, head_dim = query.shape[1], key.shape[1], query.shape[3]
    if heads_q % world or heads_kv % world:
        raise ValueError(f"{heads_q} query heads and {heads_kv} KV heads do not split over {world} ranks")
    q_heads = slice(rank * heads_q // world, (rank + 1) * heads_q // world)
    kv_heads = slice(rank * heads_kv // world, (rank + 1) * heads_kv // world)
    context = context_for(query)
    first_layer = min(cache.layer_index_to_group_indices)
    if module.layer_idx == first_layer or id(cache) not in _step:
        # A batch of prefills only reads nothing: its KV rows are the ones just written.
        rows = read if read.numel() > 0 else write
        global heads_seen
        heads_seen = (heads_q // world, heads_kv // world)
        tree = _packed_tree(rows, cu_seq_lens_k, cu_seq_lens_q, cache.block_size, heads_q // world, heads_kv // world,
                            head_dim, module.scaling)
        _step[id(cache)] = context.plan(tree, strategy, block_tokens)
    plan = _step[id(cache)]
    # The cache's heads are read in place: rows of the whole pool, strided.
    out, _ = context.attention(plan, query[0, q_heads].transpose(0, 1).contiguous(), k_cache[:, kv_heads],
                               v_cache[:, kv_heads])
    return out


def paged_attention(module, query, key, value, attention_mask=None, cache=None, cu_seq_lens_q=None,
                    cu_seq_lens_k=None, strategy="flatten", **kwargs):
    """The attention function transformers calls: query [1, heads_q, tokens, head_dim],
    key and value [1, heads_kv, tokens, head_dim] of the batch's new tokens; returns
    ([1, tokens, heads_q, head_dim], None). Under transformers' tensor parallelism
    (tp_plan) the heads are the rank's own."""
    out = _attend(module, query, key, value, cache, cu_seq_lens_q, cu_seq_lens_k, kwargs, strategy, None, 0, 1)
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


def register(name=NAME, split_name=SPLIT_NAME):
    """Adds treeattn to transformers' AttentionInterface under `name`, and the
    head split under `split_name` (`paged|` names, so continuous batching keeps
    them). Returns `name`."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, paged_attention)
    AttentionInterface.register(split_name, head_split_attention)
    return name

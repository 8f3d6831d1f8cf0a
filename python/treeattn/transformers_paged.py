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
"""

from __future__ import annotations

from . import Context
from .adapters import tree_from_packed_sequences

NAME = "paged|treeattn"

_contexts = {}  # (device type, index) -> Context
_step = {}  # id(cache) -> the plan of the forward pass in progress


def _context_for(tensor):
    device = tensor.device
    key = (device.type, device.index)
    if key not in _contexts:
        _contexts[key] = Context("cuda", device.index or 0) if device.type == "cuda" else Context("cpu")
    return _contexts[key]


def paged_attention(module, query, key, value, attention_mask=None, cache=None, cu_seq_lens_q=None,
                    cu_seq_lens_k=None, strategy="flatten", **kwargs):
    """The attention function transformers calls: query [1, heads_q, tokens, head_dim],
    key and value [1, heads_kv, tokens, head_dim] of the batch's new tokens; returns
    ([1, tokens, heads_q, head_dim], None)."""
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

    context = _context_for(query)
    first_layer = min(cache.layer_index_to_group_indices)
    if module.layer_idx == first_layer or id(cache) not in _step:
        # A batch of prefills only reads nothing: its KV rows are the ones just written.
        rows = read if read.numel() > 0 else write
        heads_q, head_dim = query.shape[1], query.shape[3]
        tree = tree_from_packed_sequences(rows, cu_seq_lens_k, cu_seq_lens_q, heads_q, key.shape[1], head_dim,
                                          scale=module.scaling)
        _step[id(cache)] = context.plan(tree, strategy)
    plan = _step[id(cache)]
    out, _ = context.attention(plan, query.squeeze(0).transpose(0, 1).contiguous(), k_cache, v_cache)
    return out.unsqueeze(0), None


def register(name=NAME):
    """Adds treeattn to transformers' AttentionInterface under `name` (a `paged|`
    name, so continuous batching keeps it)."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, paged_attention)
    return name

"""treeattn for token-tree verification in a transformers model's forward
(speculative decoding: Medusa, EAGLE, SpecInfer trees on a long prefix).

    import treeattn.transformers_tree as tt
    tt.register()                                   # adds "treeattn_tree" to AttentionInterface
    model.set_attn_implementation(tt.NAME)
    tree = tt.TokenTree(prefix_tokens=cache.get_seq_length(), parents=[-1, 0, 0, 1, ...])
    logits = model(draft_ids, past_key_values=cache, position_ids=tree.position_ids(device),
                   token_tree=tree).logits

The draft tokens follow the prefix in the cache; token i's parent is token
parents[i] (-1: the prefix). Token i attends the prefix and its own path in the
tree, so one forward pass scores every branch, and treeattn reads the prefix's
KV once for all of them. The tree is planned at the first layer of each forward.
"""

from __future__ import annotations

from . import Tree, context_for

NAME = "treeattn_tree"


class TokenTree:
    """The draft tokens of one verification step: parents[i] is token i's parent
    in the tree, -1 for the prefix, with parents before children."""

    def __init__(self, prefix_tokens, parents):
        self.prefix_tokens = int(prefix_tokens)
        self.parents = [int(p) for p in parents]
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"token {i}: parent {p} must be -1 (the prefix) or an earlier token")
        self.depth = []
        for p in self.parents:
            self.depth.append(0 if p < 0 else self.depth[p] + 1)
        self._plans = {}

    def position_ids(self, device=None):
        import torch

        return torch.tensor([[self.prefix_tokens + d for d in self.depth]], device=device)

    def tree(self, heads_q, heads_kv, head_dim, scale):
        """The treeattn tree: node 0 the prefix (cache rows 0..prefix-1), node i+1 token i (row prefix + i)."""
        tree = Tree(heads_q, heads_kv, head_dim, scale)
        if self.prefix_tokens > 0:
            tree.add_node_range(0, -1, 0, self.prefix_tokens)
        for i, p in enumerate(self.parents):
            parent = (0 if self.prefix_tokens > 0 else -1) if p < 0 else p + 1
            tree.add_node_range(i + 1, parent, self.prefix_tokens + i, 1)
            tree.add_query(i + 1)
        return tree

    def attention_mask(self, dtype, device=None):
        """The same visibility as a 4D additive mask [1, 1, tokens, prefix + tokens], for
        transformers' own attentions (a reference)."""
        import torch

        n, prefix = len(self.parents), self.prefix_tokens
        allowed = torch.zeros(n, prefix + n, dtype=torch.bool)
        allowed[:, :prefix] = True
        for i in range(n):
            j = i
            while j >= 0:
                allowed[i, prefix + j] = True
                j = self.parents[j]
        mask = torch.zeros(n, prefix + n, dtype=dtype)
        mask.masked_fill_(~allowed, torch.finfo(dtype).min)
        return mask[None, None].to(device)


def tree_attention(module, query, key, value, attention_mask=None, token_tree=None, strategy="flatten", **kwargs):
    """query [1, heads_q, tokens, head_dim]; key and value [1, heads_kv, prefix + tokens,
    head_dim] (the cache after this forward's tokens); returns ([1, tokens, heads_q, head_dim], None)."""
    if token_tree is None:
        raise ValueError(f"`{NAME}` needs the step's token_tree=TokenTree(...) passed to the model's forward")
    heads_q, tokens, head_dim = query.shape[1], query.shape[2], query.shape[3]
    if tokens != len(token_tree.parents) or key.shape[2] != token_tree.prefix_tokens + tokens:
        raise ValueError(f"`{NAME}`: {tokens} query tokens and {key.shape[2]} cached ones, but the token tree has "
                         f"{len(token_tree.parents)} tokens on a {token_tree.prefix_tokens}-token prefix")
    context = context_for(query)
    plan_key = (id(context), heads_q, key.shape[1])
    if plan_key not in token_tree._plans:
        token_tree._plans[plan_key] = context.plan(token_tree.tree(heads_q, key.shape[1], head_dim, module.scaling), strategy)
    k = key.squeeze(0).transpose(0, 1).contiguous()
    v = value.squeeze(0).transpose(0, 1).contiguous()
    out, _ = context.attention(token_tree._plans[plan_key], query.squeeze(0).transpose(0, 1).contiguous(), k, v)
    return out.unsqueeze(0), None


def register(name=NAME):
    """Adds tree verification to transformers' AttentionInterface under `name`."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, tree_attention)
    return name

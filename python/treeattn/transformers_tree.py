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
KV once for all of them.

Branches decoded together (many continuations of one prompt) keep their tokens in
one cache the same way: `PackedRequests(rows, new_tokens)` names each request's
cache rows in path order, and the last new_tokens[r] of them are this forward's
tokens, packed request by request (the cache must keep every row: a
DynamicCache() made without the model's config, whose sliding layers would drop
old rows). `GrowingRequests(rows, new_tokens)` is the same for a decode that goes
on: `step(new_rows)` before each later forward appends every request's new rows,
and the plans follow through a treeattn.Planner instead of a tree built again.

The model's attention features come through as transformers passes them:
`scaling`, a layer's `sliding_window` (planned once per distinct window per
forward: a model alternating windowed and full layers plans twice), gpt-oss's
sinks (`s_aux`, one logit per query head), Gemma 2's `softcap`, and values whose
head dim differs from the queries' (DeepSeek-V3's 192 / 128).
"""

from __future__ import annotations

from . import Tree, context_for
from .adapters import _list, _requests_layout

NAME = "treeattn_tree"


class _PlannedWhole:
    """A forward's token tree planned whole, once per context, heads, strategy and
    window: the layers that share them share the plan."""

    def plan(self, context, heads_q, heads_kv, head_dim, scale, head_dim_v, strategy, window):
        key = (id(context), heads_q, heads_kv, head_dim, head_dim_v, scale, strategy, window)
        if key not in self._plans:
            tree = self.tree(heads_q, heads_kv, head_dim, scale, head_dim_v)
            self._plans[key] = context.plan(tree, strategy, window=window)
        return self._plans[key]


class TokenTree(_PlannedWhole):
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

    @property
    def queries(self):
        return len(self.parents)

    @property
    def rows(self):
        return self.prefix_tokens + len(self.parents)

    def tree(self, heads_q, heads_kv, head_dim, scale, head_dim_v=None):
        """The treeattn tree: node 0 the prefix (cache rows 0..prefix-1), node i+1 token i (row prefix + i)."""
        tree = Tree(heads_q, heads_kv, head_dim, scale, head_dim_v)
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


class PackedRequests(_PlannedWhole):
    """Requests decoded together in one cache: request r's KV are the cache rows
    rows[r], in the order of its path (rows a set of requests begins with alike
    are their shared prefix, read once), and its last new_tokens[r] rows are this
    forward's tokens, packed request by request, each seeing its path up to itself."""

    def __init__(self, rows, new_tokens):
        # Kept as given (an array's values as ints): a step of 16 requests on a long prompt
        # holds 32 000 rows, not converted one by one.
        self.request_rows = [_list(r) for r in rows]
        self.new_tokens = [int(n) for n in new_tokens]
        if len(self.request_rows) != len(self.new_tokens):
            raise ValueError(f"{len(self.request_rows)} requests' rows but {len(self.new_tokens)} new-token counts")
        for r, (keys, n) in enumerate(zip(self.request_rows, self.new_tokens)):
            if not 1 <= n <= len(keys):
                raise ValueError(f"request {r}: {n} new tokens but {len(keys)} rows")
        self.rows = 1 + max(map(max, self.request_rows))
        self._trees = {}
        self._plans = {}

    @property
    def queries(self):
        return sum(self.new_tokens)

    def position_ids(self, device=None):
        """Each new token's position in its request's path, [1, queries]."""
        import torch

        return torch.tensor([[len(keys) - n + j for keys, n in zip(self.request_rows, self.new_tokens) for j in range(n)]],
                            device=device)

    def tree(self, heads_q, heads_kv, head_dim, scale, head_dim_v=None):
        """The treeattn tree, built once per head configuration (a model alternating
        windowed and full layers plans it twice, one tree)."""
        key = (heads_q, heads_kv, head_dim, scale, head_dim_v)
        if key not in self._trees:
            self._trees[key] = _requests_layout(self.request_rows, self.new_tokens, heads_q, heads_kv, head_dim, scale,
                                                head_dim_v).tree
        return self._trees[key]


class GrowingRequests:
    """PackedRequests that go on decoding: after the first forward (rows and
    new_tokens as PackedRequests'), step(new_rows) appends each request's rows of
    the next forward, its new tokens, to its path. Each distinct window's plan
    follows the requests through a treeattn.Planner (Context.planner), which takes
    the step's appended rows instead of a tree built again from every row of every
    request. A request that shares its last node with another, or ends inside
    another's path, goes on in a node of its own."""

    def __init__(self, rows, new_tokens):
        self._first = PackedRequests(rows, new_tokens)
        self.new_tokens = list(self._first.new_tokens)
        self.rows = self._first.rows
        self._lengths = [len(keys) for keys in self._first.request_rows]
        self._steps = []  # each step's appended rows, by request
        self._followers = {}  # plan key -> _Follower

    @property
    def queries(self):
        return sum(self.new_tokens)

    def position_ids(self, device=None):
        """Each new token's position in its request's path, [1, queries]."""
        import torch

        return torch.tensor([[length - n + j for length, n in zip(self._lengths, self.new_tokens) for j in range(n)]],
                            device=device)

    def step(self, new_rows):
        """The next forward: new_rows[r], request r's new cache rows in path order, its
        queries, packed request by request; none for a request that has finished or
        waits (its rows stay, read by no query of the step)."""
        added = [_list(rows) for rows in new_rows]
        if len(added) != len(self._lengths):
            raise ValueError(f"{len(added)} requests' new rows but {len(self._lengths)} requests")
        if not any(added):
            raise ValueError("no request has new rows: a step needs a query")
        self._steps.append(added)
        self.new_tokens = [len(rows) for rows in added]
        self._lengths = [length + len(rows) for length, rows in zip(self._lengths, added)]
        self.rows = max(self.rows, 1 + max(max(rows) for rows in added if rows))

    def plan(self, context, heads_q, heads_kv, head_dim, scale, head_dim_v, strategy, window):
        key = (id(context), heads_q, heads_kv, head_dim, head_dim_v, scale, strategy, window)
        follower = self._followers.get(key)
        if follower is None:
            first = self._first
            layout = _requests_layout(first.request_rows, first.new_tokens, heads_q, heads_kv, head_dim, scale,
                                      head_dim_v)
            follower = self._followers[key] = _Follower(context.planner(layout.tree, strategy, window=window), layout)
        return follower.plan_at(self._steps, self.new_tokens)


class _Follower:
    """One plan key's Planner over GrowingRequests, and where each request is in its tree."""

    def __init__(self, planner, layout):
        self.planner = planner
        self.node = list(layout.request_node)  # by request
        self.length = list(layout.node_length)  # by node id
        self.open = set(layout.open)  # nodes one request grows in place
        self.applied = 0  # steps the planner has
        self.plan = None

    def plan_at(self, steps, new_tokens):
        """The plan after `steps`, whose last one queries new_tokens[r] tokens of request r."""
        if self.plan is not None and self.applied == len(steps):
            return self.plan
        for added in steps[self.applied:]:
            for r, rows in enumerate(added):
                node = self.node[r]
                if not rows:
                    continue
                if node in self.open:
                    for row in rows:
                        self.planner.append_range(node, row, 1)
                    self.length[node] += len(rows)
                else:
                    self.node[r] = len(self.length)
                    self.planner.add_node(self.node[r], node, rows)
                    self.length.append(len(rows))
                    self.open.add(self.node[r])
        if self.applied < len(steps):
            queries = []
            for node, n in zip(self.node, new_tokens):
                length = self.length[node]
                queries.extend((node, None if j == n - 1 else length - n + j + 1) for j in range(n))
            self.planner.set_queries(queries)
            self.applied = len(steps)
        self.plan = self.planner.update()
        return self.plan


def variant_arguments(module, scaling, softcap, s_aux):
    """The scale, soft-cap and sinks of a layer as transformers passes them to an
    attention function: `scaling` (else the module's), Gemma 2's `softcap`, and
    gpt-oss's sinks (`s_aux`, one logit per query head) as float32."""
    scale = module.scaling if scaling is None else float(scaling)
    return scale, softcap or None, None if s_aux is None else s_aux.detach().float().contiguous()


def tree_attention(module, query, key, value, attention_mask=None, token_tree=None, strategy="flatten", scaling=None,
                   sliding_window=None, softcap=None, s_aux=None, **kwargs):
    """query [1, heads_q, tokens, head_dim]; key [1, heads_kv, rows, head_dim] and value
    [1, heads_kv, rows, head_dim_v] (the cache after this forward's tokens); returns
    ([1, tokens, heads_q, head_dim_v], None)."""
    if token_tree is None:
        raise ValueError(f"`{NAME}` needs the step's token_tree=TokenTree(...), PackedRequests(...) or "
                         "GrowingRequests(...) passed to the model's forward")
    heads_q, tokens, head_dim = query.shape[1], query.shape[2], query.shape[3]
    if tokens != token_tree.queries or key.shape[2] < token_tree.rows:
        raise ValueError(f"`{NAME}`: {tokens} query tokens and {key.shape[2]} cached rows, but the step's tree has "
                         f"{token_tree.queries} queries on {token_tree.rows} rows (a cache that drops rows, as a "
                         "sliding layer's does, cannot hold a tree: make it without the model's config)")
    scale, softcap, sinks = variant_arguments(module, scaling, softcap, s_aux)
    context = context_for(query)
    plan = token_tree.plan(context, heads_q, key.shape[1], head_dim, scale, value.shape[3], strategy,
                           sliding_window or 0)
    k = key.squeeze(0).transpose(0, 1).contiguous()
    v = value.squeeze(0).transpose(0, 1).contiguous()
    out, _ = context.attention(plan, query.squeeze(0).transpose(0, 1).contiguous(), k, v, sinks=sinks,
                               logit_softcap=softcap)
    return out.unsqueeze(0), None


def register(name=NAME):
    """Adds tree verification to transformers' AttentionInterface under `name`."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, tree_attention)
    return name

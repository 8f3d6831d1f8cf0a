"""Trees from the KV layouts serving engines keep.

A batch of requests whose prompts share KV becomes one tree without the caller
describing it: the requests' pages (vLLM's block tables) or slots (SGLang's
req_to_token) go into a trie, and every run that a set of requests shares
becomes one node. Request r gets query r, on the node where its sequence ends,
seeing its whole sequence. Every function takes head_dim_v, the value head dim
where it differs from the query/key head_dim (None: the same).
"""

from __future__ import annotations

from ._core import Tree


class _TrieNode:
    __slots__ = ("children", "key", "ends")

    def __init__(self, key):
        self.children = {}
        self.key = key
        self.ends = []  # requests whose sequence ends here


def _list(values):
    """A Python list of an array's values (numpy, torch, a list)."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _rows(table, lengths, what):
    rows = table.tolist() if hasattr(table, "tolist") else [list(row) for row in table]
    lens = [int(n) for n in _list(lengths)]
    if len(rows) != len(lens):
        raise ValueError(f"{what}: {len(rows)} rows but {len(lens)} sequence lengths")
    for r, n in enumerate(lens):
        if n <= 0:
            raise ValueError(f"{what}: request {r} has length {n}; each needs at least one token")
    return rows, lens


def _tree(units, heads_q, heads_kv, head_dim, scale, head_dim_v, add_node, queries=None, tokens=None):
    """The tree of the requests' `units` (lists of keys), merged by common leading
    keys; add_node(tree, id, parent, keys) adds a node of a run of keys; tokens(key)
    is how many tokens a key holds (default 1). Request r has `queries[r]` queries
    (default 1) on its last tokens, causal: its j-th of n sees its first
    total - n + j + 1 tokens."""
    weight = tokens or (lambda key: 1)
    roots = {}
    for r, keys in enumerate(units):
        children, node = roots, None
        for key in keys:
            node = children.get(key)
            if node is None:
                node = children[key] = _TrieNode(key)
            children = node.children
        node.ends.append(r)

    tree = Tree(heads_q, heads_kv, head_dim, scale, head_dim_v)
    query_node = [0] * len(units)
    start = []  # keys before each node on its path, and its own
    length = []
    next_id = 0
    stack = [(node, -1) for node in reversed(list(roots.values()))]
    while stack:
        node, parent = stack.pop()
        keys = [node.key]
        # A chain that no request ends inside and that does not branch is one node.
        while not node.ends and len(node.children) == 1:
            node = next(iter(node.children.values()))
            keys.append(node.key)
        add_node(tree, next_id, parent, keys)
        start.append(0 if parent < 0 else start[parent] + length[parent])
        length.append(sum(weight(key) for key in keys))
        for r in node.ends:
            query_node[r] = next_id
        stack.extend((child, next_id) for child in reversed(list(node.children.values())))
        next_id += 1
    for r, node_id in enumerate(query_node):
        n = 1 if queries is None else queries[r]
        if n > length[node_id]:
            raise ValueError(f"request {r}: {n} queries but its last {length[node_id]} tokens are its own")
        total = start[node_id] + length[node_id]
        for j in range(n):
            upto = total - n + j + 1 - start[node_id]
            tree.add_query(node_id, None if upto == length[node_id] else upto)
    return tree


def _add_slots(tree, node_id, parent, slots):
    tree.add_node(node_id, parent, slots)


def tree_from_block_tables(block_table, seq_lens, page_size, heads_q, heads_kv, head_dim, scale=None, new_tokens=None,
                           head_dim_v=None):
    """A tree from vLLM-style paging: request r's token t lives in KV slot
    block_table[r][t // page_size] * page_size + t % page_size, for t < seq_lens[r].
    Requests that begin with the same pages share them as one node, given to the
    tree as its pages (never expanded to slots here). Request r is one query seeing
    its whole sequence, or with `new_tokens`, new_tokens[r] queries (its last tokens,
    a prefill chunk; rows in request order), each seeing its sequence up to itself."""
    if page_size <= 0:
        raise ValueError(f"page_size {page_size} must be positive")
    rows, lens = _rows(block_table, seq_lens, "block_table")
    units = []
    for r, (row, n) in enumerate(zip(rows, lens)):
        pages = (n + page_size - 1) // page_size
        if pages > len(row):
            raise ValueError(f"block_table: request {r} has {n} tokens, {pages} pages, but {len(row)} table entries")
        keys = []
        for p in range(pages):
            page, tokens = int(row[p]), min(page_size, n - p * page_size)
            if page < 0:
                raise ValueError(f"block_table: request {r}, page {p} is {page}")
            # The key holds the tokens used: a partly filled page is not the full page of another
            # request (and, filled in order, it only ever ends a run).
            keys.append((page, tokens))
        units.append(keys)

    def add_pages(tree, node_id, parent, keys):
        tree.add_node_pages(node_id, parent, [page for page, _ in keys], page_size, keys[-1][1])

    queries = None if new_tokens is None else [int(n) for n in _list(new_tokens)]
    return _tree(units, heads_q, heads_kv, head_dim, scale, head_dim_v, add_pages, queries, tokens=lambda key: key[1])


def tree_from_token_tables(req_to_token, seq_lens, heads_q, heads_kv, head_dim, scale=None, req_pool_indices=None,
                           head_dim_v=None):
    """A tree from SGLang-style token tables: request r's token t lives in KV slot
    req_to_token[req_pool_indices[r]][t] (req_pool_indices defaults to 0, 1, 2, ...)
    for t < seq_lens[r]. Requests that begin with the same slots share them."""
    table = req_to_token.tolist() if hasattr(req_to_token, "tolist") else [list(row) for row in req_to_token]
    if req_pool_indices is not None:
        table = [table[int(i)] for i in _list(req_pool_indices)]
    rows, lens = _rows(table, seq_lens, "req_to_token")
    units = []
    for r, (row, n) in enumerate(zip(rows, lens)):
        if n > len(row):
            raise ValueError(f"req_to_token: request {r} has {n} tokens but its row holds {len(row)}")
        units.append([int(slot) for slot in row[:n]])
    return _tree(units, heads_q, heads_kv, head_dim, scale, head_dim_v, _add_slots)


def tree_from_packed_sequences(rows, cu_seq_lens_k, cu_seq_lens_q, heads_q, heads_kv, head_dim, scale=None,
                               head_dim_v=None):
    """A tree from a packed (varlen) batch, as continuous batching lays it out:
    request r's KV tokens are the cache rows rows[cu_seq_lens_k[r]:cu_seq_lens_k[r+1]]
    in order, and its last cu_seq_lens_q[r+1] - cu_seq_lens_q[r] tokens are new, one
    query each (row cu_seq_lens_q[r] + j of Q), causal. Requests that begin with the
    same rows share them (prefix sharing)."""
    flat, cu_k, cu_q = ([int(x) for x in _list(a)] for a in (rows, cu_seq_lens_k, cu_seq_lens_q))
    if len(cu_k) != len(cu_q):
        raise ValueError(f"cu_seq_lens_k has {len(cu_k)} entries, cu_seq_lens_q {len(cu_q)}")
    if cu_k[-1] > len(flat):
        raise ValueError(f"cu_seq_lens_k ends at {cu_k[-1]} but there are {len(flat)} rows")
    units = [flat[cu_k[r]:cu_k[r + 1]] for r in range(len(cu_k) - 1)]
    queries = [cu_q[r + 1] - cu_q[r] for r in range(len(cu_q) - 1)]
    for r, (keys, n) in enumerate(zip(units, queries)):
        if n < 1 or n > len(keys):
            raise ValueError(f"request {r}: {n} new tokens but {len(keys)} KV tokens")
    return _tree(units, heads_q, heads_kv, head_dim, scale, head_dim_v, _add_slots, queries)

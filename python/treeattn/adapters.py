"""Trees from the KV layouts serving engines keep.

A batch of requests whose prompts share KV becomes one tree without the caller
describing it: the requests' pages (vLLM's block tables) or slots (SGLang's
req_to_token) go into a trie, and every run that a set of requests shares
becomes one node. Request r gets query r, on the node where its sequence ends,
seeing its whole sequence. Every function takes head_dim_v, the value head dim
where it differs from the query/key head_dim (None: the same).
"""

from __future__ import annotations

from typing import NamedTuple

from ._core import Tree


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


def _common_prefix(a, b):
    """How many leading keys the lists a and b share: slices compared at C speed,
    the mismatch found by halving."""
    hi = min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    lo = 0  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class _Run:
    """A node of the trie: keys [start, end) of request `owner`'s list."""
    __slots__ = ("owner", "start", "end", "children", "ends", "first")

    def __init__(self, owner, start, end, first):
        self.owner, self.start, self.end = owner, start, end
        self.children = []
        self.ends = []  # requests whose sequence ends here
        self.first = first  # the smallest request index below it: children are sorted by it once the trie is built


class _Layout(NamedTuple):
    """A tree of requests and where they are in it: request_node[r], the node request r
    ends on; node_length[id], each node's tokens; and `open`, the leaf nodes where one
    request alone ends (it may grow them in place)."""
    tree: Tree
    request_node: list
    node_length: list
    open: set


def _tree(units, heads_q, heads_kv, head_dim, scale, head_dim_v, add_node, queries=None, tokens=None):
    """_layout's tree."""
    return _layout(units, heads_q, heads_kv, head_dim, scale, head_dim_v, add_node, queries, tokens).tree


def _layout(units, heads_q, heads_kv, head_dim, scale, head_dim_v, add_node, queries=None, tokens=None):
    """The tree of the requests' `units` (lists of keys), merged by common leading
    keys; add_node(tree, id, parent, keys) adds a node of a run of keys; tokens(key)
    is how many tokens a key holds (default 1). Request r has `queries[r]` queries
    (default 1) on its last tokens, causal: its j-th of n sees its first
    total - n + j + 1 tokens.

    The requests are sorted, so those sharing a prefix are neighbours and the
    trie follows from each one's common prefix with the one before: its nodes
    are runs of keys, cut where requests part or end (a run no request ends
    inside and that does not branch is one node). Nodes are numbered depth
    first, children in the order of their first request."""
    order = sorted(range(len(units)), key=units.__getitem__)
    root = _Run(-1, 0, 0, -1)
    path = [root]  # the previous request's nodes, root first
    for i, r in enumerate(order):
        keys = units[r]
        shared = _common_prefix(units[order[i - 1]], keys) if i > 0 else 0
        while path[-1].start >= shared and len(path) > 1:
            path.pop()
        top = path[-1]
        if top.end > shared:  # the request parts inside top: cut it where
            below = _Run(top.owner, shared, top.end, top.first)
            below.children, below.ends, top.children, top.ends = top.children, top.ends, [below], []
            top.end = shared
        if len(keys) > shared:
            node = _Run(r, shared, len(keys), r)
            top.children.append(node)
            path.append(node)
            node.ends.append(r)
        else:
            top.ends.append(r)
    # Children in the order of their first request; each node's own smallest request below it.
    for node in reversed(_preorder(root)):
        for child in node.children:
            node.first = child.first if node.first < 0 else min(node.first, child.first)
        node.children.sort(key=lambda child: child.first)

    tree = Tree(heads_q, heads_kv, head_dim, scale, head_dim_v)
    query_node = [0] * len(units)
    start = []  # tokens before each node on its path
    length = []
    open_nodes = set()
    stack = [(child, -1) for child in reversed(root.children)]
    next_id = 0
    while stack:
        node, parent = stack.pop()
        keys = units[node.owner][node.start:node.end]
        add_node(tree, next_id, parent, keys)
        start.append(0 if parent < 0 else start[parent] + length[parent])
        length.append(len(keys) if tokens is None else sum(map(tokens, keys)))
        for r in node.ends:
            query_node[r] = next_id
        if not node.children and len(node.ends) == 1:
            open_nodes.add(next_id)
        stack.extend((child, next_id) for child in reversed(node.children))
        next_id += 1
    for r, node_id in enumerate(query_node):
        n = 1 if queries is None else queries[r]
        if n > length[node_id]:
            raise ValueError(f"request {r}: {n} queries but its last {length[node_id]} tokens are its own")
        total = start[node_id] + length[node_id]
        for j in range(n):
            upto = total - n + j + 1 - start[node_id]
            tree.add_query(node_id, None if upto == length[node_id] else upto)
    return _Layout(tree, query_node, length, open_nodes)


def _preorder(root):
    nodes, stack = [], [root]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children)
    return nodes


def _add_slots(tree, node_id, parent, slots):
    tree.add_node(node_id, parent, list(map(int, slots)))


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
    flat, cu_k, cu_q = (list(map(int, _list(a))) for a in (rows, cu_seq_lens_k, cu_seq_lens_q))
    if len(cu_k) != len(cu_q):
        raise ValueError(f"cu_seq_lens_k has {len(cu_k)} entries, cu_seq_lens_q {len(cu_q)}")
    if cu_k[-1] > len(flat):
        raise ValueError(f"cu_seq_lens_k ends at {cu_k[-1]} but there are {len(flat)} rows")
    units = [flat[cu_k[r]:cu_k[r + 1]] for r in range(len(cu_k) - 1)]
    queries = [cu_q[r + 1] - cu_q[r] for r in range(len(cu_q) - 1)]
    for r, (keys, n) in enumerate(zip(units, queries)):
        if n < 1 or n > len(keys):
            raise ValueError(f"request {r}: {n} new tokens but {len(keys)} KV tokens")
    return _requests_layout(units, queries, heads_q, heads_kv, head_dim, scale, head_dim_v).tree


def _requests_layout(rows, new_tokens, heads_q, heads_kv, head_dim, scale=None, head_dim_v=None):
    """The tree of requests given as lists of KV rows (ints, in path order), request
    r's last new_tokens[r] (at least 1, at most its rows) one query each, causal:
    tree_from_packed_sequences without the packing, for callers that hold them so;
    with where each request ends in it (_Layout)."""
    return _layout(rows, heads_q, heads_kv, head_dim, scale, head_dim_v, _add_slots, new_tokens)

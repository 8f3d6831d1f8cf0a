"""Trees from serving engines' KV tables: shared prefixes found without the caller
describing them, and attention over the tree equal to each request's own sequence."""

import numpy as np
import pytest

import treeattn
from conftest import reference_attention


def errors_against_sequences(rng, tree, paths, slots, dtype=np.float32):
    """The largest O and LSE errors of attention over `tree` (heads 8/2/64, CPU) on
    random inputs, against each query's own sequence of slots (`paths`)."""
    q = rng.uniform(-1, 1, (len(paths), 8, 64)).astype(dtype)
    k = rng.uniform(-1, 1, (slots, 2, 64)).astype(dtype)
    v = rng.uniform(-1, 1, (slots, 2, 64)).astype(dtype)
    ctx = treeattn.Context("cpu")
    o, lse = ctx.attention(ctx.plan(tree), q, k, v)
    want_o, want_lse = reference_attention(q, k, v, paths, 1 / 8)
    return np.abs(o.astype(np.float64) - want_o).max(), np.abs(lse - want_lse).max()


def test_block_tables_share_their_common_pages(rng):
    page = 4
    # Requests 0 and 1 share pages 7 and 3 (8 tokens); request 2 shares page 7 only; 3 stands alone.
    block_table = np.array([[7, 3, 5, 0], [7, 3, 9, 2], [7, 6, 0, 0], [1, 0, 0, 0]])
    seq_lens = np.array([11, 14, 6, 3])
    tree = treeattn.tree_from_block_tables(block_table, seq_lens, page, 8, 2, 64)
    assert tree.num_queries == 4
    # Nodes: [7], [3] (shared by 0 and 1), [5 (3 tokens)], [9, 2 (2 tokens)], [6 (2 tokens)], [1 (3 tokens)].
    assert tree.num_nodes == 6
    paths = [[int(block_table[r][t // page]) * page + t % page for t in range(n)] for r, n in enumerate(seq_lens)]
    o_error, lse_error = errors_against_sequences(rng, tree, paths, 40, np.float16)
    assert o_error <= 2e-3
    assert lse_error <= 2e-3


def test_a_request_that_ends_inside_anothers_prefix_queries_there():
    # Request 1's 4 tokens are request 0's first page: it ends where 0 goes on.
    tree = treeattn.tree_from_block_tables([[2, 5], [2, 0]], [7, 4], 4, 4, 4, 64)
    assert (tree.num_nodes, tree.num_queries) == (2, 2)


def test_token_tables_share_their_common_slots(rng):
    req_to_token = np.zeros((5, 64), dtype=np.int32)
    prompt = np.arange(100, 140)
    req_to_token[2, :40], req_to_token[2, 40:45] = prompt, np.arange(200, 205)
    req_to_token[4, :40], req_to_token[4, 40:43] = prompt, np.arange(300, 303)
    req_to_token[0, :10] = np.arange(400, 410)
    tree = treeattn.tree_from_token_tables(req_to_token, [45, 43, 10], 8, 2, 64, req_pool_indices=[2, 4, 0])
    assert (tree.num_nodes, tree.num_queries) == (4, 3)  # the prompt, two continuations, the lone request
    paths = [list(prompt) + list(range(200, 205)), list(prompt) + list(range(300, 303)), list(range(400, 410))]
    o_error, _ = errors_against_sequences(rng, tree, paths, 410)
    assert o_error <= 1e-5


def test_bad_tables_are_refused_by_request():
    with pytest.raises(ValueError, match="request 1 has 9 tokens, 3 pages, but 2 table entries"):
        treeattn.tree_from_block_tables([[1, 2], [3, 4]], [5, 9], 4, 8, 2, 64)
    with pytest.raises(ValueError, match="request 0 has length 0"):
        treeattn.tree_from_block_tables([[1]], [0], 4, 8, 2, 64)
    with pytest.raises(ValueError, match="2 rows but 1 sequence lengths"):
        treeattn.tree_from_token_tables([[1], [2]], [1], 8, 2, 64)


def test_the_shared_prompts_example_runs():
    import pathlib
    import subprocess
    import sys

    example = pathlib.Path(__file__).parents[2] / "examples" / "python" / "shared_prompts.py"
    done = subprocess.run([sys.executable, str(example), "--prompt", "300", "--requests", "3", "--generated", "9"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "3 requests: a tree of 4 nodes" in done.stdout
    error = float(done.stdout.rsplit("max abs error ", 1)[1])
    assert error <= 2e-3


def test_packed_batches_share_prefixes_and_query_causally(rng):
    # Continuous batching's varlen layout: request 0 prefills 3 new tokens after a
    # 6-token prompt it shares with request 1, which decodes one token.
    prompt = [50, 51, 52, 53, 54, 55]
    rows = prompt + [60, 61, 62] + prompt + [70, 71, 72, 73]
    cu_k, cu_q = [0, 9, 19], [0, 3, 4]
    tree = treeattn.tree_from_packed_sequences(np.array(rows), np.array(cu_k), np.array(cu_q), 8, 2, 64)
    assert (tree.num_nodes, tree.num_queries) == (3, 4)  # the prompt and two continuations; 3 + 1 queries
    # Query j of a request sees its rows up to its own token.
    paths = [prompt + [60], prompt + [60, 61], prompt + [60, 61, 62], prompt + [70, 71, 72, 73]]
    o_error, lse_error = errors_against_sequences(rng, tree, paths, 80)
    assert o_error <= 1e-5
    assert lse_error <= 1e-5


def test_bad_packed_batches_are_refused_by_request():
    with pytest.raises(ValueError, match="request 1: 3 new tokens but 2 KV tokens"):
        treeattn.tree_from_packed_sequences([1, 2, 3, 4], [0, 2, 4], [0, 1, 4], 8, 2, 64)
    with pytest.raises(ValueError, match="cu_seq_lens_k ends at 9 but there are 4 rows"):
        treeattn.tree_from_packed_sequences([1, 2, 3, 4], [0, 9], [0, 1], 8, 2, 64)


def test_block_tables_with_new_tokens_query_causally(rng):
    # Request 0: 10 tokens on pages 3, 1, 4 (page size 4), its last 3 new (a prefill
    # chunk); request 1 shares page 3 and decodes its 6th token.
    tree = treeattn.tree_from_block_tables([[3, 1, 4], [3, 2, 0]], [10, 6], 4, 8, 2, 64, new_tokens=[3, 1])
    assert (tree.num_nodes, tree.num_queries) == (3, 4)
    slots0 = [3 * 4 + t for t in range(4)] + [1 * 4 + t for t in range(4)] + [16, 17]
    slots1 = [12, 13, 14, 15, 8, 9]
    paths = [slots0[:8], slots0[:9], slots0[:10], slots1]
    o_error, _ = errors_against_sequences(rng, tree, paths, 20)
    assert o_error <= 1e-5


def compacted_trie_nodes(sequences):
    """The nodes a tree of `sequences` needs: every prefix at which one of them
    ends or two of them part (a run that neither ends nor branches is one node)."""
    prefixes = {tuple(s[:n]) for s in sequences for n in range(1, len(s) + 1)}
    ends = {tuple(s) for s in sequences}
    following = {}
    for p in prefixes:
        following.setdefault(p[:-1], set()).add(p[-1])
    return sum(1 for p in prefixes if p in ends or len(following.get(p, ())) > 1)


def test_requests_in_any_order_share_every_common_prefix(rng):
    # Requests that repeat one another, end inside one another, or part anywhere,
    # given in any order: one node per run, and each query sees its own sequence.
    for case in range(40):
        stem = list(rng.integers(0, 60, 12))
        sequences = []
        for r in range(int(rng.integers(1, 9))):
            kind = rng.integers(0, 3)
            if kind == 0 and sequences:
                s = list(sequences[int(rng.integers(0, len(sequences)))])
            elif kind == 1 and sequences:
                other = sequences[int(rng.integers(0, len(sequences)))]
                s = other[:int(rng.integers(1, len(other) + 1))]
            else:
                s = stem[:int(rng.integers(0, len(stem) + 1))]
            s = s + list(rng.integers(60, 120, int(rng.integers(0 if s else 1, 4))))
            sequences.append([int(x) for x in s])
        lengths = [len(s) for s in sequences]
        table = [s + [0] * (16 - len(s)) for s in sequences]
        tree = treeattn.tree_from_token_tables(table, lengths, 8, 2, 64)
        assert tree.num_nodes == compacted_trie_nodes(sequences), f"case {case}: {sequences}"
        assert tree.num_queries == len(sequences)
        o_error, lse_error = errors_against_sequences(rng, tree, sequences, 120)
        assert o_error <= 1e-5 and lse_error <= 1e-5, f"case {case}: {sequences}"

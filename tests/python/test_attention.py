"""The package on host arrays (numpy, the CPU backend): every strategy against an
fp64 reference, outputs and dtypes, tree files, errors that name the problem; and,
where torch or cupy and a GPU are there, CUDA arrays on the caller's stream."""

import json

import numpy as np
import pytest

import treeattn
from conftest import reference_attention

HEADS = (8, 2, 64)


def fewshot_tree():
    """A 300-token prompt, three branches (one of listed slots), a causal draft query."""
    tree = treeattn.Tree(*HEADS)
    tree.add_node_range(10, -1, 0, 300)
    tree.add_node_range(11, 10, 300, 16)
    tree.add_node(12, 10, np.arange(330, 310, -1))
    tree.add_node_range(13, 12, 340, 8)
    tree.add_query(11)
    tree.add_query(12)
    tree.add_query(13, upto=3)
    paths = [
        list(range(316)),
        list(range(300)) + list(range(330, 310, -1)),
        list(range(300)) + list(range(330, 310, -1)) + [340, 341, 342],
    ]
    return tree, paths


def inputs(rng, dtype, nq=3, slots=350):
    hq, hkv, d = HEADS
    return (rng.uniform(-1, 1, (nq, hq, d)).astype(dtype), rng.uniform(-1, 1, (slots, hkv, d)).astype(dtype),
            rng.uniform(-1, 1, (slots, hkv, d)).astype(dtype))


@pytest.mark.parametrize("strategy", ["flatten", "node", "node_chunk", "sequence", "cascade", "greedy"])
@pytest.mark.parametrize("block_tokens", [None, 32])
def test_every_strategy_matches_the_reference(rng, strategy, block_tokens):
    tree, paths = fewshot_tree()
    ctx = treeattn.Context("cpu", threads=2)
    plan = ctx.plan(tree, strategy=strategy, block_tokens=block_tokens)
    assert plan.num_queries == 3 and plan.strategy == strategy
    q, k, v = inputs(rng, np.float16)
    o, lse = ctx.attention(plan, q, k, v)
    want_o, want_lse = reference_attention(q, k, v, paths, 1 / np.sqrt(HEADS[2]))
    assert o.dtype == np.float16 and lse.dtype == np.float32
    assert np.abs(o.astype(np.float64) - want_o).max() <= 2e-3
    assert np.abs(lse - want_lse).max() <= 2e-3


@pytest.mark.parametrize("strategy", ["flatten", "node", "node_chunk", "sequence", "cascade", "greedy"])
@pytest.mark.parametrize("window", [1, 40, 310])
def test_sliding_windows_match_the_reference(rng, strategy, window):
    tree, paths = fewshot_tree()
    ctx = treeattn.Context("cpu", threads=2)
    plan = ctx.plan(tree, strategy=strategy, block_tokens=32, window=window)
    q, k, v = inputs(rng, np.float16)
    o, lse = ctx.attention(plan, q, k, v)
    want_o, want_lse = reference_attention(q, k, v, [path[-window:] for path in paths], 1 / np.sqrt(HEADS[2]))
    assert np.abs(o.astype(np.float64) - want_o).max() <= 2e-3
    assert np.abs(lse - want_lse).max() <= 2e-3


def test_a_negative_window_raises_a_value_error_naming_it():
    tree, _ = fewshot_tree()
    ctx = treeattn.Context("cpu")
    with pytest.raises(ValueError, match="window = -1 is negative"):
        ctx.plan(tree, window=-1)
    with pytest.raises(ValueError, match="window = -1 is negative"):
        ctx.planner(tree, window=-1)


def test_caller_outputs_f32_inputs_and_a_custom_scale(rng):
    tree = treeattn.Tree(*HEADS, scale=0.05)
    tree.add_node_range(0, -1, 0, 120)
    tree.add_query(0)
    ctx = treeattn.Context("cpu")
    q, k, v = inputs(rng, np.float32, nq=1, slots=120)
    out = np.full((1, 8, 64), np.nan, dtype=np.float32)
    lse = np.zeros((1, 8), dtype=np.float32)
    got_o, got_lse = ctx.attention(ctx.plan(tree), q, k, v, out=out, lse=lse)
    assert got_o is out and got_lse is lse
    want_o, want_lse = reference_attention(q, k, v, [list(range(120))], 0.05)
    assert np.abs(out - want_o).max() <= 1e-5
    assert np.abs(lse - want_lse).max() <= 1e-5


def test_deterministic_run_after_run(rng):
    tree, _ = fewshot_tree()
    ctx = treeattn.Context("cpu", threads=3)
    plan = ctx.plan(tree, block_tokens=32)
    q, k, v = inputs(rng, np.float16)
    first, _ = ctx.attention(plan, q, k, v)
    for _ in range(3):
        again, _ = ctx.attention(plan, q, k, v)
        assert np.array_equal(first.view(np.uint16), again.view(np.uint16))


def test_trees_from_json_path_text_and_dict(tmp_path):
    text = json.dumps({"heads_q": 8, "heads_kv": 2, "head_dim": 64,
                       "nodes": [{"id": 0, "parent": -1, "slot_range": [0, 40]}, {"id": 1, "parent": 0, "slots": [41, 40]}],
                       "queries": [{"node": 1}, {"node": 1, "upto": 1}]})
    path = tmp_path / "tree.json"
    path.write_text(text)
    for source in (path, str(path), text, json.loads(text)):
        tree = treeattn.Tree.from_json(source)
        assert (tree.num_nodes, tree.num_queries, tree.heads) == (2, 2, (8, 2, 64))
    with pytest.raises(OSError, match="nothing.json"):
        treeattn.Tree.from_json(tmp_path / "nothing.json")
    with pytest.raises(OSError, match=r"nodes\[0\] needs exactly one of 'slots', 'slot_range' and 'pages'"):
        treeattn.Tree.from_json({"heads_q": 8, "heads_kv": 2, "head_dim": 64, "nodes": [{"id": 0, "parent": -1}],
                                 "queries": []})


def test_strided_rows_some_heads_of_a_wider_pool(rng):
    """Q rows of a fused QKV buffer and K/V as a few heads of a wider pool (what a
    rank of a head split reads): bitwise the result on dense copies."""
    tree, _ = fewshot_tree()
    ctx = treeattn.Context("cpu", threads=2)
    plan = ctx.plan(tree, block_tokens=32)
    q, k, v = inputs(rng, np.float16)
    fused = np.zeros((3, 3 * 8, 64), np.float16)
    fused[:, :8] = q
    pool_k = rng.uniform(-1, 1, (350, 6, 64)).astype(np.float16)
    pool_v = rng.uniform(-1, 1, (350, 6, 64)).astype(np.float16)
    pool_k[:, 2:4], pool_v[:, 2:4] = k, v
    strided = (fused[:, :8], pool_k[:, 2:4], pool_v[:, 2:4])
    assert not strided[1].flags.c_contiguous
    want, want_lse = ctx.attention(plan, q, k, v)
    got, got_lse = ctx.attention(plan, *strided)
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16)) and np.array_equal(got_lse, want_lse)
    with pytest.raises(ValueError, match=r"k: dimension 2 has stride 2, expected 1 \(only the rows"):
        ctx.attention(plan, q, pool_k[:, :, ::2][:, :2], v)


def test_errors_name_the_node_the_tensor_and_the_choice(rng):
    ctx = treeattn.Context("cpu")
    tree = treeattn.Tree(*HEADS)
    tree.add_node_range(1, -1, 0, 10)
    tree.add_node_range(2, 5, 10, 10)
    tree.add_query(2)
    with pytest.raises(ValueError, match=r"node 2 \(nodes\[1\]\): parent 5 is not a node id"):
        ctx.plan(tree)
    good, paths = fewshot_tree()
    plan = ctx.plan(good)
    q, k, v = inputs(rng, np.float16)
    with pytest.raises(ValueError, match=r"Q is \[2, 8, 64\] f16, expected \[3, 8, 64\]"):
        ctx.attention(plan, q[:2], k, v)
    with pytest.raises(ValueError, match="K has 300 slots but the tree reads slot 342"):
        ctx.attention(plan, q, k[:300], v[:300])
    with pytest.raises(ValueError, match="q: dtype must be float16, bfloat16 or float32, got int32"):
        ctx.attention(plan, q.astype(np.int32), k, v, out=np.zeros(q.shape, np.float32))
    with pytest.raises(ValueError, match="unknown strategy 'fast'"):
        ctx.plan(good, strategy="fast")
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        treeattn.Context("tpu")
    with pytest.raises(TypeError, match="numpy, torch or cupy"):
        ctx.attention(plan, q.tolist(), k, v)


def _cuda_library():
    torch = pytest.importorskip("torch", reason="GPU test: torch is not installed here")
    if not torch.cuda.is_available():
        pytest.skip("GPU test: no CUDA device here")
    if not treeattn.has_cuda:
        pytest.skip("GPU test: this build of treeattn has no CUDA backend")
    return torch


def test_torch_cuda_arrays_run_on_the_current_stream(rng):
    torch = _cuda_library()
    tree, paths = fewshot_tree()
    ctx = treeattn.Context("cuda")
    plan = ctx.plan(tree)
    q, k, v = inputs(rng, np.float16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        o, lse = ctx.attention(plan, torch.from_numpy(q).cuda(), torch.from_numpy(k).cuda(), torch.from_numpy(v).cuda())
    stream.synchronize()
    assert o.is_cuda and o.dtype == torch.float16 and lse.dtype == torch.float32
    want_o, want_lse = reference_attention(q, k, v, paths, 1 / np.sqrt(HEADS[2]))
    assert np.abs(o.cpu().double().numpy() - want_o).max() <= 2e-3
    assert np.abs(lse.cpu().double().numpy() - want_lse).max() <= 2e-3


def test_torch_cuda_f32_arrays_agree_to_f32_precision(rng):
    torch = _cuda_library()
    tree, paths = fewshot_tree()
    ctx = treeattn.Context("cuda")
    q, k, v = inputs(rng, np.float32)
    o, lse = ctx.attention(ctx.plan(tree, block_tokens=32), *(torch.from_numpy(a).cuda() for a in (q, k, v)))
    torch.cuda.synchronize()
    assert o.dtype == torch.float32
    want_o, want_lse = reference_attention(q, k, v, paths, 1 / np.sqrt(HEADS[2]))
    assert np.abs(o.cpu().double().numpy() - want_o).max() <= 1e-5
    assert np.abs(lse.cpu().double().numpy() - want_lse).max() <= 1e-5

"""torch.ops.treeattn.attention: opcheck, torch.compile(fullgraph=True), and one
captured CUDA graph replayed over decode steps with a new plan uploaded each.
Skipped, saying why, without torch (and the CUDA cases without a GPU)."""

import numpy as np
import pytest

import treeattn
from conftest import reference_attention

torch = pytest.importorskip("torch", reason="torch is not installed here")
import treeattn.torch_ops  # noqa: E402,F401  (registers the operator)

HEADS = (8, 2, 64)


def step_tree(step):
    """Decode step `step`: a 200-token prompt and 4 branches of 5 + step tokens."""
    tree = treeattn.Tree(*HEADS)
    tree.add_node_range(0, -1, 0, 200)
    for b in range(4):
        tree.add_node_range(1 + b, 0, 200 + 32 * b, 5 + step)
        tree.add_query(1 + b)
    paths = [list(range(200)) + list(range(200 + 32 * b, 205 + 32 * b + step)) for b in range(4)]
    return tree, paths


def tensors(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand((4, 8, 64), generator=g) * 2 - 1
    k = torch.rand((340, 2, 64), generator=g) * 2 - 1
    v = torch.rand((340, 2, 64), generator=g) * 2 - 1
    return [t.to(torch.float16).to(device) for t in (q, k, v)]


def test_opcheck_on_cpu_tensors():
    ctx = treeattn.Context("cpu")
    tree, _ = step_tree(0)
    plan = ctx.plan(tree)
    q, k, v = tensors("cpu")
    out = torch.empty_like(q)
    lse = torch.empty((4, 8), dtype=torch.float32)
    torch.library.opcheck(torch.ops.treeattn.attention.default, (q, k, v, out, lse, ctx.handle, plan.handle))


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here")
    if not treeattn.has_cuda:
        pytest.skip("this build of treeattn has no CUDA backend")


def test_compiled_fullgraph_equals_eager():
    _cuda()
    ctx = treeattn.Context("cuda")
    tree, paths = step_tree(0)
    plan = ctx.plan(tree)
    q, k, v = tensors("cuda")
    context_handle, plan_handle = ctx.handle, plan.handle  # plain ints for the traced code

    def layer(q, k, v):
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
        torch.ops.treeattn.attention(q, k, v, out, lse, context_handle, plan_handle)
        return out * 2, lse

    eager_o, eager_lse = layer(q, k, v)
    compiled_o, compiled_lse = torch.compile(layer, fullgraph=True)(q, k, v)
    assert torch.equal(eager_o, compiled_o) and torch.equal(eager_lse, compiled_lse)
    want_o, _ = reference_attention(*(t.cpu().numpy() for t in (q, k, v)), paths, 1 / 8)
    assert np.abs(eager_o.double().cpu().numpy() / 2 - want_o).max() <= 2e-3


def test_one_cuda_graph_replays_every_decode_step():
    _cuda()
    ctx = treeattn.Context("cuda")
    steps = [step_tree(s) for s in range(6)]
    plans = [ctx.plan(tree) for tree, _ in steps]
    ctx.graph_stable(plans)
    q, k, v = tensors("cuda", seed=1)
    out = torch.empty_like(q)
    lse = torch.empty((4, 8), dtype=torch.float32, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ctx.upload(plans[0])
        torch.ops.treeattn.attention(q, k, v, out, lse, ctx.handle, plans[0].handle)  # warm-up, outside the capture
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        torch.ops.treeattn.attention(q, k, v, out, lse, ctx.handle, plans[0].handle)
    for (tree, paths), plan in zip(steps, plans):
        with torch.cuda.stream(stream):
            ctx.upload(plan)
            graph.replay()
        stream.synchronize()
        want_o, want_lse = reference_attention(*(t.cpu().numpy() for t in (q, k, v)), paths, 1 / 8)
        assert np.abs(out.double().cpu().numpy() - want_o).max() <= 2e-3
        assert np.abs(lse.double().cpu().numpy() - want_lse).max() <= 2e-3

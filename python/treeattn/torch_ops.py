"""treeattn as a PyTorch operator: `import treeattn.torch_ops` registers
torch.ops.treeattn.attention(q, k, v, out, lse, context, plan), which writes
`out` and `lse` in place (its fake implementation does nothing), so
torch.compile(fullgraph=True) traces through it and a captured CUDA graph
replays it. `context` and `plan` are the `handle`s of a treeattn.Context and
treeattn.Plan, which must stay alive (read them into plain ints outside code
that torch.compile traces). For replays across decode steps, make the
context graph-stable (Context.graph_stable) and upload each step's plan before
replaying (Context.upload). It runs plain attention; the attention variants
(sinks, soft-cap, fp8 K and V) go through Context.attention."""

import torch

from . import _contexts, _plans


@torch.library.custom_op("treeattn::attention", mutates_args=("out", "lse"))
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, context: int,
              plan: int) -> None:
    ctx = _contexts.get(context)
    the_plan = _plans.get(plan)
    if ctx is None or the_plan is None:
        raise ValueError(f"treeattn::attention: no live {'context' if ctx is None else 'plan'} with handle "
                         f"{context if ctx is None else plan}")
    stream = torch.cuda.current_stream(q.device).cuda_stream if q.is_cuda else 0
    ctx._context._attention(the_plan, q, k, v, out, lse, stream)


@attention.register_fake
def _(q, k, v, out, lse, context, plan):
    return None

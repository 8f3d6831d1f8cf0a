"""treeattn: decode-time attention over a tree of KV cache (DeFT-Flatten).

    import numpy as np, treeattn
    tree = treeattn.Tree(heads_q=32, heads_kv=8, head_dim=128)
    tree.add_node_range(0, -1, 0, 4000)          # a prompt in KV slots 0..3999
    tree.add_node_range(1, 0, 4000, 20)          # a branch
    tree.add_query(1)
    ctx = treeattn.Context()                     # auto: CUDA, Vulkan, CPU
    plan = ctx.plan(tree)                        # a whole tree, planned once
    o, lse = ctx.attention(plan, q, k, v)        # once per layer

A decode loop keeps a planner and hands it each step's changes:

    planner = ctx.planner(tree)                  # the tree's nodes and queries
    planner.append_range(1, 4020, 1)             # add_node*, remove_node, set_queries, ...
    plan = planner.update()                      # a few per cent of a whole plan

Arrays are any DLPack producer: numpy (host arrays: the context's backend),
torch or cupy (host, or CUDA memory: enqueued on the caller's current stream
without waiting). Outputs come back from the same library, on the same device.
"""

from __future__ import annotations

import weakref

from . import _core
from ._core import Plan, Tree, has_cuda, has_vulkan
from .adapters import tree_from_block_tables, tree_from_packed_sequences, tree_from_token_tables

__all__ = ["Tree", "Context", "Plan", "Planner", "context_for", "has_cuda", "has_vulkan", "tree_from_block_tables", "tree_from_packed_sequences", "tree_from_token_tables"]
__version__ = _core.__version__


def _namespace(array):
    """The array library of `array`: 'numpy', 'torch' or 'cupy'."""
    module = type(array).__module__.split(".")[0]
    if module in ("numpy", "torch", "cupy"):
        return module
    raise TypeError(f"arrays must be numpy, torch or cupy arrays (got {type(array).__name__})")


def _empty_like(q, shape, dtype):
    library = _namespace(q)
    if library == "numpy":
        import numpy as np

        return np.empty(shape, dtype=np.float32 if dtype == "float32" else q.dtype)
    if library == "torch":
        import torch

        return torch.empty(shape, dtype=torch.float32 if dtype == "float32" else q.dtype, device=q.device)
    import cupy

    return cupy.empty(shape, dtype=cupy.float32 if dtype == "float32" else q.dtype)


def _stream_number(stream, device):
    if stream is None:
        import torch

        return torch.cuda.current_stream(device).cuda_stream
    if isinstance(stream, int):
        return stream
    return getattr(stream, "cuda_stream", None) or stream.ptr


def _current_stream(q):
    """The caller's current CUDA stream for device arrays (0: none, or the default stream)."""
    library = _namespace(q)
    if library == "torch" and q.is_cuda:
        import torch

        return torch.cuda.current_stream(q.device).cuda_stream
    if library == "cupy":
        import cupy

        return cupy.cuda.get_current_stream().ptr
    return 0


_TORCH_FP8 = {"float8_e4m3fn": "fp8_e4m3", "float8_e5m2": "fp8_e5m2"}


def _kv_kind(kv_dtype):
    """A kv_dtype as the engine names it: None, "fp8_e4m3" / "fp8_e5m2", or a torch
    dtype (float8 kinds map to those names, any other to None)."""
    if kv_dtype is None or isinstance(kv_dtype, str):
        return kv_dtype
    return _TORCH_FP8.get(str(kv_dtype).removeprefix("torch."))


def _fp8_bytes(k, v, kv_dtype):
    """K and V as the engine takes fp8: torch float8 tensors become uint8 views of
    their bytes (DLPack carries no fp8 there) with their kind as kv_dtype."""
    kind = _kv_kind(kv_dtype)
    kinds = [_kv_kind(x.dtype) if _namespace(x) == "torch" else None for x in (k, v)]
    if kinds == [None, None]:  # uint8 bytes of kv_dtype's kind; a torch dtype of no fp8 kind goes by its name
        return k, v, kind if kind is not None or kv_dtype is None else str(kv_dtype)
    if kinds[0] != kinds[1]:
        raise ValueError(f"k and v must both be fp8 of one kind, got k {k.dtype} and v {v.dtype}")
    if kv_dtype is not None and kind != kinds[0]:
        raise ValueError(f"k and v are {k.dtype}, but kv_dtype={kv_dtype!r}")
    import torch

    return k.view(torch.uint8), v.view(torch.uint8), kinds[0]


_contexts = weakref.WeakValueDictionary()  # handle -> Context, for the torch op
_plans = weakref.WeakValueDictionary()     # handle -> Plan


class Context:
    """A backend on a device: Context(backend="auto", device=None, threads=None, model_cache=None).

    backend: "auto" (CUDA, then a Vulkan GPU, then the CPU), "cpu", "cuda", "vulkan".
    model_cache: a JSON file that keeps the cost models calibrated on GPUs without a
    fitted one, per device and driver (None: this process only).
    """

    def __init__(self, backend="auto", device=None, threads=None, model_cache=None):
        self._device = 0 if device is None else int(device)
        self._context = _core._Context(backend, -1 if device is None else int(device), 0 if threads is None else int(threads),
                                       "" if model_cache is None else str(model_cache))
        self.handle = id(self)
        _contexts[self.handle] = self

    @property
    def backend(self):
        return self._context.backend

    def plan(self, tree, strategy="flatten", block_tokens=None, window=None, kv_dtype=None):
        """Plans `tree` with this context's device model. window: a sliding window
        (transformers' sliding_window): each query sees the last `window` tokens of
        its path, its own included, and tokens outside every window are not read
        (None or 0: none; negative: ValueError). A model alternating windowed and
        full layers plans twice per step. kv_dtype: how the attention calls hold K
        and V: "fp8_e4m3", "fp8_e5m2" or a torch float8 dtype plan with the model's
        fp8 terms, None or a torch dtype of another kind with its plain ones (another
        name: ValueError); the plan runs with K and V of any dtype."""
        plan = self._context.plan(tree, strategy, block_tokens, window, _kv_kind(kv_dtype))
        _plans[plan.handle] = plan
        return plan

    def planner(self, tree, strategy="flatten", block_tokens=None, bitwise_updates=False, window=None, kv_dtype=None):
        """A Planner that starts from `tree` (its heads, nodes and queries) and plans
        with this context's device model: each decode step hand it the step's
        changes (add_node, add_node_range, add_node_pages, append_range,
        append_pages, remove_node, set_queries) and call update(), whose plan
        attention() takes. bitwise_updates: every update equals ctx.plan() of the
        whole tree bit for bit (else a layout may be kept over steps that only
        lengthen nodes, which is faster). window and kv_dtype: as plan()'s; under
        a window every update is bitwise (a window slides as leaves grow, so no
        layout is kept). A change naming an unknown node raises ValueError naming it."""
        return Planner(self._context.planner(tree, strategy, block_tokens, bool(bitwise_updates), window, _kv_kind(kv_dtype)))

    def graph_stable(self, plans, headroom=1.0):
        """CUDA: fixes the device workspace's capacities to the largest of `plans`
        times `headroom`, so a CUDA graph captured once replays every plan within
        them. Each step then calls upload(plan) before replaying the graph."""
        self._context._graph_stable(list(plans), float(headroom))

    def upload(self, plan, stream=None):
        """CUDA: uploads `plan` to the device workspace on `stream` (a torch or cupy
        stream, or a cudaStream_t number; None: torch's current stream)."""
        self._context._upload(plan, _stream_number(stream, self._device))

    def attention(self, plan, q, k, v, out=None, lse=None, *, sinks=None, logit_softcap=None, k_scale=1.0, v_scale=1.0,
                  k_scales=None, v_scales=None, kv_dtype=None):
        """O [queries, heads_q, head_dim_v] and LSE [queries, heads_q] (float32, natural log).

        q [queries, heads_q, head_dim], k [slots, heads_kv, head_dim] and v [slots,
        heads_kv, head_dim_v] (head_dim_v: the tree's, else head_dim): f16, bf16 or f32
        (not on Vulkan), or fp8 k and v with f16 or bf16 q: torch float8_e4m3fn /
        float8_e5m2 tensors, or uint8 arrays of fp8 bytes with kv_dtype="fp8_e4m3" or
        "fp8_e5m2". `out` (q's dtype or float32) and `lse` may be given.

        The attention variants (off by default): sinks [heads_q] float32, a logit per
        query head in the softmax's denominator and LSE (gpt-oss); logit_softcap, the
        cap of s = cap * tanh(s / cap) (Gemma 2); fp8 k and v dequantized as k * k_scale
        and v * v_scale, or per KV head by k_scales and v_scales [heads_kv] float32. Every
        backend runs them; an option that does not fit the call raises ValueError naming it.
        """
        _namespace(q)  # a TypeError naming what was given, before its shape is read
        k, v, kv_dtype = _fp8_bytes(k, v, kv_dtype)
        if out is None:
            out = _empty_like(q, (q.shape[0], q.shape[1], plan.head_dim_v), "same")
        if lse is None:
            lse = _empty_like(q, (q.shape[0], q.shape[1]), "float32")
        self._context._attention(plan, q, k, v, out, lse, _current_stream(q), 0.0 if logit_softcap is None else float(logit_softcap),
                                 float(k_scale), float(v_scale), sinks, k_scales, v_scales, kv_dtype)
        return out, lse


class Planner:
    """A tree that changes a little every decode step (made by Context.planner).

    Hand it the step's changes, then update() for the step's plan. Nodes are
    named by id; slots are checked by update(), which names the node and token
    and leaves the changes pending."""

    def __init__(self, planner):
        self._planner = planner

    def add_node(self, id, parent, slots):
        """A new node (parent -1: a root) on the KV slots listed."""
        self._planner.add_node(id, parent, slots)

    def add_node_range(self, id, parent, first_slot, count):
        """A new node on slots first_slot .. first_slot + count - 1."""
        self._planner.add_node_range(id, parent, first_slot, count)

    def add_node_pages(self, id, parent, pages, page_size, last_page_tokens):
        """A new node on pages of a paged KV cache (the last one holding last_page_tokens)."""
        self._planner.add_node_pages(id, parent, pages, page_size, last_page_tokens)

    def append_range(self, id, first_slot, count):
        """Tokens appended to node `id`, on slots first_slot .. first_slot + count - 1."""
        self._planner.append_range(id, first_slot, count)

    def append_pages(self, id, count, new_pages=()):
        """`count` tokens appended to a paged node: they fill its last page, then `new_pages`."""
        self._planner.append_pages(id, count, list(new_pages))

    def remove_node(self, id):
        """Removes node `id` and its whole subtree."""
        self._planner.remove_node(id)

    def set_queries(self, queries):
        """This step's queries, [(node, upto or None), ...]: query i is row i of Q and
        sees its node's path, the node's first `upto` tokens only when given."""
        self._planner.set_queries([(int(node), None if upto is None else int(upto)) for node, upto in queries])

    def update(self):
        """Applies the changes; returns the step's Plan."""
        plan = self._planner.update()
        _plans[plan.handle] = plan
        return plan

    @property
    def num_nodes(self):
        return self._planner.num_nodes

    @property
    def held_layout(self):
        """Whether the last update kept an earlier step's layout (not bitwise a whole-tree plan)."""
        return self._planner.held_layout


_device_contexts = {}  # (device type, index) -> Context


def context_for(array):
    """The process's Context for a torch tensor's device (CUDA there, else the CPU),
    made at its first use: what attention functions called by a framework run on."""
    device = array.device
    key = (device.type, device.index)
    if key not in _device_contexts:
        _device_contexts[key] = Context("cuda", device.index or 0) if device.type == "cuda" else Context("cpu")
    return _device_contexts[key]


"""The attention variants through the package on host arrays (numpy, the CPU
backend): fp8 K and V as uint8 bytes with kv_dtype= and their scales, sinks,
soft-capping, head_dim_v beside head_dim, against an fp64 reference that decodes
the fp8 codes from their definition; the errors that name a bad option; and,
where torch is there, torch's float8 tensors."""

import numpy as np
import pytest

import treeattn
from conftest import reference_attention

HQ, HKV = 8, 2


def fp8_values(codes, kind):
    """The values of fp8 codes (uint8), decoded from the formats' definitions."""
    codes = codes.astype(np.int64)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    if kind == "fp8_e5m2":  # the top byte of a float16
        return (codes << 8).astype(np.uint16).view(np.float16).astype(np.float64)
    exponent, mantissa = (codes >> 3) & 15, codes & 7
    normal = (1 + mantissa / 8) * np.exp2(exponent - 7.0)
    return sign * np.where(exponent == 0, mantissa * 2.0**-9, normal)


def finite_codes(rng, shape, kind):
    """Random fp8 codes of finite values (no NaN, no infinity)."""
    codes = rng.integers(0, 256, shape, dtype=np.uint8)
    special = (codes & 0x7F) == 0x7F if kind == "fp8_e4m3" else (codes & 0x7C) == 0x7C
    return np.where(special, codes & 0xF3, codes).astype(np.uint8)


def tree_and_paths(d, dv=None):
    tree = treeattn.Tree(HQ, HKV, d, head_dim_v=dv)
    tree.add_node_range(0, -1, 0, 90)
    tree.add_node_range(1, 0, 90, 12)
    tree.add_node_range(2, 0, 102, 7)
    tree.add_query(1)
    tree.add_query(2, upto=3)
    return tree, [list(range(102)), list(range(90)) + [102, 103, 104]]


@pytest.mark.parametrize("kind", ["fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("per_head", [False, True])
def test_fp8_bytes_with_scales_match_the_reference(rng, kind, per_head):
    tree, paths = tree_and_paths(64)
    ctx = treeattn.Context("cpu", threads=2)
    q = rng.uniform(-1, 1, (2, HQ, 64)).astype(np.float16)
    k8, v8 = finite_codes(rng, (110, HKV, 64), kind), finite_codes(rng, (110, HKV, 64), kind)
    # Scales that bring the codes' values (up to 448 or 57 344) near 1.
    top = 448.0 if kind == "fp8_e4m3" else 57344.0
    k_scales = np.array([1.5 / top, 0.5 / top], np.float32)
    v_scales = np.array([2.0 / top, 1.0 / top], np.float32)
    if per_head:
        o, lse = ctx.attention(ctx.plan(tree), q, k8, v8, kv_dtype=kind, k_scales=k_scales, v_scales=v_scales)
        k_mult, v_mult = k_scales[None, :, None], v_scales[None, :, None]
    else:
        o, lse = ctx.attention(ctx.plan(tree), q, k8, v8, kv_dtype=kind, k_scale=k_scales[0], v_scale=v_scales[0])
        k_mult, v_mult = float(k_scales[0]), float(v_scales[0])
    want_o, want_lse = reference_attention(q, fp8_values(k8, kind) * k_mult, fp8_values(v8, kind) * v_mult, paths, 1 / 8)
    assert o.dtype == np.float16
    assert np.abs(o.astype(np.float64) - want_o).max() <= 2e-3
    assert np.abs(lse - want_lse).max() <= 2e-3


@pytest.mark.parametrize("strategy", ["flatten", "sequence", "greedy"])
def test_sinks_and_softcap_match_the_reference(rng, strategy):
    tree, paths = tree_and_paths(64)
    ctx = treeattn.Context("cpu", threads=2)
    q = rng.uniform(-2, 2, (2, HQ, 64)).astype(np.float16)
    k, v = (rng.uniform(-1, 1, (110, HKV, 64)).astype(np.float16) for _ in range(2))
    sinks = rng.uniform(-2, 4, HQ).astype(np.float32)
    o, lse = ctx.attention(ctx.plan(tree, strategy=strategy, block_tokens=16), q, k, v, sinks=sinks, logit_softcap=2.0)
    want_o, want_lse = reference_attention(q, k, v, paths, 1 / 8, sinks=sinks, softcap=2.0)
    assert np.abs(o.astype(np.float64) - want_o).max() <= 2e-3
    assert np.abs(lse - want_lse).max() <= 2e-3


def test_head_dim_v_128_beside_192(rng):
    tree, paths = tree_and_paths(192, 128)
    assert tree.head_dim_v == 128
    ctx = treeattn.Context("cpu", threads=2)
    plan = ctx.plan(tree)
    assert plan.head_dim_v == 128
    q = rng.uniform(-1, 1, (2, HQ, 192)).astype(np.float32)
    k = rng.uniform(-1, 1, (110, HKV, 192)).astype(np.float32)
    v = rng.uniform(-1, 1, (110, HKV, 128)).astype(np.float32)
    o, lse = ctx.attention(plan, q, k, v)
    assert o.shape == (2, HQ, 128)
    want_o, want_lse = reference_attention(q, k, v, paths, 1 / np.sqrt(192))
    assert np.abs(o - want_o).max() <= 1e-5
    assert np.abs(lse - want_lse).max() <= 1e-5


def test_bad_options_are_named(rng):
    tree, _ = tree_and_paths(64)
    ctx = treeattn.Context("cpu")
    plan = ctx.plan(tree)
    q = np.zeros((2, HQ, 64), np.float16)
    k = np.zeros((110, HKV, 64), np.float16)
    k8 = np.zeros((110, HKV, 64), np.uint8)
    with pytest.raises(ValueError, match="uint8 elements are fp8 bytes only with kv_dtype="):
        ctx.attention(plan, q, k8, k8)
    with pytest.raises(ValueError, match="kv_dtype 'fp8' is not an fp8 kind"):
        ctx.attention(plan, q, k8, k8, kv_dtype="fp8")
    with pytest.raises(ValueError, match="kv_dtype='fp8_e4m3' names uint8 fp8 bytes, but v is f16"):
        ctx.attention(plan, q, k8, k, kv_dtype="fp8_e4m3")
    with pytest.raises(ValueError, match="kv_dtype='fp8_e5m2' names uint8 fp8 bytes, but k is f16"):
        ctx.attention(plan, q, k, k, kv_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match=r"sinks is \[3\] f32, expected \[8\] \(heads_q\)"):
        ctx.attention(plan, q, k, k, sinks=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="sinks must be f32, got f16"):
        ctx.attention(plan, q, k, k, sinks=np.zeros(HQ, np.float16))
    with pytest.raises(ValueError, match="logit_softcap = -1 must be finite and not negative"):
        ctx.attention(plan, q, k, k, logit_softcap=-1)
    with pytest.raises(ValueError, match="k_scale dequantizes fp8 K and V; K and V are f16"):
        ctx.attention(plan, q, k, k, k_scale=0.5)
    with pytest.raises(ValueError, match="sinks: dtype must be float32, got float64"):
        ctx.attention(plan, q, k, k, sinks=np.zeros(HQ))
    with pytest.raises(ValueError, match="sinks: dtype must be float32, got uint8"):
        ctx.attention(plan, q, k8, k8, kv_dtype="fp8_e4m3", sinks=np.zeros(HQ, np.uint8))
    with pytest.raises(ValueError, match="lse: dtype must be float32, got uint8"):
        ctx.attention(plan, q, k, k, lse=np.zeros((2, HQ), np.uint8))
    with pytest.raises(ValueError, match=r"k_scales is \[3\] f32, expected \[2\] \(heads_kv\)"):
        ctx.attention(plan, q, k8, k8, kv_dtype="fp8_e5m2", k_scales=np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"v_scales is \[1\] f32, expected \[2\] \(heads_kv\)"):
        ctx.attention(plan, q, k8, k8, kv_dtype="fp8_e5m2", v_scales=np.ones(1, np.float32))
    with pytest.raises(ValueError, match="k_scales must be f32, got f16"):
        ctx.attention(plan, q, k8, k8, kv_dtype="fp8_e5m2", k_scales=np.ones(HKV, np.float16))
    with pytest.raises(ValueError, match=r"v_scales: dtype must be float32, got int64"):
        ctx.attention(plan, q, k8, k8, kv_dtype="fp8_e5m2", v_scales=np.ones(HKV, np.int64))
    with pytest.raises(ValueError, match=r"head_dim = 80 is not supported \(supported: 64, 96, 128, 256; or head_dim 192 "
                                         r"with head_dim_v 128\)"):
        bad = treeattn.Tree(HQ, HKV, 80)
        bad.add_node_range(0, -1, 0, 4)
        bad.add_query(0)
        ctx.plan(bad)
    with pytest.raises(ValueError, match="head_dim = 192 with head_dim_v = 64 is not supported"):
        bad = treeattn.Tree(HQ, HKV, 192, head_dim_v=64)
        bad.add_node_range(0, -1, 0, 4)
        bad.add_query(0)
        ctx.plan(bad)


def test_torch_float8_tensors(rng):
    torch = pytest.importorskip("torch")
    tree, paths = tree_and_paths(64)
    ctx = treeattn.Context("cpu", threads=2)
    q = torch.from_numpy(rng.uniform(-1, 1, (2, HQ, 64)).astype(np.float16))
    for torch_dtype, kind in [(torch.float8_e4m3fn, "fp8_e4m3"), (torch.float8_e5m2, "fp8_e5m2")]:
        k = torch.from_numpy(rng.uniform(-8, 8, (110, HKV, 64)).astype(np.float32)).to(torch_dtype)
        v = torch.from_numpy(rng.uniform(-8, 8, (110, HKV, 64)).astype(np.float32)).to(torch_dtype)
        o, lse = ctx.attention(ctx.plan(tree), q, k, v, k_scale=0.125, v_scale=0.25)
        assert o.dtype == torch.float16
        want_o, want_lse = reference_attention(q.numpy(), k.float().numpy() * 0.125, v.float().numpy() * 0.25, paths, 1 / 8)
        assert np.abs(o.double().numpy() - want_o).max() <= 2e-3, kind
        assert np.abs(lse.numpy() - want_lse).max() <= 2e-3, kind
    plan = ctx.plan(tree)
    f16 = torch.zeros(110, HKV, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="k and v must both be fp8 of one kind, got k torch.float8_e4m3fn and v torch.float16"):
        ctx.attention(plan, q, f16.to(torch.float8_e4m3fn), f16)
    with pytest.raises(ValueError, match="k and v must both be fp8 of one kind, got k torch.float16 and v torch.float8_e5m2"):
        ctx.attention(plan, q, f16, v)
    with pytest.raises(ValueError, match="k and v are torch.float8_e5m2, but kv_dtype='fp8_e4m3'"):
        ctx.attention(plan, q, k, v, kv_dtype="fp8_e4m3")
    # uint8 bytes with a torch dtype as kv_dtype: the same run as torch's float8 tensors.
    o, _ = ctx.attention(plan, q, k.view(torch.uint8), v.view(torch.uint8), kv_dtype=torch.float8_e5m2)
    assert torch.equal(o, ctx.attention(plan, q, k, v)[0])
    with pytest.raises(ValueError, match="kv_dtype 'torch.float16' is not an fp8 kind"):
        ctx.attention(plan, q, k.view(torch.uint8), v.view(torch.uint8), kv_dtype=torch.float16)


def decode_tree(requests=50, tokens=1000):
    """Requests decoding `tokens` each off a 16-token root, with Llama 3 8B's heads."""
    tree = treeattn.Tree(32, 8, 128)
    tree.add_node_range(0, -1, 0, 16)
    for r in range(1, requests + 1):
        tree.add_node_range(r, 0, 16 + (r - 1) * tokens, tokens)
        tree.add_query(r)
    return tree


def test_a_plan_for_fp8_kv_takes_the_cost_models_fp8_terms():
    """kv_dtype guides the device model: fp8 split-KV passes gain less from an SM of
    their own, so a decode-only tree planned for fp8 K and V takes shorter blocks."""
    ctx = treeattn.Context("cpu")
    tree = decode_tree()
    plain = ctx.plan(tree).block_tokens
    fp8 = ctx.plan(tree, kv_dtype="fp8_e4m3").block_tokens
    assert fp8 < plain
    assert ctx.plan(tree, kv_dtype="fp8_e5m2").block_tokens == fp8
    assert ctx.planner(tree, kv_dtype="fp8_e4m3").update().block_tokens == fp8
    assert ctx.planner(tree).update().block_tokens == plain
    with pytest.raises(ValueError, match="kv_dtype 'f8' is not an fp8 kind"):
        ctx.plan(tree, kv_dtype="f8")


def test_a_plan_takes_torch_dtypes_as_kv_dtype():
    """A cache tensor's dtype: float8 kinds plan as their names, others as plain K and V."""
    torch = pytest.importorskip("torch")
    ctx = treeattn.Context("cpu")
    tree = decode_tree()
    assert ctx.plan(tree, kv_dtype=torch.float8_e4m3fn).block_tokens == ctx.plan(tree, kv_dtype="fp8_e4m3").block_tokens
    assert ctx.plan(tree, kv_dtype=torch.bfloat16).block_tokens == ctx.plan(tree).block_tokens

"""treeattn inside transformers: a random Llama verifies a Medusa token tree on a
prefix with the same logits as transformers' sdpa with the tree as a mask, and
decodes through continuous batching the same greedy tokens, with the same
log-probabilities, as transformers' own paged attention, on prompts that share
their cache blocks. Llama 3, Qwen3, Gemma 2, gpt-oss and DeepSeek-V3, built at
small sizes through transformers' classes, decode a shared prompt's requests with
treeattn (continuous batching or the tree path) as with transformers' own
attention, on the CPU. Needs torch and transformers (and psutil, which continuous
batching reads the CPU's memory with); skips saying why where they are missing."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: transformers integration not tested")
transformers = pytest.importorskip("transformers", reason="transformers is not installed: its integration not tested")
import argparse
import importlib
import importlib.util
import pathlib
import subprocess
import sys

import treeattn.transformers_paged
import treeattn.transformers_tree

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"
needs_psutil = pytest.mark.skipif(importlib.util.find_spec("psutil") is None,
                                  reason="psutil is not installed: continuous batching cannot size its cache on the CPU")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device: continuous batching sizes its cache from GPU memory")


def load_example(name="transformers_generate"):
    sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


def test_a_medusa_tree_scores_as_sdpa_with_the_tree_as_mask():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    small = ["--layers", "2", "--hidden", "512", "--heads", "8", "--kv-heads", "2", "--head-dim", "64", "--vocab", "2000"]
    run = subprocess.run([sys.executable, str(EXAMPLES / "transformers_tree_verify.py"), "--device", device,
                          "--prefix-tokens", "700", "--tree-size", "64", *small], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr  # every branch's greedy token the same, log-probs within 0.05


@needs_cuda
@pytest.mark.parametrize("name", [treeattn.transformers_paged.NAME, treeattn.transformers_paged.SPLIT_NAME])
def test_greedy_tokens_and_logprobs_match_paged_sdpa(name):
    example = load_example()
    model = example.random_llama(2, 1024, 8, 2, 128, 4000, "cuda", torch.float16, seed=0)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, 4000, (600,), generator=generator).tolist()
    prompts = [prompt + torch.randint(1, 4000, (5,), generator=generator).tolist() for _ in range(6)]
    treeattn.transformers_paged.register()
    ours = example.generate(model, name, prompts, 64, 64)  # the head split on one rank: all the heads
    theirs = example.generate(model, "paged|sdpa", prompts, 64, 64)
    assert ours[0] == theirs[0]
    assert len({t for tokens in ours[0] for t in tokens}) > 20  # greedy decoding did not collapse onto one token
    worst = max(abs(a - b) for la, lb in zip(ours[1], theirs[1]) for a, b in zip(la, lb))
    assert worst <= 0.05


def test_each_rank_of_a_head_split_gives_the_whole_runs_heads_bit_for_bit():
    """The head split's attention on two emulated ranks (no process group: each
    rank's share asked for directly), against one rank with every head: a cache
    read in place as strided rows, a plan for half the heads at the split's fixed
    block size, the same bits (CPU, float32)."""

    class Module:
        layer_idx, scaling = 0, 0.125

    class Cache:
        layer_index_to_group_indices, sliding_windows, block_size = {0: (0, 0)}, {0: 1}, 16

        def __init__(self, generator):
            self.key_cache = [torch.randn(160, 4, 64, generator=generator)]
            self.value_cache = [torch.randn(160, 4, 64, generator=generator)]

    generator = torch.Generator().manual_seed(3)
    query = torch.randn(1, 8, 3, 64, generator=generator)  # 8 query heads, 4 KV heads, three requests' new tokens
    key, value = torch.randn(1, 4, 3, 64, generator=generator), torch.randn(1, 4, 3, 64, generator=generator)
    read = torch.cat([torch.arange(48 * r, 48 * r + 33) for r in range(3)])  # 32 cached rows and the new one
    step = {"read_index": [read], "write_index": [torch.tensor([32, 80, 128])]}
    cu_q, cu_k = torch.tensor([0, 1, 2, 3]), torch.tensor([0, 33, 66, 99])
    attend = treeattn.transformers_paged._attend
    block = treeattn.transformers_paged.SPLIT_BLOCK_TOKENS
    whole = attend(Module(), query, key, value, Cache(torch.Generator().manual_seed(4)), cu_q, cu_k, step, "flatten",
                   block, 0, 1)
    shares = [attend(Module(), query, key, value, Cache(torch.Generator().manual_seed(4)), cu_q, cu_k, step, "flatten",
                     block, rank, 2) for rank in range(2)]
    assert whole.shape == (3, 8, 64) and shares[0].shape == (3, 4, 64)
    assert torch.equal(torch.cat(shares, dim=1), whole)


def test_a_plain_forward_is_refused():
    treeattn.transformers_paged.register()
    with pytest.raises(ValueError, match="needs transformers' paged cache"):
        treeattn.transformers_paged.paged_attention(None, None, None, None)
    with pytest.raises(ValueError, match="needs transformers' paged cache"):
        treeattn.transformers_paged.head_split_attention(None, None, None, None)


def small_run():
    """The five-architecture script's arguments at a CPU's size: a 200-token prompt
    (past gpt-oss's 128-token window and the 64-token Gemma 2 window used here), three
    requests, six tokens each."""
    example = load_example("transformers_models")
    args = argparse.Namespace(device="cpu", small=True, layers=2, vocab=None, gemma2_window=64, block_size=32,
                              new_tokens=6, seed=0, path="auto")
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, 2000, (200,), generator=generator).tolist()
    suffixes = [torch.randint(1, 2000, (4,), generator=generator).tolist() for _ in range(3)]
    treeattn.transformers_paged.register()
    treeattn.transformers_tree.register()
    return example, args, prompt, suffixes


@needs_psutil
@pytest.mark.parametrize("architecture", ["llama3", "qwen3", "gemma2", "gpt-oss", "deepseek-v3"])
def test_each_architecture_decodes_as_transformers_own_attention(architecture):
    """float32, CPU: greedy tokens identical to transformers' default attention and
    log-probabilities within 1e-3, on distributions far from saturated (a dropped
    soft-cap, window or sink moves them by 0.03 to 1.2 at this size)."""
    example, args, prompt, suffixes = small_run()
    result = example.compare_architecture(args, architecture, torch.float32, prompt, suffixes)
    assert result["path"] == ("paged|treeattn" if architecture in example.PAGED else "treeattn_tree")
    assert result["tokens_identical"], result["first_difference"]
    assert result["max_logprob_difference"] <= 1e-3
    assert result["distinct_tokens"] > 3 and result["mean_logprob"] < -0.5


@pytest.mark.parametrize("architecture", ["llama3", "gpt-oss"])
def test_the_tree_path_decodes_a_paged_architecture_as_transformers_own_attention(architecture):
    """gpt-oss's sinks and windows on the tree path too (against its eager attention
    on the requests as a batch), and Llama's plain attention."""
    example, args, prompt, suffixes = small_run()
    args.path = "tree"
    result = example.compare_architecture(args, architecture, torch.float32, prompt, suffixes)
    assert result["path"] == "treeattn_tree" and result["tokens_identical"], result["first_difference"]
    assert result["max_logprob_difference"] <= 1e-3 and result["mean_logprob"] < -0.5


@needs_psutil
def test_an_fp8_cache_decodes_as_float16_rows_rounded_through_e4m3():
    example, args, prompt, suffixes = small_run()
    result = example.compare_fp8(args, prompt, suffixes)
    assert result["against_rounded_kv"]["tokens_identical"]
    assert result["against_rounded_kv"]["max_logprob_difference"] <= 1e-2


def test_a_layer_whose_keys_are_not_the_paged_caches_rows_is_refused():
    """DeepSeek-V3's paged cache would hold latents: its 192-wide keys and 128-wide
    values do not fit the cache's rows, and the error names the layer and the tree path."""

    class Module:
        layer_idx, scaling = 1, 0.1

    class Cache:
        layer_index_to_group_indices, sliding_windows, block_size = {1: (0, 0)}, {1: 1}, 16
        key_cache = value_cache = [torch.zeros(32, 1, 64)]

    query, key, value = torch.zeros(1, 4, 1, 192), torch.zeros(1, 4, 1, 192), torch.zeros(1, 4, 1, 128)
    step = {"read_index": [torch.arange(1)], "write_index": [torch.arange(1)]}
    with pytest.raises(ValueError, match="layer 1 has keys of head dim 192 and values of 128.*transformers_tree"):
        treeattn.transformers_paged._attend(Module(), query, key, value, Cache(), torch.tensor([0, 1]),
                                            torch.tensor([0, 1]), step, "flatten", None, 0, 1)


def test_a_cache_that_dropped_rows_cannot_hold_a_tree():
    class Module:
        scaling = 0.1

    packed = treeattn.transformers_tree.PackedRequests([list(range(10)), [0, 1, 2, 10]], [2, 1])
    assert packed.position_ids().tolist() == [[8, 9, 3]]
    query, kv = torch.zeros(1, 2, 3, 64), torch.zeros(1, 1, 8, 64)  # 8 rows kept, as a sliding layer's cache
    with pytest.raises(ValueError, match="3 queries on 11 rows"):
        treeattn.transformers_tree.tree_attention(Module(), query, kv, kv, token_tree=packed)
    with pytest.raises(ValueError, match="request 1: 5 new tokens but 4 rows"):
        treeattn.transformers_tree.PackedRequests([list(range(10)), [0, 1, 2, 10]], [2, 5])


@needs_psutil
@pytest.mark.parametrize("architecture,left_out", [("gemma2", "softcap"), ("gemma2", "sliding_window"),
                                                   ("gpt-oss", "s_aux")])
def test_leaving_a_feature_out_moves_the_log_probabilities(architecture, left_out, monkeypatch):
    """At these sizes each feature matters: the same decode with the
    feature dropped from what transformers passes parts from the reference by far more
    than the 1e-3 the full decode keeps to."""
    example, args, prompt, suffixes = small_run()
    path = treeattn.transformers_paged if architecture in example.PAGED else treeattn.transformers_tree
    function = path.paged_attention if path is treeattn.transformers_paged else path.tree_attention

    def without(*arguments, **kwargs):
        kwargs.pop(left_out, None)
        return function(*arguments, **kwargs)

    monkeypatch.setattr(path, "paged_attention" if path is treeattn.transformers_paged else "tree_attention", without)
    path.register()
    try:
        result = example.compare_architecture(args, architecture, torch.float32, prompt, suffixes)
    finally:
        monkeypatch.undo()
        path.register()
    assert result["max_logprob_difference"] > 1e-2 or not result["tokens_identical"]


@needs_psutil
def test_full_layers_in_several_cache_groups_each_read_their_own_blocks(monkeypatch):
    """gpt-oss with layer types sliding, full, full, sliding, full × 4: continuous
    batching makes four cache groups of two layers, three of them full, each with
    blocks of its own, so each gets its own tree (one plan for every full group
    reads the wrong rows: 0.29 apart)."""
    example, args, prompt, suffixes = small_run()
    args.layers = 8
    config_class, kwargs = example.configs(args)["gpt-oss"]
    kwargs["layer_types"] = ["sliding_attention", "full_attention", "full_attention", "sliding_attention"] + \
        ["full_attention"] * 4
    monkeypatch.setattr(example, "configs", lambda _: {"gpt-oss": (config_class, kwargs)})
    result = example.compare_architecture(args, "gpt-oss", torch.float32, prompt, suffixes)
    assert result["tokens_identical"], result["first_difference"]
    assert result["max_logprob_difference"] <= 1e-3


def test_a_forward_plans_once_per_distinct_window():
    """gpt-oss of four layers, windowed and full in turn: one forward of the tree
    path plans twice (the window's plan and the full one), not once per layer, and
    a model without windows plans once."""
    example, args, prompt, suffixes = small_run()
    args.layers = 4
    for architecture, plans in (("gpt-oss", 2), ("llama3", 1)):
        model = example.build(args, architecture, torch.float32)
        model.set_attn_implementation(treeattn.transformers_tree.NAME)
        planned = []
        context = treeattn.context_for(torch.zeros(1))
        plan = context.plan

        def counting(*arguments, **kwargs):
            planned.append(kwargs.get("window"))
            return plan(*arguments, **kwargs)

        context.plan = counting
        try:
            packed = treeattn.transformers_tree.PackedRequests([list(range(200))], [200])
            with torch.no_grad():
                model(torch.tensor([prompt]), past_key_values=transformers.DynamicCache(), token_tree=packed,
                      position_ids=packed.position_ids())
        finally:
            del context.plan
        assert sorted(planned) == sorted({getattr(layer.self_attn, "sliding_window", None) or 0
                                          for layer in model.model.layers})
        assert len(planned) == plans


@pytest.mark.parametrize("window", [0, 5])
def test_growing_requests_attend_as_the_requests_packed_anew_each_step(window, rng):
    """Requests that share a prompt, one ending inside another's path and two alike,
    decoded for several steps through GrowingRequests (a Planner following the
    appended rows): every step's attention equals that of PackedRequests built from
    all the rows, with and without a window; a request that shares its node goes
    on in one of its own."""
    import numpy as np

    tt = treeattn.transformers_tree

    class Module:
        scaling = 0.125

    prompt = list(range(12))
    rows = [prompt + [12, 13], prompt + [14], prompt[:7], prompt + [12, 13]]
    new_tokens = [2, 1, 3, 1]
    growing = tt.GrowingRequests(rows, new_tokens)
    rows = [list(r) for r in rows]
    next_row = 15
    k = torch.tensor(rng.uniform(-1, 1, (1, 2, 60, 64)), dtype=torch.float32)
    v = torch.tensor(rng.uniform(-1, 1, (1, 2, 60, 64)), dtype=torch.float32)
    for step in range(5):
        if step > 0:
            per_request = 1 if step % 2 else 2
            added = [[next_row + per_request * r + j for j in range(per_request)] for r in range(4)]
            next_row += sum(len(a) for a in added)
            growing.step(added)
            for r, a in enumerate(added):
                rows[r] += a
            new_tokens = [len(a) for a in added]
        packed = tt.PackedRequests(rows, new_tokens)
        assert growing.queries == packed.queries and growing.rows == packed.rows
        assert growing.position_ids().tolist() == packed.position_ids().tolist()
        q = torch.tensor(rng.uniform(-1, 1, (1, 8, packed.queries, 64)), dtype=torch.float32)
        got, _ = tt.tree_attention(Module(), q, k, v, token_tree=growing, sliding_window=window)
        want, _ = tt.tree_attention(Module(), q, k, v, token_tree=packed, sliding_window=window)
        assert np.abs(got.numpy() - want.numpy()).max() <= 1e-6, f"step {step}"


def test_growing_requests_refuse_a_step_that_does_not_fit():
    growing = treeattn.transformers_tree.GrowingRequests([[0, 1, 2], [0, 1, 3]], [1, 1])
    with pytest.raises(ValueError, match="3 requests' new rows but 2 requests"):
        growing.step([[4], [5], [6]])
    with pytest.raises(ValueError, match="no request has new rows"):
        growing.step([[], []])


def test_a_growing_request_that_waits_keeps_its_rows_and_has_no_query(rng):
    """Request 1 takes no row at step 1 (finished, or waiting) and one again at step 2:
    each step attends as PackedRequests of the requests that have new rows."""
    import numpy as np

    tt = treeattn.transformers_tree

    class Module:
        scaling = 0.125

    rows = [list(range(10)) + [10], list(range(10)) + [11], list(range(10)) + [12]]
    growing = tt.GrowingRequests(rows, [1, 1, 1])
    k = torch.tensor(rng.uniform(-1, 1, (1, 2, 20, 64)), dtype=torch.float32)
    v = torch.tensor(rng.uniform(-1, 1, (1, 2, 20, 64)), dtype=torch.float32)
    for added in ([[13], [], [14]], [[15], [16], [17]]):
        growing.step(added)
        for r, a in enumerate(added):
            rows[r] += a
        active = [r for r, a in enumerate(added) if a]
        packed = tt.PackedRequests([rows[r] for r in active], [1] * len(active))
        assert growing.position_ids().tolist() == packed.position_ids().tolist()
        q = torch.tensor(rng.uniform(-1, 1, (1, 8, len(active), 64)), dtype=torch.float32)
        got, _ = tt.tree_attention(Module(), q, k, v, token_tree=growing)
        want, _ = tt.tree_attention(Module(), q, k, v, token_tree=packed)
        assert np.abs(got.numpy() - want.numpy()).max() <= 1e-6

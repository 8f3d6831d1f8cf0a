"""treeattn inside transformers: a random Llama verifies a Medusa token tree on a
prefix with the same logits as transformers' sdpa with the tree as a mask, and
decodes through continuous batching the same greedy tokens, with the same
log-probabilities, as transformers' own paged attention, on prompts that share
their cache blocks. Needs torch and transformers (the GPU machine has both; the
tree test runs on the CPU too); skips saying why where they are missing."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: transformers integration not tested")
pytest.importorskip("transformers", reason="transformers is not installed: its integration not tested")
import pathlib
import subprocess
import sys

import treeattn.transformers_paged

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device: continuous batching sizes its cache from GPU memory")


def load_example():
    sys.path.insert(0, str(EXAMPLES))
    import transformers_generate

    return transformers_generate


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

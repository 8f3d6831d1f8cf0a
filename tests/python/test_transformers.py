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
def test_greedy_tokens_and_logprobs_match_paged_sdpa():
    example = load_example()
    model = example.random_llama(2, 1024, 8, 2, 128, 4000, "cuda", torch.float16, seed=0)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, 4000, (600,), generator=generator).tolist()
    prompts = [prompt + torch.randint(1, 4000, (5,), generator=generator).tolist() for _ in range(6)]
    treeattn.transformers_paged.register()
    ours = example.generate(model, treeattn.transformers_paged.NAME, prompts, 64, 64)
    theirs = example.generate(model, "paged|sdpa", prompts, 64, 64)
    assert ours[0] == theirs[0]
    assert len({t for tokens in ours[0] for t in tokens}) > 20  # greedy decoding did not collapse onto one token
    worst = max(abs(a - b) for la, lb in zip(ours[1], theirs[1]) for a, b in zip(la, lb))
    assert worst <= 0.05


def test_a_plain_forward_is_refused():
    treeattn.transformers_paged.register()
    with pytest.raises(ValueError, match="needs transformers' paged cache"):
        treeattn.transformers_paged.paged_attention(None, None, None, None)

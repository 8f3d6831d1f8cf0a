"""treeattn inside transformers' continuous batching: a random Llama decodes the
same greedy tokens, with the same log-probabilities, as transformers' own paged
attention, on prompts that share their cache blocks. Needs torch and transformers
(the GPU machine has both); skips saying why where they are missing."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: transformers integration not tested")
pytest.importorskip("transformers", reason="transformers is not installed: its integration not tested")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: continuous batching sizes its cache from GPU memory", allow_module_level=True)

import importlib.util
import pathlib

import treeattn.transformers_paged

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "transformers_generate.py"


def load_example():
    spec = importlib.util.spec_from_file_location("transformers_generate", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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

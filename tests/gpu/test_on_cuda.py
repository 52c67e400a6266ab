"""A tiny pair on CUDA: greedy exactness, sampling on the device, bitsandbytes 4-bit and 8-bit,
device_map = "auto" over two GPUs, and the host reads per step. Marked `gpu`, skipped where torch sees no GPU;
scripts/gpu_check.sh runs them.

GPU kernels are not batch-invariant in general (cuBLAS picks kernels by shape), so where greedy speculative output
differs from target-only output, the first difference must be a near tie in the logits' dtype (compare.py).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import build_model, build_tokenizer

from specchat.config import Config, ModelConfig, SamplingConfig, SpeculationConfig
from specchat.loading.models import load_pair
from specchat.session.compare import Comparer
from specchat.speculative.engine import Engine
from specchat.speculative.sampling import make_generator

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PROMPTS = ("def reverse(lst):", "The quick brown", "Hello, how are you")
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=32)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, tok):
    """A target and a drafter that agree often (the target with a noisy head), saved as checkpoints."""
    target = build_model(len(tok), seed=1, layers=2)
    drafter = build_model(len(tok), seed=1, layers=2)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        head = drafter.lm_head.weight
        head.add_(torch.randn(head.shape, generator=generator) * head.std() * 0.6)
    paths = []
    for name, model in (("target", target), ("drafter", drafter)):
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(str(path))
    return paths


def pair_on_cuda(dirs, target_keys=None, drafter_keys=None):
    target_dir, drafter_dir = dirs
    return load_pair(
        Config(
            target=ModelConfig(source=target_dir, **{"device": "cuda", "dtype": "float32", **(target_keys or {})}),
            drafter=ModelConfig(source=drafter_dir, **{"device": "cuda", "dtype": "float32", **(drafter_keys or {})}),
            speculation=SpeculationConfig(mode="spec"),
        )
    )


def reply(pair, mode: str, ids: list[int], sampling=GREEDY, gamma: int = 4) -> tuple[int, ...]:
    engine = Engine.for_pair(pair, with_drafter=mode != "target")
    *_, done = engine.stream(ids, sampling, SpeculationConfig(gamma=gamma, mode=mode))
    return done.ids


def assert_greedy_exact(pair, tokenizer) -> None:
    """Speculative equals target-only, or first differs at a near tie of the target's logits."""
    for text in PROMPTS:
        ids = tokenizer.encode(text)
        spec, target_only = reply(pair, "spec", ids), reply(pair, "target", ids)
        if spec != target_only:
            divergence = Comparer(pair).explain(ids, spec, target_only)
            assert divergence.near_tie, (text, divergence)


def test_greedy_speculation_on_cuda_is_exact(dirs, tok):
    pair = pair_on_cuda(dirs)
    assert pair.target_facts.device == pair.drafter_facts.device == "cuda:0"
    assert_greedy_exact(pair, tok)


def test_greedy_speculation_in_the_gpus_own_dtype(dirs, tok):
    pair = pair_on_cuda(dirs, {"dtype": "auto"}, {"dtype": "auto"})
    assert pair.target_facts.dtype in ("bfloat16", "float16")
    assert_greedy_exact(pair, tok)


def test_sampling_runs_on_the_device_and_repeats_with_its_seed(dirs, tok):
    pair = pair_on_cuda(dirs)
    engine = Engine.for_pair(pair)
    assert engine.device.type == "cuda" and make_generator(0, engine.device).device.type == "cuda"
    sampling = SamplingConfig(temperature=0.8, top_p=0.9, max_new_tokens=24, seed=7)
    ids = tok.encode(PROMPTS[0])
    first, again = reply(pair, "spec", ids, sampling), reply(pair, "spec", ids, sampling)
    assert first == again and len(first) == 24 and all(0 <= t < pair.vocab_size for t in first)
    assert reply(pair, "target", ids, sampling)  # target-only sampling on the device too


@pytest.mark.parametrize(
    "quantization, layer, dtype", [("4bit", "Linear4bit", "float32"), ("8bit", "Linear8bitLt", "float16")]
)
def test_bitsandbytes_targets_on_cuda(dirs, tok, quantization, layer, dtype):
    pair = pair_on_cuda(dirs, {"quantization": quantization, "dtype": "auto" if quantization == "8bit" else "float32"})
    assert type(pair.target.model.layers[0].mlp.up_proj).__name__ == layer
    assert pair.target_facts.quantization == quantization and pair.target_facts.dtype == dtype
    if quantization == "8bit":  # LLM.int8 with its outlier decomposition on a GPU (devices.quantization_config)
        assert pair.target.config.quantization_config.llm_int8_threshold == 6.0
    assert_greedy_exact(pair, tok)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_device_map_auto_spreads_the_target_over_two_gpus(dirs, tok):
    size = build_model(len(tok), seed=1, layers=2).get_memory_footprint()
    pair = pair_on_cuda(dirs, {"device_map": "auto", "max_memory": {"0": size // 2, "1": "1GiB"}}, {"device": "cuda:0"})
    assert pair.target_facts.device == "cuda:0,cuda:1"
    assert_greedy_exact(pair, tok)


def test_a_step_on_cuda_reads_the_device_once_or_twice(dirs, tok):
    """The explicit synchronize calls of the timed regions (speculative/timing.py) are not counted: they are the cost ratio's."""
    from syncs import reads_per_step

    pair = pair_on_cuda(dirs)
    for gamma in (2, 8):
        for temperature in (0.0, 0.8):
            steps = reads_per_step(
                Engine.for_pair(pair),
                tok.encode(PROMPTS[0]),
                SamplingConfig(temperature=temperature, max_new_tokens=32, seed=1),
                SpeculationConfig(gamma=gamma),
            )
            assert all(reads == 1 + (accepted < drafted) for reads, drafted, accepted in steps), (gamma, steps)

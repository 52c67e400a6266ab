"""GPU readiness, tested on this CPU: what a shipped config would do the first time it meets a
GPU, with the device decisions monkeypatched. The tests that need a real GPU are in tests/gpu/."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny_models import build_model, build_tokenizer

from specchat.config import ModelConfig
from specchat.loading import models, shared_tokenizer
from specchat.loading import plan as planning


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory, tok):
    path = tmp_path_factory.mktemp("target")
    build_model(len(tok), seed=1, layers=2).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def pretend_gpu(monkeypatch, device: str = "cuda:0") -> None:
    """load_model decides for `device`, but the weights still land on the CPU (there is no GPU here)."""
    monkeypatch.setattr(planning, "resolve_device", lambda asked: device)
    monkeypatch.setattr(planning, "resolve_dtype", lambda dtype, device, quantization="none": torch.float32)
    place = planning.placement_kwargs
    monkeypatch.setattr(planning, "placement_kwargs", lambda mc, role, device, dtype: place(mc, role, "cpu", dtype))


# ----- item 4: weight-only int8 is for the CPU ---------------------------------------------------
def test_int8_off_the_cpu_loads_unquantized_with_one_notice(target_dir, cache, monkeypatch):
    pretend_gpu(monkeypatch)
    notices = []
    model, _tok, facts = models.load_model(
        ModelConfig(source=str(target_dir), quantization="int8", device="cuda"),
        lambda message, fraction: notices.append(message),
        role="drafter",
    )
    quantizing = [m for m in notices if "int8" in m]
    assert quantizing == [
        "drafter: quantization int8 is fast on the CPU only (elsewhere it dequantizes every "
        "weight on every call); loading it unquantized on cuda:0"
    ]
    assert facts.quantization == "none"
    assert all(isinstance(m, torch.nn.Linear) for name, m in model.named_modules() if name.endswith("proj"))
    assert not (cache / "quantized").exists()  # nothing quantized, nothing cached


def test_int8_on_the_cpu_stays_int8(target_dir, cache):
    from specchat.quant.int8_weights import Int8Linear

    model, _tok, facts = models.load_model(
        ModelConfig(source=str(target_dir), quantization="int8", device="cpu", dtype="float32")
    )
    assert facts.quantization == "int8"
    assert any(isinstance(m, Int8Linear) for m in model.modules())


# ----- item 2: base models get the BOS their tokenizer normally adds ------------------------------
BOS = "<|endoftext|>"


def base_tokenizer(adds_bos: bool, names_bos: bool = True):
    """The tiny tokenizer without a chat template (a base model's), putting BOS before text or not."""
    from tokenizers import processors

    tokenizer = build_tokenizer()
    tokenizer.chat_template = None
    if names_bos:
        tokenizer.bos_token = BOS  # gpt2 names a BOS but does not add it
    if adds_bos:
        bos_id = tokenizer.convert_tokens_to_ids(BOS)
        tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
        )
    return tokenizer


@pytest.mark.parametrize("adds_bos, names_bos", [(True, True), (False, True), (False, False)])
def test_plain_template_opens_with_bos_only_where_the_tokenizer_adds_one(adds_bos, names_bos):
    tokenizer = base_tokenizer(adds_bos, names_bos)
    assert (tokenizer("a")["input_ids"][0] == tokenizer.bos_token_id) == adds_bos  # what the template follows
    tokenizer.chat_template = shared_tokenizer.plain_template(tokenizer)
    turn = [{"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
    assert text == (BOS if adds_bos else "") + "User: hi\nAssistant:"
    ids = tokenizer.apply_chat_template(turn, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert (ids[0] == tokenizer.convert_tokens_to_ids(BOS)) == adds_bos
    assert ids.count(tokenizer.convert_tokens_to_ids(BOS)) == int(adds_bos)  # once, never twice


def test_a_base_model_loaded_from_disk_gets_its_bos(tmp_path, tok):
    from specchat.session.chat import render_prompt

    path = tmp_path / "base"
    build_model(len(tok), seed=3, layers=1, hidden=32).save_pretrained(path)
    base_tokenizer(adds_bos=True).save_pretrained(path)
    _model, tokenizer, facts = models.load_model(ModelConfig(source=str(path), dtype="float32", device="cpu"))
    assert facts.template == "plain"
    ids = render_prompt(tokenizer, "Be brief.", [{"role": "user", "content": "hi"}])
    assert ids[0] == tokenizer.bos_token_id and tokenizer.decode(ids[1:]) == "Be brief.\n\nUser: hi\nAssistant:"


# ----- item 6: bitsandbytes 8-bit on a GPU --------------------------------------------------------
def test_bitsandbytes_8bit_keeps_its_outliers_on_a_gpu_and_is_row_wise_on_the_cpu():
    from specchat.loading import devices

    on_gpu = devices.quantization_config("8bit", torch.float16, "cuda:1")
    assert on_gpu.load_in_8bit and on_gpu.llm_int8_threshold == 6.0  # LLM.int8's fp16 outlier decomposition
    on_cpu = devices.quantization_config("8bit", torch.float32, "cpu")
    assert on_cpu.load_in_8bit and on_cpu.llm_int8_threshold == 0.0  # batch-invariant: greedy exact
    kwargs = devices.placement_kwargs(ModelConfig(quantization="8bit"), "target", "cuda", torch.float16)
    assert kwargs["quantization_config"].llm_int8_threshold == 6.0
    four = devices.quantization_config("4bit", torch.bfloat16, "cuda")
    assert four.load_in_4bit and four.bnb_4bit_compute_dtype == torch.bfloat16


def test_bitsandbytes_8bit_on_a_gpu_computes_in_float16_unless_told(monkeypatch):
    from specchat.loading import devices

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))  # a GPU with native bf16
    assert devices.resolve_dtype("auto", "cuda:0", "8bit") == torch.float16  # what bnb's int8 kernel reads
    assert devices.resolve_dtype("auto", "cuda:0", "4bit") == torch.bfloat16
    assert devices.resolve_dtype("auto", "cuda:0") == torch.bfloat16
    assert devices.resolve_dtype("bfloat16", "cuda:0", "8bit") == torch.bfloat16  # asked for: cast, quietly
    monkeypatch.setattr(devices, "cpu_has_fast_bf16", lambda: True)
    assert devices.resolve_dtype("auto", "cpu", "8bit") == torch.bfloat16  # the CPU keeps its own rule


def test_bitsandbytes_8bit_cast_warning_is_not_repeated_on_every_call(target_dir, caplog):
    model, tokenizer, _facts = models.load_model(
        ModelConfig(source=str(target_dir), quantization="8bit", dtype="bfloat16", device="cpu")
    )
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "Linear8bitLt"
    with caplog.at_level("WARNING"), torch.inference_mode():
        model(torch.tensor([tokenizer.encode("Hello, how are you")]))
        model(torch.tensor([tokenizer.encode("Hello")]))
    assert not [r for r in caplog.records if "will be cast" in r.getMessage()]
    import logging

    caplog.clear()
    with caplog.at_level("WARNING"):  # other bitsandbytes warnings still come through
        logging.getLogger("bitsandbytes.autograd._functions").warning("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]


# ----- item 7: a target spread by device_map = "auto" leaves the drafter room ---------------------
@pytest.fixture(scope="module")
def drafter_dir(tmp_path_factory, tok):
    path = tmp_path_factory.mktemp("drafter")
    build_model(len(tok), seed=2, layers=1, hidden=32).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.parametrize("device_map, first", [("auto", "drafter"), ("", "target")])
def test_the_drafter_is_placed_before_a_target_spread_by_device_map_auto(
    target_dir, drafter_dir, monkeypatch, device_map, first
):
    from specchat.config import Config, SpeculationConfig

    pretend_gpu(monkeypatch)
    loads = []
    load_weights = models.load_weights

    def recorded(checkpoint, plan):
        loads.append((checkpoint.location, plan.placement))
        here = {key: value for key, value in plan.placement.items() if key != "max_memory"}  # no GPU 0 here
        return load_weights(checkpoint, replace(plan, placement=here))

    monkeypatch.setattr(models, "load_weights", recorded)
    max_memory = {"0": "20GiB", "cpu": "64GiB"} if device_map else {}
    cfg = Config(
        target=ModelConfig(source=str(target_dir), device="cuda", device_map=device_map, max_memory=max_memory),
        drafter=ModelConfig(source=str(drafter_dir), device="cuda:0"),
        speculation=SpeculationConfig(mode="spec"),
    )
    assert planning.drafter_loads_first(cfg) == (first == "drafter")
    pair = models.load_pair(cfg)
    order = [location for location, _ in loads]
    assert order == ([str(drafter_dir), str(target_dir)] if first == "drafter" else [str(target_dir), str(drafter_dir)])
    placements = {location: placement for location, placement in loads}
    assert placements[str(drafter_dir)]["device_map"] == {"": "cpu"}  # pretend_gpu's stand-in for cuda:0
    if device_map:
        assert placements[str(target_dir)]["device_map"] == "auto"
        assert placements[str(target_dir)]["max_memory"] == {0: "20GiB", "cpu": "64GiB"}
    assert pair.drafter is not None and pair.drafter_facts.name and pair.target_facts.name


# ----- item 9: timed regions wait for the GPU ------------------------------------------------------
def count_syncs(monkeypatch) -> list:
    synced = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(str(device)))
    return synced


def test_cuda_devices_of_a_model_follow_its_device_map(tok):
    from specchat.speculative.timing import cuda_devices

    model = build_model(len(tok), seed=1, layers=1, hidden=32)
    assert cuda_devices(model) == set()
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": "cuda:1", "model.norm": "cpu", "lm_head": "disk"}
    assert cuda_devices(model) == {torch.device("cuda", 0), torch.device("cuda", 1)}


@pytest.mark.parametrize(
    "device_map, expected", [(None, set()), ({"": 0}, {"cuda:0"}), ({"model": 0, "lm_head": 1}, {"cuda:0", "cuda:1"})]
)
def test_each_timed_forward_synchronizes_the_models_cuda_devices(tok, monkeypatch, device_map, expected):
    """The pair runs on the CPU; a device_map saying cuda makes the timing code treat it as on the GPU."""
    from specchat.config import SamplingConfig, SpeculationConfig
    from specchat.speculative.drafters.model import ModelDrafter
    from specchat.speculative.engine import Engine

    target = build_model(len(tok), seed=1, layers=2)
    drafter = build_model(len(tok), seed=2, layers=1, hidden=32)
    if device_map:
        target.hf_device_map, drafter.hf_device_map = device_map, {"": 0}
    engine = Engine(target, tok, ModelDrafter(drafter, len(tok)), eos_ids=())
    synced = count_syncs(monkeypatch)
    steps = [
        item
        for item in engine.steps(
            tok.encode("def reverse(lst):"),
            SamplingConfig(temperature=0.0, max_new_tokens=9),
            SpeculationConfig(gamma=4),
        )
        if hasattr(item, "drafted")
    ]
    if not device_map:
        assert synced == []  # a CPU model never waits: no call at all
        return
    forwards = sum(len(step.draft.forwards) for step in steps)
    # each step: before and after the target's forward on each of its devices; each drafter forward: before and after
    # on cuda:0; the prefill's end: the union of both models' devices
    assert sorted(synced) == sorted(
        [*sorted(expected) * 2 * len(steps), *["cuda:0"] * 2 * forwards, *sorted(expected | {"cuda:0"})]
    )


# ----- item 8: a constant number of host reads per speculative step --------------------------------
def sync_counts(target, drafter_model, tokenizer, gamma: int, temperature: float, **speculation):
    from syncs import reads_per_step

    from specchat.config import SamplingConfig, SpeculationConfig
    from specchat.speculative.drafters.model import ModelDrafter
    from specchat.speculative.engine import Engine

    engine = Engine(target, tokenizer, ModelDrafter(drafter_model, len(tokenizer)), eos_ids=())
    sampling = SamplingConfig(temperature=temperature, top_k=40, max_new_tokens=40, seed=3)
    return reads_per_step(
        engine, tokenizer.encode("def reverse(lst):"), sampling, SpeculationConfig(gamma=gamma, **speculation)
    )


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("speculation", [{}, {"drafter_vocab": 300}], ids=["whole vocabulary", "restricted head"])
def test_a_speculative_step_reads_the_device_a_constant_number_of_times(
    target, similar_drafter_model, tokenizer, temperature, speculation
):
    """One read for the verdict, the drafts and every token's p and q; one more when a draft was refused (the /why
    record). It was 2γ + 9 before (γ 2: 13, γ 8: 25 in greedy mode)."""
    counts = {
        gamma: sync_counts(target, similar_drafter_model, tokenizer, gamma, temperature, **speculation)
        for gamma in (2, 4, 8)
    }
    for gamma, steps in counts.items():
        assert any(drafted and accepted < drafted for _, drafted, accepted in steps)  # rejections happen
        for reads, drafted, accepted in steps:
            assert reads == 1 + (accepted < drafted), (gamma, reads, drafted, accepted)
    assert max(r for r, _, _ in counts[2]) == max(r for r, _, _ in counts[8]) == 2


def test_a_draft_that_may_end_early_reads_each_token_once(target, similar_drafter_model, tokenizer):
    """An early end on the drafter's confidence is decided on the host, token by token: one read each."""
    for reads, drafted, accepted in sync_counts(target, similar_drafter_model, tokenizer, 8, 0.0, draft_confidence=0.3):
        assert reads == drafted + 1 + (accepted < drafted)

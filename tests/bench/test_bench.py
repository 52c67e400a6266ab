"""The benchmark harness on tiny models: every method runs, greedy exactness is checked, files are written."""

from __future__ import annotations

import copy
import json

import matplotlib.pyplot as plt
import pytest
import torch
from tiny_models import build_model

from specchat.bench import suite as bench
from specchat.bench.methods import Measurement, Method, Runner, default_methods
from specchat.bench.report import markdown_table
from specchat.config import AUTO, Config, ConfigError
from specchat.loading.models import LoadedPair, ModelFacts
from specchat.settings import with_value

PROMPTS = [
    {"name": "code", "kind": "code", "messages": [{"role": "user", "content": "def reverse(lst):"}]},
    {"name": "chat", "kind": "chat", "messages": [{"role": "user", "content": "Hello, how are you"}]},
]


@pytest.fixture(autouse=True)
def session_models_left_as_found(target, similar_drafter_model, int8_drafter_model):
    """HF assisted rows set the drafter's generation_config; the models are session-wide fixtures, so
    each test here puts every one back, and later tests never depend on the order they ran in."""
    models = (target, similar_drafter_model, int8_drafter_model)
    saved = [copy.deepcopy(m.generation_config) for m in models]
    yield
    for model, config in zip(models, saved):
        model.generation_config = config


def tiny_pair(target, drafter, tokenizer) -> LoadedPair:
    facts = ModelFacts("tiny", "test", 1, "float32", "none", "cpu", 0, 0.0)
    return LoadedPair(
        target, drafter, tokenizer, {2}, len(tokenizer), context_limit=1024, target_facts=facts, drafter_facts=facts
    )


# Slow (many seconds: every method, HF's too, both settings): the fast default checks run_bench's exactness
# check on fewer rows below (another target's rows, the lookup and self-drafter rows, a reported mismatch).
@pytest.mark.slow
def test_bench_runs_every_method_and_checks_greedy_exactness(
    target, similar_drafter_model, int8_drafter_model, tokenizer, tmp_path
):
    cfg = with_value(with_value(Config(), "drafter.source", "tiny"), "drafter.quantization", "int8")
    runner = Runner(
        tiny_pair(target, int8_drafter_model, tokenizer),
        default_methods(cfg),
        "",
        unquantized_drafter=similar_drafter_model,
    )
    labels = []
    rows = bench.run_bench(runner, PROMPTS, ["greedy", "sampled"], max_new=16, progress=labels.append)
    assert labels[:3] == [
        "greedy · code · specchat target-only",
        "greedy · code · HF generate target-only",
        "greedy · code · HF assisted γ4",
    ]
    assert len(labels) == 2 * len(PROMPTS) * len(runner.methods)
    summaries = [bench.summarise(r) for r in rows]
    greedy = {s["method"]: s for s in summaries if s["setting"] == "greedy"}
    assert list(greedy) == [m.name for m in runner.methods]
    assert all(s["exact"] for s in greedy.values()), [s["mismatched_prompts"] for s in greedy.values()]
    assert greedy["specchat target-only"]["vs_target"] == 1.0
    assert greedy["HF assisted γ4"]["alpha"] is None and greedy["HF assisted γ4"]["predicted"] is None
    json_path, png_path = bench.write_results(
        summaries, runner.meta() | {"prompts": ["code", "chat"], "max_new_tokens": 16}, tmp_path
    )
    assert json.loads(json_path.read_text())["rows"] == json.loads(json.dumps(summaries))
    assert plt.imread(png_path).shape == (495, 1320, 4)  # one 6 × 4.5 in panel per setting at 110 dpi


TABLE = """\
| setting | method | tok/s | × target | × target code | × target edit | worst × target | × HF same drafter | × HF unquantized drafter | \
× llama.cpp | acceptance | tok/step | c | bound | of bound | edit steps copy/model/target | exact |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
| greedy | specchat target-only | 3.50 | 1.00× | 1.00× | — | 1.00× | 0.70× | — | 0.40× | — | 1.00 | — | — | — | — | yes |
| greedy | HF assisted γ4 | 5.00 | 1.46× | 1.67× | — | 1.25× | 1.00× | — | 0.56× | — | — | — | — | — | — | yes |
| greedy | specchat γ4 | 7.75 | 2.25× | 2.50× | — | 2.00× | 1.55× | — | 0.88× | 70% | 3.00 | 0.15 | 2.50 | 90% | — | NO: chat |
| greedy | llama.cpp target-only | 9.00 | 1.00× | 1.00× | — | 1.00× | 1.80× | — | 1.00× | — | — | — | — | — | — | yes |"""


def test_the_report_table_from_known_measurements():
    """code: target-only 3 tok/s, HF 5, specchat 7.5, llama.cpp 10; chat: 4, 5, 8 and 8, where
    specchat's ids differ. llama.cpp rows are compared with llama.cpp's own target-only."""
    methods = [
        Method("specchat target-only", "specchat", "target"),
        Method("HF assisted γ4", "hf", "assisted", 4),
        Method("specchat γ4", "specchat", "spec", 4),
        Method("llama.cpp target-only", "llama.cpp", "target"),
    ]
    rows = {("greedy", m.name): bench.Row("greedy", m) for m in methods}
    same, other = (1, 2, 3), (1, 2, 4)
    bench._add_prompt_results(
        rows,
        "greedy",
        PROMPTS[0],
        {
            "specchat target-only": Measurement(same, 30, 10.0, tokens_per_step=1.0),
            "HF assisted γ4": Measurement(same, 30, 6.0),
            "specchat γ4": Measurement(same, 30, 4.0, 0.6, 2.5, 0.2, 4.0, 2.0),
            "llama.cpp target-only": Measurement(other, 30, 3.0),
        },
        greedy=True,
    )
    bench._add_prompt_results(
        rows,
        "greedy",
        PROMPTS[1],
        {
            "specchat target-only": Measurement(same, 20, 5.0, tokens_per_step=1.0),
            "HF assisted γ4": Measurement(same, 20, 4.0),
            "specchat γ4": Measurement(other, 20, 2.5, 0.8, 3.5, 0.1, 4.0, 3.0),
            "llama.cpp target-only": Measurement(other, 20, 2.5),
        },
        greedy=True,
    )
    assert markdown_table([bench.summarise(row) for row in rows.values()]) == TABLE.replace("\\\n", "")


def test_a_greedy_mismatch_is_reported_not_hidden(tokenizer):
    rows = {
        ("greedy", name): bench.Row("greedy", Method(name, "hf", "target")) for name in ("specchat target-only", "x")
    }
    results = {"specchat target-only": Measurement((1, 2, 3), 3, 1.0), "x": Measurement((1, 2, 4), 3, 0.5)}
    bench._add_prompt_results(rows, "greedy", {"name": "p1", "kind": "code"}, results, greedy=True)
    summary = bench.summarise(rows[("greedy", "x")])
    assert summary["exact"] is False and summary["mismatched_prompts"] == ["p1"]
    assert summary["vs_target"] == 2.0 and summary["vs_target_code"] == 2.0 and summary["worst_vs_target"] == 2.0


def test_edit_prompts_have_their_own_ratio():
    rows = {
        ("greedy", name): bench.Row("greedy", Method(name, "specchat", mode))
        for name, mode in (("specchat target-only", "target"), ("specchat γ4", "spec"))
    }
    for prompt, seconds in (({"name": "write", "kind": "code"}, 1.0), ({"name": "edit", "kind": "edit"}, 0.25)):
        results = {"specchat target-only": Measurement((1, 2), 2, 1.0), "specchat γ4": Measurement((1, 2), 2, seconds)}
        bench._add_prompt_results(rows, "greedy", prompt, results, greedy=True)
    summary = bench.summarise(rows[("greedy", "specchat γ4")])
    assert (summary["vs_target_code"], summary["vs_target_edit"]) == (1.0, 4.0)


def test_the_bench_prompts_hold_edits_of_pasted_code():
    edits = [p for p in bench.load_prompts(None, quick=False) if p["kind"] == "edit"]
    assert len(edits) >= 4
    for prompt in edits:
        assert 15 <= prompt["messages"][-1]["content"].count("\n") <= 60, prompt["name"]


def test_bad_arguments_are_one_line_errors(capsys):
    assert bench.main(["--settings", "fast"]) == 2
    assert "--settings must name greedy and/or sampled" in capsys.readouterr().err
    assert bench.main(["sampling.tempreature=1"]) == 2
    assert "did you mean 'temperature'" in capsys.readouterr().err


def test_multi_turn_reuse_encodes_only_the_new_turn(target, similar_drafter_model, tokenizer):
    from specchat.bench.turns import compare_reuse

    with_reuse, without = compare_reuse(tiny_pair(target, similar_drafter_model, tokenizer), Config(), max_new=8)
    assert with_reuse.prompt_tokens == without.prompt_tokens
    assert without.reused_tokens == 0
    assert with_reuse.reused_tokens > with_reuse.prompt_tokens // 2


def test_a_fresh_gamma_policy_per_method_plans_the_same_whatever_ran_first(
    target, similar_drafter_model, tokenizer, monkeypatch
):
    from conftest import CheapDrafterGamma

    import specchat.bench.methods

    plans: list[list[int]] = []

    class Recording(CheapDrafterGamma):  # timing-free cost ratio: plans depend only on the drafts
        def __init__(self):
            super().__init__()
            plans.append([])

        def plan(self, model=True):
            chosen = super().plan(model)
            plans[-1].append(chosen.gamma)
            return chosen

    monkeypatch.setattr(specchat.bench.methods, "AutoGamma", Recording)
    auto, fixed = Method("auto", "specchat", "spec", AUTO), Method("γ4", "specchat", "spec", 4)
    runner = Runner(tiny_pair(target, similar_drafter_model, tokenizer), [fixed, auto], "")
    greedy = bench.SamplingConfig(temperature=0.0, max_new_tokens=40)
    runner.measure(auto, PROMPTS[0], greedy)
    alone = plans[-1]
    runner.measure(fixed, PROMPTS[0], greedy)
    runner.measure(fixed, PROMPTS[1], greedy)
    runner.measure(auto, PROMPTS[0], greedy)
    assert alone and any(g > 1 for g in alone) and plans[-1] == alone


def test_rows_on_another_target_are_checked_against_that_targets_own_target_only(
    target, similar_drafter_model, tokenizer
):
    import copy

    from specchat.quant.w8a8 import quantize_w8a8
    from specchat.runtime.attention import use_batch_invariant_attention

    w8a8_target = copy.deepcopy(target)
    quantize_w8a8(w8a8_target)
    use_batch_invariant_attention(w8a8_target)
    cfg = with_value(Config(), "drafter.source", "tiny")
    methods = [m for m in default_methods(cfg, ("w8a8",)) if m.kind == "specchat"]
    assert "specchat γ4 · w8a8 target" in {m.name for m in methods}
    runner = Runner(
        tiny_pair(target, similar_drafter_model, tokenizer), methods, "", other_targets={"w8a8": w8a8_target}
    )
    rows = {(r.setting, r.method.name): r for r in bench.run_bench(runner, PROMPTS, ["greedy"], 16, lambda _: None)}
    own = rows[("greedy", "specchat target-only · w8a8 target")].measurements
    other = rows[("greedy", "specchat target-only")].measurements
    assert [m.ids for m in own] != [m.ids for m in other]  # the quantized target answers differently
    spec = rows[("greedy", "specchat γ4 · w8a8 target")]
    assert not spec.mismatches  # and γ4 on it reproduces its own target-only tokens
    assert spec.vs_target == [s.tokens_per_s / t.tokens_per_s for s, t in zip(spec.measurements, own)]


def test_bench_refuses_an_other_target_that_is_not_a_quantization(capsys):
    assert bench.main(["--other-targets", "w4a4"]) == 2
    assert "--other-targets takes quantizations" in capsys.readouterr().err


def test_target_fidelity_is_perfect_for_the_same_model_and_falls_for_another(target, tokenizer, monkeypatch):
    from specchat.bench import targets

    monkeypatch.setattr(targets, "CHUNK", 7)  # several chunks through the cache
    ids = tokenizer.encode("def reverse(lst):\n    return lst[::-1]\nThe quick brown fox")
    reference = targets.next_token_logprobs(target, ids)
    whole = torch.log_softmax(target(torch.tensor([ids])).logits[0].float(), -1)
    assert reference.shape == (len(ids), len(tokenizer)) and torch.allclose(reference, whole, atol=1e-4)
    assert targets.agreement(reference, reference) == (1.0, 0.0)
    other = targets.next_token_logprobs(build_model(len(tokenizer), seed=9, layers=1), ids)
    top1, kl = targets.agreement(reference, other)
    assert top1 < 0.5 and kl > 0.1


@pytest.mark.parametrize("compiled", [True, False])
def test_the_kv_cache_comparison_measures_bfloat16_against_float32_on_one_model(
    tokenizer, kernel, monkeypatch, compiled
):
    from specchat.bench import targets
    from specchat.loading import models
    from specchat.quant.w4a8 import quantize_w4a8
    from specchat.runtime.lean import attach_lean
    from specchat.speculative.model_io import runner

    model = build_model(len(tokenizer), seed=3, layers=2, hidden=128)
    quantize_w4a8(model, None, kernel)

    def load_model(mc, role, kv_cache):
        attach_lean(model, kernel.LeanLayers if compiled else None, kv_cache)
        return model, tokenizer, ModelFacts("tiny", "tiny", 0, "float32", "w4a8", "cpu", 0, 0.0, "", "lean")

    monkeypatch.setattr(models, "load_model", load_model)
    monkeypatch.setattr(targets, "CHUNK", 16)
    lines = []
    if not compiled:
        with pytest.raises(ConfigError, match="needs a target on the compiled layer loop"):
            targets.compare_kv_caches(Config(), 40, lines.append)
        return
    results = targets.compare_kv_caches(Config(), 40, lines.append)
    assert runner(model).kv_dtype == torch.bfloat16  # the last pass ran on bfloat16 keys and values
    assert [r["kv_cache"] for r in results] == ["float16", "bfloat16"]
    # top-1 is a float32 share: 36 of 40 reads 0.89999998. Near-ties flip on a random tiny model: seeds 1-8 gave 35
    # to 40 of 40 (KL 0.0015-0.0038); a broken cache would give KL far above 0.01.
    assert all(
        r["tokens"] == 40 and 0.85 <= r["top1"] + 1e-6 and r["top1"] <= 1.0 and 0 < r["kl"] < 0.01 for r in results
    )
    assert results[0]["kl"] < results[1]["kl"]  # float16 keeps 3 more bits of each number
    assert "float16 keys and values against float32" in lines[0] and "bfloat16 keys" in lines[1]


def test_the_lookup_ablation_variant_differs_from_the_default_levers(target, similar_drafter_model, tokenizer):
    from specchat.bench.ablation import BASELINE, variants

    def no_unquantized_drafter():
        raise AssertionError("only the drafter variant loads the unquantized drafter")

    runners = variants(
        Config(), tiny_pair(target, similar_drafter_model, tokenizer), no_unquantized_drafter, ["lookup"]
    )
    assert list(runners) == [BASELINE, "+ prompt lookup"]
    assert [r.speculation.prompt_lookup for r in runners.values()] == [False, True]


def test_only_picks_prompts_by_name_and_names_the_unknown_ones():
    names = [p["name"] for p in bench.load_prompts(None, False, "explain-gil, linked-list")]
    assert names == ["linked-list", "explain-gil"]  # the prompt set's own order
    with pytest.raises(ConfigError, match="no prompt called nope"):
        bench.load_prompts(None, False, "linked-list,nope")


def test_lookup_and_self_drafter_rows_run_exact_and_methods_filter_keeps_baselines(
    target, similar_drafter_model, tokenizer
):
    cfg = with_value(Config(), "drafter.source", "tiny")
    methods = bench.chosen_methods(default_methods(cfg, drafters=("lookup", "self:2")), "lookup,self:")
    assert [m.name for m in methods] == ["specchat target-only", "specchat lookup γ4", "specchat self:2 γ4"]
    runner = Runner(tiny_pair(target, similar_drafter_model, tokenizer), methods, "")
    rows = bench.run_bench(runner, PROMPTS, ["greedy"], max_new=16, progress=lambda label: None)
    greedy = {s["method"]: s for s in map(bench.summarise, rows)}
    assert all(s["exact"] for s in greedy.values())
    assert greedy["specchat self:2 γ4"]["alpha"] is not None  # it drafted, with the target's own layers
    assert bench.chosen_methods(methods, "") == methods


def test_a_bad_drafter_row_is_a_one_line_error(capsys):
    assert bench.main(["--drafters", "lookup,self:x"]) == 2
    assert "--drafters: " in capsys.readouterr().err

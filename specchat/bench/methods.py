"""The methods the benchmark compares, each measured on the same loaded models."""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass

import torch
from transformers import GenerationConfig

from specchat.config import AUTO, Auto, Config, Mode, SamplingConfig, SpeculationConfig, seed_for_reply, show_value
from specchat.session.chat import render_prompt
from specchat.speculative.engine import Engine, run_to_end
from specchat.speculative.gamma import AutoGamma
from specchat.speculative.model_io import input_device

SPEC_GAMMAS = (4, 6, 8, AUTO)
LLAMACPP_TARGET_ONLY = "llama.cpp target-only"
UNQUANTIZED = " · unquantized drafter"  # name suffix: transformers with the drafter as shipped
HF_GAMMAS = (4, 8)
DRAFTER_ROW_GAMMA = 4  # the lookup and self:N rows draft as many as the model row γ4


ASSISTED = "assisted"  # a Method's mode for transformers' assisted generation (beside the Modes)


@dataclass(frozen=True)
class Method:
    name: str
    kind: str  # "specchat" | "hf" | "llama.cpp"
    mode: Mode | str  # a Mode, or ASSISTED (transformers' assisted generation)
    gamma: int | Auto | str | None = None  # None: not speculative; AUTO: specchat's auto gamma; llama.cpp's "ngram"
    schedule: str = "constant"  # HF assisted: "constant" or "default" (transformers' own heuristic)
    drafter: str = "loaded"  # HF assisted: "loaded" (specchat's, as configured) or "unquantized"
    target: str = ""  # specchat: "" the configured target, else another quantization of it
    speculator: str = "model"  # specchat spec: who drafts (speculation.drafter: model | lookup | self:N)

    @property
    def baseline(self) -> str:
        """The name of the row this method is compared with (and, greedy, must match)."""
        return LLAMACPP_TARGET_ONLY if self.kind == "llama.cpp" else target_only_name(self.target)

    @property
    def gamma_label(self) -> str:
        if self.gamma is None:
            return "—" if self.schedule == "constant" else "heuristic"
        return show_value("speculation.gamma", self.gamma)


@dataclass(frozen=True)
class Measurement:
    ids: tuple[int, ...]
    new_tokens: int
    seconds: float
    alpha: float | None = None  # the acceptance rate, accepted / drafted (suite.py reads this name)
    tokens_per_step: float | None = None
    cost_ratio: float | None = None
    mean_gamma: float | None = None
    predicted: float | None = None
    steps: tuple[int, int, int] | None = None  # target steps copied, model-drafted, target-only
    split_s: tuple[float, float, float, float] | None = None  # seconds reading, copies, model drafts, target-only

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def default_methods(
    cfg: Config, other_targets: tuple[str, ...] = (), llamacpp: bool = False, drafters: tuple[str, ...] = ()
) -> list[Method]:
    """Target-only both ways; with a drafter, transformers assisted generation on the same drafter
    (and on the unquantized drafter when the config quantizes it) and specchat at several gammas.
    Each of `drafters` (lookup, self:N: no drafter model needed) adds a specchat row at γ
    DRAFTER_ROW_GAMMA. Each of `other_targets` (target quantizations) adds specchat's rows on that
    target; `llamacpp` adds llama.cpp's target-only, speculative and n-gram rows on the same GGUF files."""
    methods = [
        Method(target_only_name(""), "specchat", Mode.TARGET),
        Method("HF generate target-only", "hf", Mode.TARGET),
    ]
    if cfg.drafter.source:
        methods += _hf_assisted("loaded", "")
        if cfg.drafter.quantization != "none":
            methods += _hf_assisted("unquantized", UNQUANTIZED)
        methods += _specchat_spec("")
    methods += [_drafter_row(name) for name in drafters]
    for quantization in other_targets:
        methods.append(Method(target_only_name(quantization), "specchat", Mode.TARGET, target=quantization))
        methods += _specchat_spec(quantization) if cfg.drafter.source else []
    if llamacpp:
        from specchat.bench.llamacpp import GAMMAS, NGRAM

        methods.append(Method(LLAMACPP_TARGET_ONLY, "llama.cpp", Mode.TARGET))
        methods += [
            Method(f"llama.cpp speculative γ{g}", "llama.cpp", Mode.SPEC, g)
            for g in (GAMMAS if cfg.drafter.source else ())
        ]
        methods.append(Method("llama.cpp n-gram", "llama.cpp", Mode.SPEC, NGRAM))
    return methods


def _drafter_row(name: str) -> Method:
    """A row for one drafter: at γ DRAFTER_ROW_GAMMA, or auto γ for `auto` (its copies plan themselves)."""
    gamma = AUTO if name == "auto" else DRAFTER_ROW_GAMMA
    return Method(
        f"specchat {name} γ{show_value('speculation.gamma', gamma)}", "specchat", Mode.SPEC, gamma, speculator=name
    )


def _target_suffix(target: str) -> str:
    return f" · {target} target" if target else ""


def target_only_name(target: str) -> str:
    """The row every method on `target` is compared with."""
    return "specchat target-only" + _target_suffix(target)


def _specchat_spec(target: str) -> list[Method]:
    suffix = _target_suffix(target)
    return [
        Method(f"specchat γ{show_value('speculation.gamma', g)}{suffix}", "specchat", Mode.SPEC, g, target=target)
        for g in SPEC_GAMMAS
    ]


def _hf_assisted(drafter: str, suffix: str) -> list[Method]:
    methods = [Method(f"HF assisted γ{g}{suffix}", "hf", ASSISTED, g, drafter=drafter) for g in HF_GAMMAS]
    return methods + [Method(f"HF assisted default{suffix}", "hf", ASSISTED, None, "default", drafter)]


class Runner:
    def __init__(
        self,
        pair,
        methods: list[Method],
        system_prompt: str,
        speculation: SpeculationConfig = SpeculationConfig(),
        unquantized_drafter=None,
        other_targets: dict | None = None,
        llamacpp=None,
    ):
        self.pair = pair
        self.drafters = {"loaded": pair.drafter, "unquantized": unquantized_drafter}
        self.speculation = speculation  # drafter_vocab, draft_confidence: as configured
        self.methods = methods
        self.system_prompt = system_prompt
        self.engines = {"": Engine.for_pair(pair)}  # by Method.target
        for quantization, model in (other_targets or {}).items():
            self.engines[quantization] = Engine.for_pair(dataclasses.replace(pair, target=model))
        self._assistant_defaults = copy.deepcopy(pair.drafter.generation_config) if pair.drafter else None
        self.llamacpp = llamacpp  # a LlamaCppRunner when llama.cpp rows run

    @classmethod
    def load(cls, cfg: Config, methods: list[Method], console) -> Runner:
        from specchat.loading.models import load_model, load_pair

        unquantized = None
        with console.status("loading the model pair…") as status:

            def progress(message, fraction):
                status.update(message)

            pair = load_pair(cfg, progress)
            if any(m.drafter == "unquantized" for m in methods):
                unquantized_cfg = dataclasses.replace(cfg.drafter, quantization="none")
                unquantized = load_model(unquantized_cfg, progress, role="drafter")[0]
            others = {
                m.target: load_model(dataclasses.replace(cfg.target, quantization=m.target), progress, role="target")[0]
                for m in methods
                if m.target
            }
            llamacpp = None
            if any(m.kind == "llama.cpp" for m in methods):
                from specchat.bench.llamacpp import LlamaCppRunner

                status.update("loading the GGUF files into llama.cpp…")
                llamacpp = LlamaCppRunner(cfg, torch.get_num_threads())
        return cls(pair, methods, cfg.ui.system_prompt, cfg.speculation, unquantized, others, llamacpp)

    @property
    def engine(self):
        """The engine on the configured target."""
        return self.engines[""]

    def meta(self) -> dict:
        facts = [self.pair.target_facts, self.pair.drafter_facts]
        return {
            "target": _facts(facts[0]),
            "drafter": _facts(facts[1]) if facts[1] else None,
            "drafter_vocab": self.speculation.drafter_vocab,
            "draft_confidence": self.speculation.draft_confidence,
            "prompt_lookup": self.speculation.prompt_lookup,
            "torch_threads": torch.get_num_threads(),
            "kernel": getattr(facts[0], "kernel", ""),
        }

    def prompt_ids(self, prompt: dict) -> list[int]:
        return render_prompt(self.pair.tokenizer, self.system_prompt, prompt["messages"])

    def warm_up(self, prompt: dict, max_new: int) -> None:
        for method in self.methods:
            self.measure(method, prompt, SamplingConfig(temperature=0.0, max_new_tokens=max_new))

    def measure(self, method: Method, prompt: dict, sampling: SamplingConfig) -> Measurement:
        return self.measure_ids(method, self.prompt_ids(prompt), sampling)

    def measure_ids(self, method: Method, ids: list[int], sampling: SamplingConfig) -> Measurement:
        """One method's reply to a prompt given as token ids (its own prefill included)."""
        if method.kind == "specchat":
            return self._specchat(method, ids, sampling)
        if method.kind == "llama.cpp":
            new, seconds = self.llamacpp.generate(ids, sampling, self.pair.eos_ids, method.gamma)
            return Measurement(new, len(new), seconds)
        return self._hf(method, ids, sampling)

    def _specchat(self, method: Method, ids: list[int], sampling: SamplingConfig) -> Measurement:
        engine = self.engines[method.target]
        engine.reset()  # every method pays its own prefill, as generate() does
        engine.use_policy(AutoGamma())  # and learns alone: no method trains the next one's auto gamma
        speculation = dataclasses.replace(
            self.speculation, gamma=method.gamma or 0, mode=method.mode, drafter=method.speculator
        )
        done = run_to_end(engine.steps(ids, sampling, speculation))
        s = done.stats
        spec = method.mode == Mode.SPEC
        return Measurement(
            done.ids,
            s.new_tokens,
            s.wall_s,
            s.acceptance_rate if spec else None,
            s.tokens_per_step,
            s.cost_ratio if spec else None,
            s.mean_gamma if spec else None,
            s.predicted_speedup if spec else None,
            (s.copied_steps, s.model_steps, s.target_only_steps) if spec else None,
            (s.prefill_s, s.copy_s, s.model_s, s.target_only_s) if spec else None,
        )

    def _hf(self, method: Method, ids: list[int], sampling: SamplingConfig) -> Measurement:
        kwargs = {}
        if method.mode == ASSISTED:
            kwargs["assistant_model"] = self.drafters[method.drafter]
            self._configure_assistant(method, kwargs["assistant_model"])
        device = input_device(self.pair.target)
        input_ids = torch.tensor([ids], device=device)
        torch.manual_seed(seed_for_reply(sampling.seed))
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.pair.target.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=self._generation_config(sampling),
                **kwargs,
            )
        if out.is_cuda:
            torch.cuda.synchronize(out.device)  # the clock stops when the GPU is done, not when it was asked
        seconds = time.perf_counter() - start
        new = tuple(out[0, len(ids) :].tolist())
        return Measurement(new, len(new), seconds)

    def _generation_config(self, sampling: SamplingConfig) -> GenerationConfig:
        eos = sorted(self.pair.eos_ids)
        common = dict(max_new_tokens=sampling.max_new_tokens, eos_token_id=eos, pad_token_id=eos[0])
        if sampling.is_greedy:
            return GenerationConfig(do_sample=False, **common)
        return GenerationConfig(
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k or None,
            **common,
        )

    def _configure_assistant(self, method: Method, drafter) -> None:
        config = copy.deepcopy(self._assistant_defaults)
        if method.schedule == "constant":
            config.num_assistant_tokens = method.gamma
            config.num_assistant_tokens_schedule = "constant"
            config.assistant_confidence_threshold = 0.0  # draft exactly gamma tokens, like specchat
        drafter.generation_config = config


def _facts(facts) -> dict:
    return {
        "name": facts.name,
        "params": facts.params,
        "dtype": facts.dtype,
        "quantization": facts.quantization,
        "device": facts.device,
    }

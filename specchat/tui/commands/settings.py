"""The setting commands: sampling (/temp, /top_k, /stop, ...), who writes and drafts (/mode, /drafter, /gamma),
and any key at all (/config, /set)."""

from __future__ import annotations

import re

from specchat.config import MODES, Mode
from specchat.safe_text import visible
from specchat.session.chat import ChatSession
from specchat.settings import all_keys, as_flat_dict, set_from_text, with_value
from specchat.speculative.drafters import registry as kinds
from specchat.speculative.drafters.registry import drafter_needed
from specchat.tui import render
from specchat.tui.commands.races import cmd_compare
from specchat.tui.commands.registry import Command, Outcome, fail
from specchat.tui.commands.values import apply_setting, setting_command, show_or_set, shown

START_UP_KEYS = (
    "speculation.extra_eos",
    "runtime.kernel",
    "runtime.kv_cache",
)  # used when the models load, not per reply
GAMMA_DETAILS = (
    "α: the chance the target accepts one draft it judges (accepted ÷ (accepted + rejections); /stats "
    "'α per draft'). c: one drafter forward's time ÷ one target forward's (/stats 'cost c'). A step of γ drafts "
    "yields (1 − α^(γ+1)) ÷ (1 − α) tokens on average and costs γ·c + 1 target forwards' time (Leviathan et al.); "
    "auto measures α and c as the chat runs and picks the γ with the most tokens per unit time each step, 0 (a "
    "target-only step, magenta) when drafting does not pay."
)


def cmd_temp(session: ChatSession, arg: str) -> Outcome:
    if not arg:
        current = session.config.sampling.temperature
        return Outcome(f"sampling.temperature is {current} (usage: /temp X, 0 = greedy)")
    config = set_from_text(session.config, "sampling.temperature", arg)
    temperature = config.sampling.temperature
    if temperature > 0:
        config = with_value(config, "sampling.greedy", False)
    session.config = config
    if temperature == 0:
        return Outcome("temperature 0: greedy decoding")
    return Outcome(f"sampling at temperature {temperature}")


def cmd_greedy(session: ChatSession, arg: str) -> Outcome:
    session.config = with_value(session.config, "sampling.greedy", True)
    return Outcome("greedy decoding (argmax); /sample switches back to sampling")


def cmd_sample(session: ChatSession, arg: str) -> Outcome:
    config = with_value(session.config, "sampling.greedy", False)
    if config.sampling.temperature == 0:
        config = with_value(config, "sampling.temperature", 0.7)
    session.config = config
    s = config.sampling
    min_p = f", min-p {s.min_p:g}" if s.min_p else ""
    penalties = penalty_text(s)
    return Outcome(
        f"sampling at temperature {s.temperature}, top-k {s.top_k or 'off'}, top-p {s.top_p}{min_p}{penalties}"
    )


def penalty_text(s) -> str:
    """`, repeat penalty 1.1, presence penalty 0.5` for the penalties set, else ''."""
    parts = [f"repeat penalty {s.repeat_penalty:g}"] if s.repeat_penalty != 1.0 else []
    parts += [f"presence penalty {s.presence_penalty:g}"] if s.presence_penalty else []
    return "".join(f", {part}" for part in parts)


def cmd_stop(session: ChatSession, arg: str) -> Outcome:
    """/stop TEXT adds a stop text, /stop off drops them all, /stop lists them."""
    stops = session.config.sampling.stop
    if not arg:
        listed = ", ".join(repr(visible(text)) for text in stops) or "none"
        return Outcome(f"stop texts: {listed} (usage: /stop TEXT adds one, /stop off drops them)")
    wanted = () if arg == "off" else (*stops, arg) if arg not in stops else stops
    session.config = with_value(session.config, "sampling.stop", wanted)
    return Outcome(f"a reply ends before {repr(visible(arg))}" if wanted else "no stop texts")


def cmd_mode(session: ChatSession, arg: str) -> Outcome:
    if arg and drafter_needed(session.has_drafter, arg, drafter=session.config.speculation.drafter):
        possible = (
            "target, or spec after /drafter lookup" if arg == Mode.SPEC else "target, and spec with /drafter lookup"
        )
        return fail(f"/mode: '{arg}' needs a drafter model, and none is loaded; possible: {possible}")
    outcome = show_or_set(session, "mode", "speculation.mode", "spec|target|drafter", arg)
    if not arg:
        return outcome
    ui = session.config.ui
    legend = render.Legend(session.config.speculation.mode, ui.show_rejected, ui.origin_marks)
    return Outcome(render.group(render.Text(outcome.message), legend))


def cmd_drafter(session: ChatSession, arg: str) -> Outcome:
    if arg == "model" and not session.has_drafter:
        return fail("/drafter: no drafter model is loaded; lookup or self:N (no second model) is possible")
    problem = session.engine.drafter_problem(arg) if arg and kinds.parse(arg) else None
    if problem:
        return fail(f"/drafter: {problem}")
    return show_or_set(session, "drafter", "speculation.drafter", kinds.usage(), arg)


def cmd_config(session: ChatSession, arg: str) -> Outcome:
    rows = [(key, shown(key, value)) for key, value in as_flat_dict(session.config).items()]
    rows.append(("(context)", f"{session.context_used}/{session.context_limit} tokens used"))
    return Outcome(render.as_table(rows, ("setting", "value")))


def split_key_value(arg: str) -> tuple[str, str]:
    """'key value' or 'key=value' -> (key, value); an '=' inside the value stays in it."""
    key, value = re.match(r"([^\s=]*)\s*(?:=\s*)?(.*)", arg, re.DOTALL).groups()
    return key, value


def cmd_set(session: ChatSession, arg: str) -> Outcome:
    key, value = split_key_value(arg)
    if not key or not value.strip():
        return fail("/set: usage /set section.key VALUE (e.g. /set sampling.top_k 40; /config lists keys)")
    if key in all_keys() and (key.split(".")[0] in ("target", "drafter") or key in START_UP_KEYS):
        return fail(
            f"/set: {key} is read once, when the models load; restart with `python infer.py {key}={value.strip()}`"
        )
    if key in ("speculation.mode", "speculation.compare"):
        return (cmd_mode if key == "speculation.mode" else cmd_compare)(session, value.strip())
    outcome = apply_setting(session, key, value)
    limit = session.config.ui.context_limit
    if key == "ui.context_limit" and limit > session.model_context_limit:
        return Outcome(
            f"{outcome.message} (capped at {session.model_context_limit}, the limit the models were loaded with)"
        )
    return outcome


def setting_commands() -> list[Command]:
    return [
        setting_command(
            "gamma",
            "speculation.gamma",
            "N|auto",
            "drafted tokens per step, 0-16 (0 = target-only steps; auto adapts to α and c)",
            {"auto": None, **{str(n): None for n in (1, 2, 3, 4, 6, 8)}},
            details=GAMMA_DETAILS,
        ),
        Command("temp", "X", "sampling temperature, 0-5 (0 = greedy)", cmd_temp),
        setting_command("top_k", "sampling.top_k", "N", "keep the N most likely tokens (0 = off)"),
        setting_command("top_p", "sampling.top_p", "X", "nucleus sampling mass in (0, 1] (1 = off)"),
        Command("stop", "TEXT|off", "end a reply before TEXT (a stop string; off drops them all)", cmd_stop),
        setting_command(
            "min_p", "sampling.min_p", "X", "keep tokens at least X times as likely as the most likely (0 = off)"
        ),
        setting_command(
            "repeat_penalty",
            "sampling.repeat_penalty",
            "X",
            "the ids of the last 64: a logit divided by X if positive, else multiplied (1 = off; llama.cpp's)",
        ),
        setting_command(
            "presence_penalty",
            "sampling.presence_penalty",
            "X",
            "subtract X from the logits of the last 64 ids (0 = off)",
        ),
        Command("greedy", "", "always take the most likely token", cmd_greedy),
        Command("sample", "", "sample with the temperature/top-k/top-p settings", cmd_sample),
        setting_command(
            "max",
            "sampling.max_new_tokens",
            "N|off",
            "most new tokens per reply (off or 0 = no cap: to the end of the turn or the context window)",
            {"off": None, "256": None, "1024": None},
        ),
        setting_command(
            "seed",
            "sampling.seed",
            "N|random",
            "sampling seed (random = fresh each reply)",
            {"random": None, "0": None},
        ),
        Command(
            "mode",
            "spec|target|drafter",
            "who writes: speculative, the target alone, the drafter alone",
            cmd_mode,
            dict.fromkeys(MODES),
        ),
        Command(
            "drafter",
            kinds.usage(),
            "who drafts: " + "; ".join(f"{kind.usage}, {kind.help}" for kind in kinds.KINDS),
            cmd_drafter,
            dict.fromkeys(kind.name + (":4" if kind.argument else "") for kind in kinds.KINDS),
        ),
        Command("config", "", "every current setting", cmd_config),
        Command(
            "set",
            "KEY VALUE",
            "set any config key, e.g. /set sampling.top_k 40",
            cmd_set,
            {key: None for key in all_keys()},
        ),
    ]

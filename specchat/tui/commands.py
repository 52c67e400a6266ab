"""Slash-commands: one registry gives dispatch, /help and tab-completion.

A handler takes the ChatSession and the argument text and returns an Outcome. Settings change only
through specchat.config (with_value / set_from_text), so a bad value is refused with one line naming
what is allowed, and nothing changes.
"""

from __future__ import annotations

import difflib
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prompt_toolkit.completion import CompleteEvent, Completer, Completion, NestedCompleter, PathCompleter
from prompt_toolkit.document import Document
from rich.table import Table

from specchat import drafter_kinds
from specchat.config import (
    MODES,
    VIEWS,
    WORD_SETTINGS,
    ConfigError,
    Mode,
    all_keys,
    as_flat_dict,
    drafter_needed,
    get_value,
    set_from_text,
    show_value,
    with_value,
)
from specchat.safe_text import visible
from specchat.session.chat import ChatError, ChatSession
from specchat.session.drafter_race import (
    NO_DRAFTER,
    RACE_RUNS,
    Contender,
    RaceRun,
    drafter_contenders,
    gamma_contenders,
    parse_gammas,
    race,
    race_seconds,
)
from specchat.speculative.gamma import AutoGamma, gamma_curve
from specchat.tui import render, stats_view
from specchat.tui.compare_view import RaceSubject, race_view
from specchat.tui.reply_view import OriginView, code_blocks, markdown_view
from specchat.tui.trace import write_trace
from specchat.tui.transcript import load_transcript, save_transcript
from specchat.tui.why_view import why

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
SUGGEST_CUTOFF = 0.6  # difflib ratio: /gama → /gamma, /comapre → /compare; not /clear → /compare or /load → /mode
OTHER_CHATS = {  # what other chats call a command specchat has under another name: described, never guessed
    "clear": "to forget the conversation: /reset, which cannot be undone",
    "new": "to forget the conversation: /reset, which cannot be undone",
    "bye": "to leave: /quit or Ctrl-D",
}
KEYS_HELP = "keys: Esc-Enter new line · Ctrl-C cancels a reply · F2 / Ctrl-T toggles compare · Ctrl-D quits"


@dataclass(frozen=True)
class Outcome:
    message: Any = None  # a str or a rich renderable
    error: bool = False
    quit: bool = False
    work: Callable[[threading.Event], Iterator[Any]] | None = None  # a long job the REPL runs after the
    # message, drawing what it yields (progress lines, then its result); Ctrl-C sets the event
    stream: Callable[[threading.Event], Iterator[Any]] | None = None  # a reply's events (/retry), drawn as a reply
    clipboard: Clip | None = None  # a block the user asked to copy (/copy): to the terminal (OSC 52), else a file
    prefill: str | None = None  # the text the next prompt starts with, to edit (/edit N)


@dataclass(frozen=True)
class Clip:
    block: Any  # reply_view.CodeBlock
    label: str  # "code block 2 of 3 (14 lines)"
    stem: str  # the file name, less its extension, where the output is not a terminal


Handler = Callable[[ChatSession, str], Outcome]


@dataclass(frozen=True)
class Command:
    name: str
    args: str
    help: str
    handler: Handler
    complete: Any = None  # NestedCompleter value: dict, set, Completer or None
    aliases: tuple[str, ...] = ()
    destructive: bool = False  # discards state (the conversation, a reply, a file, the session): never a guess
    details: str = ""  # more, shown by /help NAME only


def fail(message: str) -> Outcome:
    return Outcome(message, error=True)


class Registry:
    def __init__(self, commands: list[Command]):
        help_command = Command(
            "help", "[COMMAND]", "list commands, or describe one", self._help, {f"{c.name}": None for c in commands}
        )
        self.commands = [help_command, *commands]
        self._by_name: dict[str, Command] = {}
        for command in self.commands:
            for name in (command.name, *command.aliases):
                self._by_name[name] = command

    def names(self) -> list[str]:
        return list(self._by_name)

    def find(self, name: str) -> Command | None:
        return self._by_name.get(name.lstrip("/").lower())

    def suggest(self, name: str) -> str | None:
        """The closest harmless command to a mistyped one: a guess that discards state is never offered."""
        harmless = [n for n in self.names() if not self._by_name[n].destructive]
        close = difflib.get_close_matches(name.lstrip("/").lower(), harmless, n=1, cutoff=SUGGEST_CUTOFF)
        return close[0] if close else None

    def run(self, session: ChatSession, line: str) -> Outcome:
        """Run one input line that starts with '/'."""
        name, _, arg = line.strip().partition(" ")
        command = self.find(name)
        if command is None:
            guess = self.suggest(name)
            hint = f" — did you mean /{guess}?" if guess else ""
            elsewhere = OTHER_CHATS.get(name.lstrip("/").lower())
            hint = f"; {elsewhere}" if elsewhere and not guess else hint
            return fail(f"unknown command {name}{hint} (/help lists every command)")
        try:
            return command.handler(session, arg.strip())
        except (ConfigError, ChatError) as err:
            return fail(f"/{command.name}: {err}")

    def _help(self, session: ChatSession, arg: str) -> Outcome:
        if not arg:
            return Outcome(render.group(self.help_table(), render.Text(KEYS_HELP)))
        command = self.find(arg)
        if command is None:
            return fail(f"/help: no command {arg} (/help lists every command)")
        line = f"/{command.name} {command.args} — {command.help}".replace("  —", " —")
        return Outcome(line + (f"\n{command.details}" if command.details else ""))

    def help_table(self) -> Table:
        rows = []
        for command in self.commands:
            names = ", ".join(f"/{n}" for n in (command.name, *command.aliases))
            rows.append((f"{names} {command.args}".rstrip(), command.help))
        return render.as_table(rows, ("command", "what it does"))

    def completion_tree(self) -> dict[str, Any]:
        return {f"/{name}": command.complete for name, command in self._by_name.items()}

    def completer(self) -> SlashCompleter:
        helps = {f"/{name}": command.help for name, command in self._by_name.items()}
        return SlashCompleter(self.completion_tree(), helps)


class SlashCompleter(Completer):
    """Completes '/name' (with its help as meta), then each command's arguments."""

    def __init__(self, tree: dict[str, Any], helps: dict[str, str]):
        self.names = list(tree)
        self.helps = helps
        self.arguments = NestedCompleter.from_nested_dict(tree)

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterator[Completion]:
        text = document.text_before_cursor.lstrip()
        if not text.startswith("/"):
            return
        if " " in text:
            yield from self.arguments.get_completions(document, complete_event)
            return
        for name in self.names:
            if name.startswith(text.lower()):
                yield Completion(name, start_position=-len(text), display_meta=self.helps.get(name, ""))


# ----- settings helpers -----------------------------------------------------------------------------
def shown(key: str, value: Any) -> str:
    if key in WORD_SETTINGS:
        return show_value(key, value)
    if key == "sampling.max_new_tokens" and value == 0:
        return "off (no cap: to the end of the turn or the context window)"
    if isinstance(value, bool):
        return "on" if value else "off"
    return repr(value) if isinstance(value, str) else str(value)


def apply_setting(session: ChatSession, key: str, text: str) -> Outcome:
    """Set one key from user text; the session keeps its old config if the value is bad."""
    session.config = set_from_text(session.config, key, text)
    return Outcome(f"{key} = {shown(key, get_value(session.config, key))}")


def show_or_set(session: ChatSession, name: str, key: str, args: str, arg: str) -> Outcome:
    """No argument shows the current value; an argument sets it."""
    if not arg:
        return Outcome(f"{key} is {shown(key, get_value(session.config, key))} (usage: /{name} {args})")
    return apply_setting(session, key, arg)


def setting_command(name: str, key: str, args: str, help_text: str, complete: Any = None, details: str = "") -> Command:
    def handler(session: ChatSession, arg: str) -> Outcome:
        return show_or_set(session, name, key, args, arg)

    return Command(name, args, help_text, handler, complete, details=details)


# ----- handlers ------------------------------------------------------------------------------------
def cmd_quit(session: ChatSession, arg: str) -> Outcome:
    return Outcome(quit=True)


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
    problem = session.engine.drafter_problem(arg) if arg and drafter_kinds.parse(arg) else None
    if problem:
        return fail(f"/drafter: {problem}")
    return show_or_set(session, "drafter", "speculation.drafter", drafter_kinds.usage(), arg)


def cmd_compare_drafters(session: ChatSession) -> Outcome:
    if not session.records:
        return fail("/compare: no reply yet: /compare drafters reruns the last prompt with each drafter")
    ways = drafter_contenders(session)
    subject = RaceSubject(current=session.config.speculation.drafter)
    return race_outcome(session, ways, subject, "drafters", f"{len(ways)} ways ({', '.join(w.name for w in ways)})")


def cmd_compare_gamma(session: ChatSession, arg: str) -> Outcome:
    if not session.records:
        return fail("/compare: no reply yet: /compare gamma reruns the last prompt at each γ")
    if not session.has_drafter and drafter_kinds.needs_model(session.config.speculation.drafter):
        return fail("/compare gamma: the drafter model is not loaded; pick another with /drafter lookup or self:N")
    try:
        gammas = parse_gammas(arg)
    except ValueError as err:
        return fail(f"/compare gamma: {err}")
    ways = gamma_contenders(session, gammas)
    gamma = session.config.speculation.gamma
    subject = RaceSubject("γ", str(gamma), "/gamma", "γ ")
    listed = ", ".join(way.name for way in ways[1:])
    return race_outcome(session, ways, subject, "gamma", f"γ {listed} and the target alone, greedy,", greedy=True)


def race_outcome(
    session: ChatSession, ways: list[Contender], subject: RaceSubject, what: str, listed: str, greedy: bool = False
) -> Outcome:
    """The race's first line (what runs, about how long it takes) and its work."""
    seconds = race_seconds(session, len(ways))
    return Outcome(
        f"racing {listed} on the last prompt, {RACE_RUNS} short runs each: about {duration_text(seconds)}; "
        f"Ctrl-C stops",
        work=lambda cancel: race_lines(session, cancel, ways, subject, what, greedy),
    )


def duration_text(seconds: float) -> str:
    """`40 s`, `3 min`."""
    return f"{max(1, round(seconds))} s" if seconds < 90 else f"{round(seconds / 60)} min"


def race_lines(
    session: ChatSession, cancel: threading.Event, ways: list[Contender], subject: RaceSubject, what: str, greedy: bool
) -> Iterator[Any]:
    """/compare drafters or gamma as it runs: one line per finished run, then the table (or why not)."""
    total, finished, results = len(ways) * RACE_RUNS, 0, []
    for item in race(session, cancel, ways=ways, greedy=greedy):
        if isinstance(item, RaceRun):
            results.append(item)
            continue
        finished += 1
        yield f"  {finished}/{total} {subject.label if item[0] != NO_DRAFTER else ''}{item[0]}: " + (
            f"{item[1].generation_tokens_per_s:.1f} tok/s"
        )
    yield race_view(results, subject) if finished == total else f"/compare {what}: cancelled; nothing changed"


def cmd_compare(session: ChatSession, arg: str) -> Outcome:
    if arg == "drafters":
        return cmd_compare_drafters(session)
    if arg.split(" ", 1)[0] == "gamma":
        return cmd_compare_gamma(session, arg[len("gamma") :].strip())
    if arg and drafter_needed(session.has_drafter, Mode.TARGET, arg):
        return fail("/compare: 'drafter' needs a drafter model, and none is loaded; use /compare on")
    outcome = show_or_set(session, "compare", "speculation.compare", "on|off|drafter", arg)
    if arg and session.compare_fn is None and session.config.speculation.compare != "off":
        return Outcome(f"{outcome.message} (recorded; this build has no side-by-side runner yet)")
    return outcome


def cmd_show(session: ChatSession, arg: str) -> Outcome:
    subject, _, value = arg.partition(" ")
    if subject != "rejected":
        return fail("/show: usage /show rejected on|off")
    if not value:
        return Outcome(f"ui.show_rejected is {shown('ui.show_rejected', session.config.ui.show_rejected)}")
    if value.strip().lower() not in ("on", "off"):
        return fail(f"/show rejected: must be on or off, got '{value.strip()}'")
    return apply_setting(session, "ui.show_rejected", value)


def cmd_stats(session: ChatSession, arg: str) -> Outcome:
    if not session.records:
        return Outcome("no reply yet: /stats describes the last reply")
    from specchat.kernels.build import running_path

    policy, speculation = getattr(session.engine, "policy", None), session.config.speculation
    drafting = isinstance(policy, AutoGamma) and speculation.mode is Mode.SPEC
    curve = gamma_curve(policy) if drafting else None
    detail = stats_view.stats_detail(session.records[-1], session.totals, running_path(), curve, speculation.gamma)
    return Outcome(detail)


def cmd_system(session: ChatSession, arg: str) -> Outcome:
    if not arg:
        return Outcome(f"system prompt: {session.system_prompt!r} (usage: /system TEXT)")
    session.config = with_value(session.config, "ui.system_prompt", arg)
    return Outcome("system prompt set; it applies from the next reply")


def cmd_reset(session: ChatSession, arg: str) -> Outcome:
    session.reset()
    return Outcome("conversation cleared (settings and session totals kept)")


def cmd_history(session: ChatSession, arg: str) -> Outcome:
    if not session.messages:
        return Outcome("no messages yet")
    cut = [r.cut_mark for r in session.records]
    rows = [("system", session.system_prompt)]
    # the records keep every reply; the messages lost the oldest turns dropped for context
    assistant_index = len(cut) - sum(1 for m in session.messages if m["role"] == "assistant")
    number = 0
    for message in session.messages:
        text, role = message["content"], message["role"]
        if role == "assistant":
            text += f" {cut[assistant_index]}" if cut[assistant_index] else ""
            assistant_index += 1
        else:
            number += 1
            role = f"user {number}"  # what /edit N takes
        rows.append((role, text))
    return Outcome(render.as_table(rows, ("role", "message")))


def save_command(overwrite: bool) -> Handler:
    """/save (refuses an existing file) or /save! (replaces it)."""

    def cmd_save(session: ChatSession, arg: str) -> Outcome:
        if not arg:
            return fail(
                f"/save{'!' if overwrite else ''}: usage /save PATH.md, PATH.txt or PATH.json "
                f"(/save! PATH replaces an existing file)"
            )
        path = save_transcript(session, arg, overwrite)
        return Outcome(f"saved {len(session.records)} replies to {path}")

    return cmd_save


def cmd_undo(session: ChatSession, arg: str) -> Outcome:
    record, _pair = session.undo()
    return Outcome(
        f"dropped the last exchange ({visible(record.user)[:40]!r} and its reply); {len(session.records)} left"
    )


def cmd_retry(session: ChatSession, arg: str) -> Outcome:
    if not session.records or not session.messages or session.messages[-1]["role"] != "assistant":
        return fail("/retry: no reply to retry yet")
    sampling = session.config.sampling
    seed = "greedy: the same tokens unless a setting changed" if sampling.is_greedy else "a fresh seed"
    return Outcome(f"answering the last message again ({seed})", stream=session.retry)


def cmd_edit(session: ChatSession, arg: str) -> Outcome:
    number_text, _, text = arg.partition(" ")
    messages = session.user_messages()
    if not number_text.isdigit():
        usage = "/edit N [TEXT]: change your message N (numbered in /history) and answer it again"
        return fail(f"{usage}; there are {len(messages)}" if messages else f"{usage}; no message yet")
    number = int(number_text)
    if not 1 <= number <= len(messages):
        return fail(f"/edit: no message {number}: the conversation has {len(messages)} (see /history)")
    later = len(messages) - number
    exchanges = "the later exchange" if later == 1 else f"the {later} later exchanges"
    if not text.strip():
        dropped = f"{exchanges} will be dropped" if later else "it is the last"
        return Outcome(
            f"editing message {number}: change it and press Enter ({dropped}; Ctrl-C leaves the chat as it is)",
            prefill=f"/edit {number} {messages[number - 1]}",
        )
    said = f"{exchanges} {'is' if later == 1 else 'are'} dropped" if later else "it was the last"
    return Outcome(
        f"answering your edited message {number} ({said})",
        stream=lambda cancel: session.edit(number, text.strip(), cancel),
    )


def cmd_load(session: ChatSession, arg: str) -> Outcome:
    if not arg:
        return fail("/load: usage /load PATH.json (a transcript /save PATH.json wrote)")
    turns = load_transcript(session, arg)
    return Outcome(
        f"loaded {turns} exchanges, the system prompt and the settings from {arg}; "
        f"the next reply reads the whole conversation"
    )


def cmd_view(session: ChatSession, arg: str) -> Outcome:
    if arg not in VIEWS:
        return fail(f"/view: usage /view {'|'.join(VIEWS)} (now {session.config.ui.view})")
    session.config = with_value(session.config, "ui.view", arg)
    if not session.records:
        return Outcome(f"ui.view = {arg}: replies show as {arg} once done")
    record = session.records[-1]
    if arg == "markdown":
        return Outcome(
            render.group(render.Text("ui.view = markdown; the last reply:", style="dim"), markdown_view(record.text))
        )
    if not record.tokens:
        return Outcome(
            render.group(
                render.Text("ui.view = origin; the last reply (loaded: its origins were not saved):", style="dim"),
                render.Text(visible(record.text)),
            )
        )
    return Outcome(
        render.group(render.Text("ui.view = origin; the last reply:", style="dim"), OriginView(record.tokens))
    )


def cmd_copy(session: ChatSession, arg: str) -> Outcome:
    blocks = code_blocks(session.records[-1].text) if session.records else []
    if not blocks:
        return fail("/copy: the last reply has no code block" if session.records else "/copy: no reply yet")
    first, _, rest = arg.partition(" ")
    number, path = (int(first), rest.strip()) if first.isdigit() else (1, arg.strip())
    if not 1 <= number <= len(blocks):
        return fail(f"/copy: N must be from 1 to {len(blocks)} (the last reply's code blocks)")
    block = blocks[number - 1]
    label = f"code block {number} of {len(blocks)} ({block.code.count(chr(10)) + 1} lines)"
    if path:
        return Outcome(f"wrote {label} to {write_block(block, path)}")
    return Outcome(
        f"copied {label} to the clipboard (OSC 52; where the terminal does not take it, "
        f"/copy {number} PATH writes a file)",
        clipboard=Clip(block, label, f"specchat-block-{number}"),
    )


def write_free_name(block, stem: str) -> str:
    """`block` to ./STEM.EXT, or ./STEM-2.EXT and so on where that name is taken."""
    from pathlib import Path

    for n in range(1, 1000):
        name = f"{stem}{'' if n == 1 else f'-{n}'}.{block.extension}"
        if not Path(name).exists():
            return write_block(block, name)
    raise ChatError(f"cannot find a free name like {stem}.{block.extension} here; use /copy N PATH")


def write_block(block, path_text: str) -> str:
    from pathlib import Path

    from specchat.fileio import write_text_atomic

    path = Path(path_text).expanduser()
    try:
        write_text_atomic(path, block.code + "\n", overwrite=False)
    except FileExistsError:
        raise ChatError(f"{path} exists; choose another name") from None
    except (OSError, ValueError) as err:
        raise ChatError(f"cannot write '{path_text}': {getattr(err, 'strerror', None) or err}") from None
    return str(path)


def cmd_why(session: ChatSession, arg: str) -> Outcome:
    try:
        return Outcome(why(session, arg.strip()))
    except ValueError as err:
        return fail(str(err))


def trace_command(overwrite: bool) -> Handler:
    """/trace (refuses an existing file) or /trace! (replaces it)."""

    def cmd_trace(session: ChatSession, arg: str) -> Outcome:
        path, lines = write_trace(session, arg, overwrite)
        return Outcome(f"wrote {lines} token records to {path}")

    return cmd_trace


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


def build_registry() -> Registry:
    """Every command: the settings and views first, then the conversation's verbs and files."""
    return Registry(setting_commands() + conversation_commands())


def cmd_legend(session: ChatSession, arg: str) -> Outcome:
    ui = session.config.ui
    return Outcome(render.Legend(session.config.speculation.mode, ui.show_rejected, ui.origin_marks))


def cmd_stop(session: ChatSession, arg: str) -> Outcome:
    """/stop TEXT adds a stop text, /stop off drops them all, /stop lists them."""
    stops = session.config.sampling.stop
    if not arg:
        listed = ", ".join(repr(visible(text)) for text in stops) or "none"
        return Outcome(f"stop texts: {listed} (usage: /stop TEXT adds one, /stop off drops them)")
    wanted = () if arg == "off" else (*stops, arg) if arg not in stops else stops
    session.config = with_value(session.config, "sampling.stop", wanted)
    return Outcome(f"a reply ends before {repr(visible(arg))}" if wanted else "no stop texts")


def setting_commands() -> list[Command]:
    on_off = {"on": None, "off": None}
    return [
        Command("quit", "", "leave specchat (also Ctrl-D)", cmd_quit, aliases=("exit",), destructive=True),
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
        Command("legend", "", "what each colour (or bracket) of the stream means", cmd_legend),
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
            "compare",
            "on|off|drafter|drafters|gamma [LIST]",
            "also run each prompt target-only (or drafter-only) side by side; drafters: race every "
            "drafter on the last prompt; gamma 1,2,4,auto: race those γs on it (greedy)",
            cmd_compare,
            {**on_off, "drafter": None, "drafters": None, "gamma": None},
        ),
        Command(
            "drafter",
            drafter_kinds.usage(),
            "who drafts: " + "; ".join(f"{kind.usage}, {kind.help}" for kind in drafter_kinds.KINDS),
            cmd_drafter,
            dict.fromkeys(kind.name + (":4" if kind.argument else "") for kind in drafter_kinds.KINDS),
        ),
        Command(
            "show", "rejected on|off", "show rejected drafts dim and struck through", cmd_show, {"rejected": on_off}
        ),
        Command("stats", "", "the last reply in detail, and session totals", cmd_stats),
        Command("why", "[N]", "the last reply's rejected drafts: p, q, min(1, p/q), each model's top 5", cmd_why),
        Command(
            "trace",
            "[all] PATH.jsonl",
            "write each token's origin, draft source, p and q as JSON lines (last reply, or all); "
            "never over an existing file",
            trace_command(False),
            PathCompleter(expanduser=True),
        ),
        Command(
            "trace!",
            "[all] PATH.jsonl",
            "/trace, replacing PATH if it exists",
            trace_command(True),
            PathCompleter(expanduser=True),
            destructive=True,
        ),
        Command("system", "TEXT", "set the system prompt (no text: show it)", cmd_system),
        Command("reset", "", "forget the conversation", cmd_reset, destructive=True),
    ]


def conversation_commands() -> list[Command]:
    return [
        Command("history", "", "show the conversation", cmd_history),
        Command(
            "retry",
            "",
            "answer the last message again with the current settings (a fresh seed when sampling)",
            cmd_retry,
            destructive=True,
        ),
        Command("undo", "", "drop the last exchange (your message and its reply)", cmd_undo, destructive=True),
        Command(
            "edit",
            "N [TEXT]",
            "change your message N (numbered in /history) and answer it again; the exchanges after it are dropped",
            cmd_edit,
            destructive=True,
        ),
        Command(
            "load",
            "PATH.json",
            "reopen a saved .json transcript: the conversation, system prompt and settings",
            cmd_load,
            PathCompleter(expanduser=True),
            destructive=True,
        ),
        Command(
            "view",
            "markdown|origin",
            "show the last reply (and later ones) as Markdown with highlighted code, or coloured by origin",
            cmd_view,
            {"markdown": None, "origin": None},
        ),
        Command(
            "copy",
            "[N] [PATH]",
            "the last reply's Nth code block (default 1) to the clipboard (OSC 52), or to PATH",
            cmd_copy,
            PathCompleter(expanduser=True),
        ),
        Command(
            "save",
            "PATH",
            "save the transcript with each reply's stats (.md or .json); never over an existing file",
            save_command(False),
            PathCompleter(expanduser=True),
        ),
        Command(
            "save!",
            "PATH",
            "/save, replacing PATH if it exists",
            save_command(True),
            PathCompleter(expanduser=True),
            destructive=True,
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

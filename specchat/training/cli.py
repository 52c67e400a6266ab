"""`specchat train-drafter`: a draft head for the target, trained here on text found offline, within a time budget,
resumable, with its acceptance on held-out text at the end. The chat's `head` drafter then drafts with it."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from specchat.config import ConfigError
from specchat.errors import ModelLoadError
from specchat.loading.draft_head import draft_head_path, head_from_record, head_record
from specchat.progress import to_stderr
from specchat.settings import load_config
from specchat.speculative import model_io
from specchat.speculative.drafters.head import FeatureHead
from specchat.speculative.drafters.vocab import DraftVocab
from specchat.training.head_training import (
    CHUNK,
    agreement,
    batch,
    default_sources,
    output_rows,
    target_states,
    text_files,
    token_chunks,
    train_on,
)

HELD_OUT = 8  # chunks kept apart for the report: every tenth chunk, up to this many
SAVE_EVERY = 20  # chunks between checkpoints


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="specchat train-drafter",
        description="Train a draft head for the target (the `head` drafter) on text on this machine.",
    )
    parser.add_argument(
        "items",
        nargs="*",
        metavar="SOURCE or section.key=value",
        help="folders or files of text (default: Python's standard library), and config overrides",
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="the time budget (default 30)")
    parser.add_argument("--config", help="model pair TOML (default: the bundled pair; its target is trained for)")
    parser.add_argument("--width", type=int, default=0, help="the head's inner width (default: the hidden size)")
    parser.add_argument("--rate", type=float, default=3e-4, help="AdamW's learning rate (default 3e-4)")
    parser.add_argument("--depth", type=int, default=1, help="drafts deep each chunk is learnt (default 1)")
    parser.add_argument("--fresh", action="store_true", help="start over instead of resuming a stopped run")
    args = parser.parse_args(argv)
    args.overrides = [item for item in args.items if "=" in item and not Path(item).exists()]
    args.sources = [Path(item) for item in args.items if item not in args.overrides]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.minutes <= 0 or args.width < 0 or args.rate <= 0 or not 1 <= args.depth <= 8:
        print(
            "specchat train-drafter: error: --minutes and --rate must be > 0, --width ≥ 0, --depth 1 to 8",
            file=sys.stderr,
        )
        return 2
    missing = [str(s) for s in args.sources if not s.exists()]
    if missing:
        print(f"specchat train-drafter: error: no such file or folder: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config, [*args.overrides, "speculation.mode=target", "drafter.source="])
        from specchat.loading.models import load_pair

        pair = load_pair(cfg, to_stderr())
    except (ConfigError, ModelLoadError) as err:
        print(f"specchat train-drafter: error: {err}", file=sys.stderr)
        return 2
    console = Console(stderr=True)
    run = TrainingRun(pair, cfg.speculation.drafter_vocab, args)
    try:
        run.train(args.sources or default_sources(), args.minutes * 60, console)
    except KeyboardInterrupt:
        run.save_checkpoint()
        print(
            f"specchat train-drafter: stopped after {run.done['chunks']} chunks; the same command goes on from there",
            file=sys.stderr,
        )
        return 130
    print(run.report())
    return 0


class TrainingRun:
    def __init__(self, pair, vocab_limit: int, args: argparse.Namespace) -> None:
        self.target, self.tokenizer = pair.target, pair.tokenizer
        self.identity = pair.target_facts.identity
        self.path = draft_head_path(self.identity)
        self.partial = self.path.with_suffix(".partial.pt")
        self.vocab_limit = vocab_limit if 0 < vocab_limit < pair.vocab_size else 0
        width = self.vocab_limit or pair.vocab_size
        self.rows = output_rows(self.target.get_output_embeddings(), width)
        self.embed = self.target.get_input_embeddings()
        hidden = self.rows.shape[1]
        self.head = FeatureHead(hidden, args.width or hidden)
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=args.rate)
        self.depth = args.depth
        self.done = {"chunks": 0, "positions": 0, "seconds": 0.0, "loss": 0.0}
        self.held_out: list = []
        if self.partial.is_file() and not args.fresh:
            self._resume()

    def _resume(self) -> None:
        saved = torch.load(self.partial, map_location="cpu", weights_only=True)
        self.head = head_from_record(saved["record"]).train()
        self.optimizer = torch.optim.AdamW(self.head.parameters())
        self.optimizer.load_state_dict(saved["optimizer"])
        self.done = dict(saved["done"])

    def save_checkpoint(self) -> None:
        self.partial.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        state = {"record": head_record(self.head, {}), "optimizer": self.optimizer.state_dict(), "done": self.done}
        torch.save(state, self.partial)

    def train(self, sources: list[Path], budget_s: float, console: Console) -> None:
        began, skip, losses = time.perf_counter(), int(self.done.get("next", 0)), []
        columns = (TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("reading text", total=budget_s)
            for index, ids in enumerate(token_chunks(text_files(sources), self.tokenizer, CHUNK)):
                elapsed = time.perf_counter() - began
                if elapsed >= budget_s:
                    break
                if index % 10 == 9 and len(self.held_out) < HELD_OUT:
                    self.held_out.append(self._batch(ids))
                    continue
                if index < skip:
                    continue
                self.head.train()
                losses.append(train_on(self.head, self.optimizer, self._batch(ids), self.rows, self.depth))
                self._count(ids, losses)
                self.done["next"] = index + 1  # where a resumed run goes on
                progress.update(task, completed=elapsed, description=self._line(losses))
                if self.done["chunks"] % SAVE_EVERY == 0:
                    self.save_checkpoint()
        self.done["seconds"] += time.perf_counter() - began
        self.done["agreement"] = self.held_out_agreement()
        self._save()

    def _batch(self, ids: list[int]):
        return batch(target_states(self.target, ids), ids, self.embed, self.rows)

    def _count(self, ids: list[int], losses: list[float]) -> None:
        self.done["chunks"] += 1
        self.done["positions"] += len(ids) - 1
        self.done["loss"] = statistics.mean(losses[-20:])

    def _line(self, losses: list[float]) -> str:
        return f"training: {self.done['chunks']} chunks, {self.done['positions']:,} positions, loss {losses[-1]:.3f}"

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        torch.save(head_record(self.head, dict(self.done)), self.path)
        self.partial.unlink(missing_ok=True)

    def held_out_agreement(self) -> float:
        self.head.eval()
        counts = [agreement(self.head, data, self.rows) for data in self.held_out]
        total = sum(n for _, n in counts)
        return sum(a for a, _ in counts) / total if total else 0.0

    def cost(self, vocab_limit: int, repeats: int = 20) -> float:
        """A head step's time (the head, then the target's output rows through the drafter view, as the `head`
        drafter runs them) ÷ a one-token target forward's: c."""
        vocab = DraftVocab(self.target.get_output_embeddings(), vocab_limit) if vocab_limit else None
        output = self.target.get_output_embeddings()
        feature = torch.zeros(1, self.rows.shape[1])
        token = torch.zeros(1, dtype=torch.long)
        with torch.inference_mode():
            self.head.eval()
            start = time.perf_counter()
            for _ in range(repeats):
                hidden = self.head(feature, self.embed(token).reshape(1, -1))
                (vocab.logits(hidden) if vocab is not None else output(hidden)).argmax(-1)
            head_s = (time.perf_counter() - start) / repeats
            cache = model_io.new_kv_cache(self.target)
            model_io.forward(self.target, cache, list(range(1, 65)), keep=1)
            start = time.perf_counter()
            for i in range(repeats):
                model_io.forward(self.target, cache, [i + 1], keep=1)
            target_s = (time.perf_counter() - start) / repeats
        return head_s / target_s

    def report(self) -> str:
        done = self.done
        return (
            f"draft head saved: {self.path}\n"
            f"trained on {done['chunks']} chunks ({done['positions']:,} positions) in {done['seconds'] / 60:.1f} min; "
            f"loss {done['loss']:.3f}\n"
            f"held-out first-draft agreement (greedy α of a first draft): {done['agreement']:.1%} over "
            f"{sum(int(d.chosen.shape[0]) for d in self.held_out):,} positions\n"
            f"c (a head step ÷ a target token): {self.cost(self.vocab_limit):.3f}\n"
            f"draft with it: speculation.drafter=head (or /drafter head in the chat)"
        )

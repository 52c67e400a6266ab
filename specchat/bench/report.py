"""Benchmark output: the rich table, the progress bar, and the PNG chart."""

from __future__ import annotations

from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

COLUMNS = (
    "setting",
    "method",
    "tok/s",
    "× target",
    "× target code",
    "× target edit",
    "worst × target",
    "× HF same drafter",
    "× HF unquantized drafter",
    "× llama.cpp",
    "acceptance",
    "tok/step",
    "c",
    "bound",
    "of bound",
    "edit steps copy/model/target",
    "exact",
)


def _num(value, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _ratio(value) -> str:
    return "—" if value is None else f"{value:.2f}×"


def _steps(steps) -> str:
    """`38/21/2`: the edit prompts' target steps that were copied, model-drafted and target-only."""
    return "—" if not steps else "/".join(str(n) for n in steps)


def _exact(row: dict) -> str:
    if row["exact"] is None:
        return "n/a"
    return "yes" if row["exact"] else "NO: " + ", ".join(row["mismatched_prompts"])


def table_cells(row: dict) -> list[str]:
    ratios = (
        "vs_target",
        "vs_target_code",
        "vs_target_edit",
        "worst_vs_target",
        "vs_hf_assisted",
        "vs_hf_unquantized",
        "vs_llamacpp",
    )
    return [
        row["setting"],
        row["method"],
        _num(row["tok_s"], ".2f"),
        *(_ratio(row.get(key)) for key in ratios),
        _num(row["alpha"], ".0%"),
        _num(row["tokens_per_step"], ".2f"),
        _num(row["c"], ".2f"),
        _num(row["predicted"], ".2f"),
        _num(row.get("of_predicted"), ".0%"),
        _steps(row.get("steps_edit")),
        _exact(row),
    ]


def results_table(rows: list[dict], meta: dict) -> Table:
    target, drafter = meta["target"]["name"], (meta["drafter"] or {}).get("name", "none")
    table = Table(
        title=f"specchat bench · {target} ← {drafter} · {meta['max_new_tokens']} new tokens · "
        f"{len(meta['prompts'])} prompts · medians"
    )
    for name in COLUMNS:
        table.add_column(name, justify="left" if name in ("setting", "method", "exact") else "right")
    for row in rows:
        table.add_row(*table_cells(row))
    return table


def turns_table(turns) -> Table:
    table = Table(title="multi-turn: time to first token of turn 3")
    for name in ("KV reuse across turns", "ttft", "prompt tokens", "reused from earlier turns"):
        table.add_column(name, justify="right")
    for t in turns:
        table.add_row("on" if t.reuse else "off", f"{t.ttft_s:.2f} s", str(t.prompt_tokens), str(t.reused_tokens))
    return table


def markdown_table(rows: list[dict]) -> str:
    """The same table as Markdown, for the README."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(table_cells(row)) + " |" for row in rows]
    return "\n".join(lines)


def with_progress(console, total: int, work):
    """Run work(tick) under a progress bar; tick(label) advances it by one run."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("warming up", total=total)

        def tick(label: str) -> None:
            progress.update(task, advance=1, description=label)

        return work(tick)


def plot_speedups(rows: list[dict], path: Path) -> Path | None:
    """Speedup vs gamma (measured and predicted), transformers baselines as lines. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    settings = sorted({r["setting"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4.5), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        _plot_setting(ax, [r for r in rows if r["setting"] == setting], setting)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _plot_setting(ax, rows: list[dict], setting: str) -> None:
    fixed = [
        r for r in rows if r["method"].startswith("specchat γ") and r["gamma"] != "auto" and " · " not in r["method"]
    ]  # the configured target's rows only, not another target's
    gammas = [int(r["gamma"]) for r in fixed]
    ax.plot(gammas, [r["vs_target"] for r in fixed], "o-", label="specchat measured")
    ax.plot(gammas, [r["predicted"] for r in fixed], "s--", label="Leviathan bound (measured α per draft, c)")
    for r in rows:
        if r["method"] == "specchat γauto":
            ax.axhline(
                r["vs_target"], color="tab:green", linestyle="-.", label=f"specchat auto γ≈{r['mean_gamma']:.1f}"
            )
        elif r["method"].startswith("HF assisted"):
            color = "tab:red" if "default" in r["method"] else "tab:purple"
            ax.axhline(
                r["vs_target"],
                linestyle=":" if "unquantized" in r["method"] else "--",
                color=color,
                linewidth=0.9,
                label=r["method"].replace("HF", "transformers"),
            )
    ax.axhline(1.0, color="grey", linewidth=0.8, label="target-only")
    ax.set(
        title=f"{setting}: speedup vs target-only",
        xlabel="gamma (drafted tokens per step)",
        ylabel="× specchat target-only tok/s",
    )
    ax.legend(fontsize=7)

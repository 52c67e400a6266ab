"""`specchat train-drafter` (training/cli.py): a head trained on the given text within the time budget, saved in the
cache folder under the target's identity, found by the next load (the banner says so), resumed after a stop."""

from __future__ import annotations

import pytest
import torch
from model_files import tiny_qwen2, write_gguf
from tiny_models import build_tokenizer

from specchat.config import Config, ModelConfig, SpeculationConfig
from specchat.loading.draft_head import draft_head_path, read_head
from specchat.loading.models import load_pair
from specchat.speculative import model_io
from specchat.training import cli


@pytest.fixture
def tiny_target(tmp_path):
    tok = build_tokenizer()
    path = write_gguf(tmp_path / "tiny.gguf", tiny_qwen2(len(tok)), tok)
    config = tmp_path / "tiny.toml"
    config.write_text(f'[target]\nsource = "{path}"\ndtype = "float32"\n\n[drafter]\nsource = ""\n')
    return path, config


@pytest.fixture
def text(tmp_path):
    folder = tmp_path / "text"
    folder.mkdir()
    for i in range(6):
        (folder / f"part{i}.py").write_text("".join(f"def f{i}_{j}(x):\n    return x * {j}\n\n" for j in range(80)))
    return folder


def test_a_head_trained_in_the_budget_is_saved_and_the_next_load_puts_it_on_the_target(
    cache, tiny_target, text, capsys
):
    path, config = tiny_target
    assert cli.main(["--config", str(config), "--minutes", "0.05", str(text)]) == 0
    report = capsys.readouterr().out
    assert "draft head saved:" in report and "held-out first-draft agreement" in report and "c (a head step" in report
    cfg = Config(target=ModelConfig(source=str(path), dtype="float32"), speculation=SpeculationConfig(mode="target"))
    pair = load_pair(cfg)
    head, trained = read_head(draft_head_path(pair.target_facts.identity))
    assert trained["chunks"] >= 1 and trained["positions"] > 0 and 0.0 <= trained["agreement"] <= 1.0
    assert isinstance(getattr(pair.target, model_io.DRAFT_HEAD), type(head))
    assert pair.target_facts.draft_head.startswith("draft head ")


def test_a_run_stopped_with_ctrl_c_resumes_where_it_left_off(cache, tiny_target, text, monkeypatch, capsys):
    _, config = tiny_target
    real_train_on, calls = cli.train_on, []

    def interrupted_on_the_fourth(*args):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real_train_on(*args)

    with monkeypatch.context() as patch:
        patch.setattr(cli, "train_on", interrupted_on_the_fourth)
        assert cli.main(["--config", str(config), "--minutes", "1", str(text)]) == 130
    assert "stopped after 3 chunks; the same command goes on from there" in capsys.readouterr().err
    [partial] = cache.glob("draft-heads/*.partial.pt")
    assert torch.load(partial, weights_only=True)["done"]["chunks"] == 3
    assert cli.main(["--config", str(config), "--minutes", "0.03", str(text)]) == 0
    assert not partial.exists()  # the finished run's head replaced the checkpoint
    [head_file] = cache.glob("draft-heads/*.pt")
    assert read_head(head_file)[1]["chunks"] > 3  # it went on from the checkpoint


def test_bad_arguments_are_one_line_each(tiny_target, tmp_path, capsys):
    _, config = tiny_target
    assert cli.main(["--config", str(config), "--minutes", "0"]) == 2
    assert cli.main(["--config", str(config), str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "specchat train-drafter: error: --minutes and --rate must be > 0, --width ≥ 0, --depth 1 to 8",
        f"specchat train-drafter: error: no such file or folder: {tmp_path / 'missing'}",
    ]

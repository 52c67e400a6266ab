"""Fault injection on a temporary cache: each cached artefact kind, damaged or killed
mid-build, heals at the next load, and the model computes exactly what an undamaged load computes.

Kinds: the assembled bundled GGUF (loaded as `bundled:`), the checkpoint converted from a GGUF file,
and the w8a8 quantized-weights file of a model directory. Faults: a file cut short, a flipped byte,
a missing file, a leftover temporary of a dead writer, and SIGKILL to a process doing the work at
several points of it. Kills run in workers forked from one small fork server (a subprocess that
imports torch and transformers once and never computes, so forking it is safe and cheap): the worker
loads the model with a hook that, at the chosen point, reports "paused" and sleeps; the test then
kills it. Before the fresh load, a copy of the cache is probed with the cache's own acceptance rules:
whatever they take as complete must equal the undamaged artefact.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pytest
import torch

from tiny_models import build_model, build_tokenizer
from specchat.config import ModelConfig
from specchat.loading import assets, gguf_convert, quantized_cache, tensor_file
from specchat.loading.models import load_model
from model_files import later, logits, save_dir, tiny_qwen2, write_gguf

TESTS = Path(__file__).resolve().parent
DEAD_PID = 999_999_999  # above any pid_max: the writer of a leftover named with it is surely gone
BUNDLE = "tiny-qwen-faults"
NOTICE = ("rebuilding", "rebuilt")  # how the notice line of a rebuilt artefact starts


# ----- the tiny sources, shared with the forked workers (which rebuild World from its root) --------
@dataclass(frozen=True)
class World:
    root: Path

    @property
    def gguf(self) -> Path:
        return self.root / "tiny-qwen.gguf"

    @property
    def parts(self) -> list[Path]:
        return [self.root / f"part{i:02d}.bin" for i in (1, 2, 3)]

    @property
    def model_dir(self) -> Path:
        return self.root / "tiny-llama"

    @cached_property
    def bundle(self) -> assets.BundledModel:
        data = self.gguf.read_bytes()
        return assets.BundledModel("Tiny-Qwen-Faults", "fake-faults-part", "0", 3, len(data),
                                   hashlib.sha256(data).hexdigest())

    def make(self) -> World:
        tok = build_tokenizer()
        data = write_gguf(self.gguf, tiny_qwen2(len(tok)), tok).read_bytes()
        for part, chunk in zip(self.parts, (data[:1000], data[1000:200_000], data[200_000:])):
            part.write_bytes(chunk)
        save_dir(self.model_dir, build_model(len(tok), seed=1, layers=2), tok)
        return self


def install_bundle(world: World, patch: pytest.MonkeyPatch | None = None) -> None:
    """Make `bundled:tiny-qwen-faults` name the tiny GGUF, split into three part files (for good
    when no monkeypatch is given: in a forked worker)."""
    parts = world.parts
    patch = patch or pytest.MonkeyPatch()
    patch.setitem(assets.BUNDLED, BUNDLE, world.bundle)
    patch.setattr(assets, "find_parts", lambda model: parts)


# ----- artefacts and kinds ----------------------------------------------------------------------------
def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Artefact:
    label: str

    def path(self, world: World) -> Path:
        if self.label == "gguf":
            return assets.cache_dir() / "gguf" / world.bundle.filename
        if self.label == "converted":
            return gguf_convert.converted_dir(world.bundle.sha256, torch.float32)
        identity = quantized_cache.directory_identity(world.model_dir)
        return quantized_cache.cache_path(identity, "float32", "w8a8")

    def accepted(self, world: World) -> bool:
        """Whether the cache's own checks take the artefact as complete (this may write stamps)."""
        path = self.path(world)
        if self.label == "gguf":
            return path.is_file() and assets.is_verified(path, world.bundle.size, world.bundle.sha256)
        if self.label == "converted":
            return gguf_convert.is_converted(world.bundle.sha256, torch.float32)
        return quantized_cache._read(path, None)[0] is not None

    def files(self, world: World) -> dict[str, str]:
        """sha256 of every file the artefact is made of (stamps excluded: they hold mtimes)."""
        path = self.path(world)
        if self.label == "converted":
            return {p.name: _sha(p) for p in sorted(path.iterdir()) if not p.name.endswith(".verified")}
        names = [path] + ([path.with_name(path.name + ".json")] if self.label == "quantized" else [])
        return {p.name: _sha(p) for p in names}


GGUF, CONVERTED, QUANTIZED = Artefact("gguf"), Artefact("converted"), Artefact("quantized")


@dataclass(frozen=True)
class Kind:
    name: str
    artefacts: tuple[Artefact, ...]  # what its load builds; the first is the one under test
    build_line: str                  # how the line saying it builds the artefact starts

    def config(self, world: World) -> ModelConfig:
        if self.name == "assembled":
            return ModelConfig(source=f"bundled:{BUNDLE}", dtype="float32", device="cpu")
        if self.name == "converted":
            return ModelConfig(source=str(world.gguf), dtype="float32", device="cpu")
        return ModelConfig(source=str(world.model_dir), dtype="float32", quantization="w8a8", device="cpu")

    @property
    def artefact(self) -> Artefact:
        return self.artefacts[0]


KINDS = {"assembled": Kind("assembled", (GGUF, CONVERTED), "assembling"),
         "converted": Kind("converted", (CONVERTED,), "converting"),
         "quantized": Kind("quantized", (QUANTIZED,), "quantizing")}


# ----- fixtures -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    return World(tmp_path_factory.mktemp("sources")).make()


@pytest.fixture(scope="module")
def references(world, tmp_path_factory) -> dict:
    """Per kind, from a clean cache: the logits of the loaded model and the files of each artefact."""
    refs = {}
    with pytest.MonkeyPatch.context() as patch:
        install_bundle(world, patch)
        for name, kind in KINDS.items():
            patch.setenv("SPECCHAT_CACHE", str(tmp_path_factory.mktemp(f"reference-{name}")))
            model, tokenizer, _ = load_model(kind.config(world))
            refs[name] = (logits(model, tokenizer), {a.label: a.files(world) for a in kind.artefacts})
    return refs


@pytest.fixture
def cache(tmp_path, monkeypatch, world) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECCHAT_CACHE", str(root))
    install_bundle(world, monkeypatch)
    return root


def load(kind: Kind, world: World):
    """A fresh load: (logits on the fixed prompt, the progress messages it reported)."""
    seen: list[str] = []
    model, tokenizer, _ = load_model(kind.config(world), progress=lambda message, fraction: seen.append(message))
    return logits(model, tokenizer), seen


def assert_nothing_wrong_taken_as_complete(kind: Kind, world: World, references: dict, cache: Path,
                                           probe: Path, monkeypatch) -> None:
    """On a copy of the cache (mtimes kept; the checks may write stamps or drop damaged files), each
    artefact the cache's own checks accept equals the undamaged one."""
    if cache.exists():
        shutil.copytree(cache, probe, symlinks=True)
    with monkeypatch.context() as patch:
        patch.setenv("SPECCHAT_CACHE", str(probe))
        for artefact in kind.artefacts:
            if artefact.accepted(world):
                assert artefact.files(world) == references[kind.name][1][artefact.label], artefact.label


def assert_healed(kind: Kind, world: World, references: dict, expect: str) -> None:
    """A fresh load computes what an undamaged load does and leaves the undamaged artefact. `expect`:
    'kept' (found whole, not built), 'built' (built, saying so, without a rebuild notice), or
    'rebuilt' (one notice line saying what was rebuilt and why, then built)."""
    out, seen = load(kind, world)
    ref_logits, ref_files = references[kind.name]
    assert torch.equal(out, ref_logits)
    for artefact in kind.artefacts:
        assert artefact.files(world) == ref_files[artefact.label], artefact.label
        leftovers = [p.name for p in artefact.path(world).parent.glob(".*.tmp")]
        assert leftovers == [], leftovers
    notices = [m for m in seen if m.startswith(NOTICE)]
    built = any(m.startswith(kind.build_line) for m in seen)
    if expect == "rebuilt":
        assert len(notices) == 1 and built, seen
        assert "\n" not in notices[0]
    else:
        assert notices == [], seen
        assert built == (expect == "built"), seen


# ----- damage at rest: cut short, flipped byte, missing file, leftover temporary -------------------------
def flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    later(path)  # a later corruption gets a later mtime (same-tick rewrites would keep the stamp valid)


def cut_short(path: Path, by: int = 100) -> None:
    path.write_bytes(path.read_bytes()[:-by])


def leave_temporary(path: Path) -> Path:
    """Replace the artefact with what a writer killed half-way leaves: its temporary, named by a dead pid."""
    leftover = path.with_name(f".{path.name}.{DEAD_PID}.tmp")
    if path.is_dir():
        shutil.copytree(path, leftover)  # complete-looking, record included: still not to be used
        cut_short(leftover / "model.safetensors", by=len((leftover / "model.safetensors").read_bytes()) // 2)
        shutil.rmtree(path)
    else:
        leftover.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        path.unlink()
    return leftover


def damage(kind: Kind, fault: str, world: World) -> None:
    path = kind.artefact.path(world)
    if kind.name == "assembled":  # the GGUF is read only to (re)convert: drop the conversion
        shutil.rmtree(CONVERTED.path(world))
    if fault == "truncated":
        cut_short(path / "tokenizer.json" if path.is_dir() else path)
    elif fault == "flipped byte":
        flip_middle_byte(path / "model.safetensors" if path.is_dir() else path)
    elif fault == "missing file":
        (path / "model.safetensors").unlink() if path.is_dir() else path.unlink()
    elif fault == "missing record":  # the GGUF's .verified stamp, specchat.json, the quantized sidecar
        record = {"assembled": path.with_name(path.name + ".verified"), "converted": path / gguf_convert.META,
                  "quantized": path.with_name(path.name + ".json")}[kind.name]
        record.unlink()
    elif fault == "leftover temporary":
        leave_temporary(path)
    else:
        raise AssertionError(fault)


FAULTS = [  # (kind, fault, what the next load does)
    ("assembled", "truncated", "rebuilt"),
    ("assembled", "flipped byte", "rebuilt"),
    ("assembled", "missing file", "built"),
    ("assembled", "missing record", "kept"),  # no stamp: hashed again, found whole
    ("assembled", "leftover temporary", "built"),
    ("converted", "truncated", "rebuilt"),
    ("converted", "flipped byte", "rebuilt"),
    ("converted", "missing file", "rebuilt"),
    ("converted", "missing record", "built"),  # no record: never finished, so built without a notice
    ("converted", "leftover temporary", "built"),
    ("quantized", "truncated", "rebuilt"),
    ("quantized", "flipped byte", "rebuilt"),
    ("quantized", "missing file", "built"),
    ("quantized", "missing record", "rebuilt"),
    ("quantized", "leftover temporary", "built"),
]


@pytest.mark.parametrize("kind_name, fault, expect", FAULTS, ids=[f"{k}-{f}" for k, f, _ in FAULTS])
def test_a_damaged_artefact_heals_at_the_next_load(kind_name, fault, expect, world, references, cache,
                                                   tmp_path, monkeypatch):
    kind = KINDS[kind_name]
    load(kind, world)
    damage(kind, fault, world)
    assert_nothing_wrong_taken_as_complete(kind, world, references, cache, tmp_path / "probe", monkeypatch)
    assert_healed(kind, world, references, expect)


def test_a_leftover_of_a_running_writer_is_left_alone(world, references, cache):
    """A temporary whose writer still runs (pid 1 here) is neither used nor deleted."""
    kind = KINDS["quantized"]
    path = kind.artefact.path(world)
    path.parent.mkdir(parents=True)
    running = path.with_name(f".{path.name}.1.tmp")
    running.write_bytes(b"being written")
    out, _ = load(kind, world)
    assert torch.equal(out, references[kind.name][0]) and running.read_bytes() == b"being written"


# ----- SIGKILL at points of the work, in a forked worker --------------------------------------------
def _replace_into(folder: str):
    """Matches os.replace(src, dst) calls whose destination lies in the cache's `folder`."""
    return lambda src, dst, *args, **kwargs: Path(dst).parent.name == folder


def _safetensors():
    import safetensors.torch
    return safetensors.torch


# (owner, attribute, "before"|"after" the call, which calls) or ("progress", which reports)
POINTS = {
    "assembled": {
        "half written": ("progress", lambda message, fraction: message.startswith("assembling")
                         and fraction is not None and fraction >= 0.5),
        "written, before the rename": (lambda: os, "replace", "before", _replace_into("gguf")),
        "renamed, before its stamp": (lambda: os, "replace", "after", _replace_into("gguf")),
    },
    "converted": {
        "dequantized, nothing written": (lambda: gguf_convert, "_gguf_model", "after", None),
        "weights written, tokenizer not yet": (_safetensors, "save_model", "after", None),
        "files written, no record yet": (lambda: gguf_convert, "_file_records", "before", None),
        "written, before the rename": (lambda: os, "replace", "before", _replace_into("converted")),
        "renamed into place": (lambda: os, "replace", "after", _replace_into("converted")),
    },
    "quantized": {
        "quantized, nothing written": (lambda: quantized_cache, "_write", "before", None),
        "weights in the temporary file": (lambda: tensor_file, "write_tensors", "after", None),
        "record written, before the rename": (lambda: os, "replace", "before", _replace_into("quantized")),
        "renamed into place": (lambda: os, "replace", "after", _replace_into("quantized")),
    },
}
KILLS = [  # (kind, point, damaged first so the worker is rebuilding, what the next load does)
    ("assembled", "half written", False, "built"),
    ("assembled", "written, before the rename", False, "built"),
    ("assembled", "renamed, before its stamp", False, "kept"),
    ("assembled", "written, before the rename", True, "rebuilt"),  # the damaged GGUF is still there
    ("converted", "dequantized, nothing written", False, "built"),
    ("converted", "weights written, tokenizer not yet", False, "built"),
    ("converted", "files written, no record yet", False, "built"),
    ("converted", "written, before the rename", False, "built"),
    ("converted", "renamed into place", False, "kept"),
    ("converted", "written, before the rename", True, "built"),  # the damaged one was removed first
    ("quantized", "quantized, nothing written", False, "built"),
    ("quantized", "weights in the temporary file", False, "built"),
    ("quantized", "record written, before the rename", False, "built"),
    ("quantized", "renamed into place", False, "kept"),
    ("quantized", "record written, before the rename", True, "built"),  # the damaged one was removed
]


LEAVE_A_TEMPORARY = {"half written", "written, before the rename", "weights written, tokenizer not yet",
                     "files written, no record yet", "weights in the temporary file",
                     "record written, before the rename"}


def _pause() -> None:
    os.write(1, f"paused {os.getpid()}\n".encode())
    while True:
        time.sleep(60)


def _arm(kind_name: str, point: str):
    """In a worker: make the work stop at `point`; the progress callback to pass to the load."""
    spec = POINTS[kind_name][point]
    if spec[0] == "progress":
        reached = spec[1]
        return lambda message, fraction: _pause() if reached(message, fraction) else None
    owner_of, name, when, which = spec
    owner = owner_of()
    real = getattr(owner, name)

    def hooked(*args, **kwargs):
        hit = which is None or which(*args, **kwargs)
        if hit and when == "before":
            _pause()
        result = real(*args, **kwargs)
        if hit and when == "after":
            _pause()
        return result
    setattr(owner, name, hooked)
    return None


def _work(job: dict) -> None:
    """A forked worker: load the kind's model in the given cache, stopping at the given point."""
    os.environ["SPECCHAT_CACHE"] = job["cache"]
    torch.set_num_threads(1)
    world = World(Path(job["world"]))
    install_bundle(world)
    assets.CHUNK = 4096  # many progress reports while assembling: a kill lands half-way
    progress = _arm(job["kind"], job["point"])
    load_model(KINDS[job["kind"]].config(world), progress=progress)


def fork_server() -> None:
    """The fork server's loop (run in a subprocess): one worker per line of stdin, reaped before the next."""
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _work(job)
                os.write(1, b"finished\n")
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(code)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)  # reaped: its pid is gone, as after a real crash
        print(f"exited {pid} {status}", flush=True)


class ForkServer:
    def __init__(self, log: Path):
        self.log = log
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
                   TRANSFORMERS_OFFLINE="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), str(TESTS.parent),
                                                            os.environ.get("PYTHONPATH")])))
        with log.open("w") as errors:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "import test_cache_faults; test_cache_faults.fork_server()"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True, bufsize=1,
                cwd=TESTS.parents[1], env=env)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.split())
        self.lines.put(None)

    def _next(self, timeout: float) -> list[str]:
        try:
            words = self.lines.get(timeout=timeout)
        except queue.Empty:
            words = None
        if words is None:
            pytest.fail(f"the fork server stopped answering; its stderr:\n{self.log.read_text()[-3000:]}")
        return words

    def kill_at(self, job: dict) -> None:
        """Run `job` in a worker, SIGKILL it once it pauses at its point, and wait until it is reaped."""
        self.process.stdin.write(json.dumps(job) + "\n")
        self.process.stdin.flush()
        victim = None
        while victim is None:
            words = self._next(timeout=120)  # the first job also waits for the server's imports
            if words[0] == "paused":
                victim = int(words[1])
            elif words[0] in ("finished", "exited"):
                pytest.fail(f"the worker ended before reaching {job['point']!r}:\n{self.log.read_text()[-3000:]}")
        os.kill(victim, signal.SIGKILL)
        while (words := self._next(timeout=60))[0] != "exited":
            continue
        status = int(words[2])
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    forks = ForkServer(tmp_path_factory.mktemp("fork-server") / "stderr.txt")
    yield forks
    forks.close()


# The fast default (`pytest -m "not slow"`) kills one worker of each kind, one of them while it rebuilds and
# one after the rename; the whole matrix is slow (it runs in a plain `pytest`).
FAST_KILLS = {("assembled", "half written", False), ("converted", "weights written, tokenizer not yet", False),
              ("quantized", "renamed into place", False), ("quantized", "record written, before the rename", True)}
KILL_CASES = [pytest.param(k, p, r, e, id=f"{k}-{p}{'-rebuilding' if r else ''}",
                           marks=() if (k, p, r) in FAST_KILLS else pytest.mark.slow) for k, p, r, e in KILLS]


@pytest.mark.parametrize("kind_name, point, rebuilding, expect", KILL_CASES)
def test_a_kill_during_the_work_leaves_nothing_taken_as_complete(kind_name, point, rebuilding, expect, world,
                                                                 references, cache, server, tmp_path,
                                                                 monkeypatch):
    kind = KINDS[kind_name]
    if rebuilding:
        load(kind, world)
        damage(kind, "flipped byte", world)
    server.kill_at({"kind": kind_name, "point": point, "cache": str(cache), "world": str(world.root)})
    folder = kind.artefact.path(world).parent
    assert any(folder.glob(".*.tmp")) == (point in LEAVE_A_TEMPORARY)  # the dead writer's, for the next start
    assert_nothing_wrong_taken_as_complete(kind, world, references, cache, tmp_path / "probe", monkeypatch)
    assert_healed(kind, world, references, expect)

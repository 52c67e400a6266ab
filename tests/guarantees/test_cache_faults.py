"""Fault injection on a temporary cache: each cached artefact kind, damaged or killed
mid-build, heals at the next load, and the model computes exactly what an undamaged load computes.

Kinds: the assembled bundled GGUF (loaded as `bundled:`), the checkpoint converted from a GGUF file,
and the w8a8 stored weights of a model directory. Faults: a file cut short, a flipped byte,
a missing file, a leftover temporary of a dead writer, and SIGKILL to a process doing the work at
several points of it. Kills run in workers forked from one small fork server (a subprocess that
imports torch and transformers once and never computes, so forking it is safe and cheap): the worker
loads the model with a hook that, at the chosen point, reports "paused" and sleeps; the test then
kills it. Before the fresh load, a copy of the cache is probed with the cache's own acceptance rules:
whatever they take as complete must equal the undamaged artefact.

The disk under the cache: a full disk (a tmpfs too small, a file size limit) ends the first start in one line
and the next start heals; a read-only cache that holds everything starts (a read-only mount, no write
permission); an unreadable file (EACCES as a user meets it) or a read that fails (EIO, no memory) ends in one
line naming it and is kept; blocks that do not fit their layer are rebuilt; every rename into the cache is
fsynced. The kernel build: a dead builder's torch lock, a start killed while compiling, a read-only build.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import queue
import resource
import shlex
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
from model_files import later, logits, save_dir, tiny_qwen2, write_gguf
from tiny_models import build_model, build_tokenizer

from specchat import cache_folder
from specchat.config import ModelConfig
from specchat.errors import ModelLoadError
from specchat.loading import assets, checkpoint, stored_weights, tensor_file
from specchat.loading.gguf import convert as gguf_convert
from specchat.loading.models import load_model

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
        return assets.BundledModel(
            "Tiny-Qwen-Faults", "fake-faults-part", "0", 3, len(data), hashlib.sha256(data).hexdigest()
        )

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
        identity = checkpoint.directory_identity(world.model_dir)
        return stored_weights.stored_weights_path(identity, "float32", "w8a8")

    def accepted(self, world: World) -> bool:
        """Whether the cache's own checks take the artefact as complete (this may write stamps)."""
        path = self.path(world)
        if self.label == "gguf":
            return path.is_file() and assets.is_verified(path, world.bundle.size, world.bundle.sha256)
        if self.label == "converted":
            return gguf_convert.is_converted(world.bundle.sha256, torch.float32)
        return stored_weights._read(path, None)[0] is not None

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
    build_line: str  # how the line saying it builds the artefact starts

    def config(self, world: World) -> ModelConfig:
        if self.name == "assembled":
            return ModelConfig(source=f"bundled:{BUNDLE}", dtype="float32", device="cpu")
        if self.name == "converted":
            return ModelConfig(source=str(world.gguf), dtype="float32", device="cpu")
        return ModelConfig(source=str(world.model_dir), dtype="float32", quantization="w8a8", device="cpu")

    @property
    def artefact(self) -> Artefact:
        return self.artefacts[0]


KINDS = {
    "assembled": Kind("assembled", (GGUF, CONVERTED), "assembling"),
    "converted": Kind("converted", (CONVERTED,), "converting"),
    "quantized": Kind("quantized", (QUANTIZED,), "quantizing"),
}


# ----- fixtures -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    return World(tmp_path_factory.mktemp("sources")).make()


@pytest.fixture(scope="module")
def references(world, tmp_path_factory) -> dict:
    """Per kind, from a clean cache: the logits of the loaded model, the files of each artefact, and the
    bytes the cache holds then (all files, the largest file)."""
    refs = {}
    with pytest.MonkeyPatch.context() as patch:
        install_bundle(world, patch)
        for name, kind in KINDS.items():
            root = tmp_path_factory.mktemp(f"reference-{name}")
            patch.setenv("SPECCHAT_CACHE", str(root))
            model, tokenizer, _ = load_model(kind.config(world))
            sizes = [path.stat().st_size for path in root.rglob("*") if path.is_file()]
            refs[name] = (
                logits(model, tokenizer),
                {a.label: a.files(world) for a in kind.artefacts},
                (sum(sizes), max(sizes)),
            )
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


def assert_nothing_wrong_taken_as_complete(
    kind: Kind, world: World, references: dict, cache: Path, probe: Path, monkeypatch
) -> None:
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
    ref_logits, ref_files = references[kind.name][:2]
    assert torch.equal(out, ref_logits)
    for artefact in kind.artefacts:
        assert artefact.files(world) == ref_files[artefact.label], artefact.label
    assert leftovers(kind, world) == []
    assert_said(kind, seen, expect)


def leftovers(kind: Kind, world: World) -> list[str]:
    """The temporaries left beside the kind's artefacts."""
    return sorted(p.name for artefact in kind.artefacts for p in artefact.path(world).parent.glob(".*.tmp"))


def assert_said(kind: Kind, seen: list[str], expect: str | None) -> None:
    """The progress lines of a load fit `expect` (assert_healed's); None: no rebuild notice, built or not."""
    notices = [m for m in seen if m.startswith(NOTICE)]
    if expect is None:
        assert notices == [], seen
        return
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
        record = {
            "assembled": path.with_name(path.name + ".verified"),
            "converted": path / gguf_convert.META,
            "quantized": path.with_name(path.name + ".json"),
        }[kind.name]
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
def test_a_damaged_artefact_heals_at_the_next_load(
    kind_name, fault, expect, world, references, cache, tmp_path, monkeypatch
):
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
        "half written": (
            "progress",
            lambda message, fraction: message.startswith("assembling") and fraction is not None and fraction >= 0.5,
        ),
        "written, before the rename": (lambda: os, "replace", "before", _replace_into("gguf")),
        "renamed, before its stamp": (lambda: os, "replace", "after", _replace_into("gguf")),
    },
    "converted": {
        "dequantized, nothing written": (lambda: gguf_convert, "_gguf_model", "after", None),
        "weights written, tokenizer not yet": (_safetensors, "save_model", "after", None),
        "files written, no record yet": (lambda: gguf_convert, "file_records", "before", None),
        "written, before the rename": (lambda: os, "replace", "before", _replace_into("converted")),
        "renamed into place": (lambda: os, "replace", "after", _replace_into("converted")),
    },
    "quantized": {
        "quantized, nothing written": (lambda: stored_weights, "_write", "before", None),
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


LEAVE_A_TEMPORARY = {
    "half written",
    "written, before the rename",
    "weights written, tokenizer not yet",
    "files written, no record yet",
    "weights in the temporary file",
    "record written, before the rename",
}


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


def child_env(**extra: str) -> dict:
    """The environment of a child process: this one's (the cache included), offline, one thread, tests importable."""
    return dict(
        os.environ,
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH")])),
        **extra,
    )


class ForkServer:
    def __init__(self, log: Path):
        self.log = log
        with log.open("w") as errors:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "import test_cache_faults; test_cache_faults.fork_server()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                bufsize=1,
                cwd=TESTS.parents[1],
                env=child_env(),
            )
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
FAST_KILLS = {
    ("assembled", "half written", False),
    ("converted", "weights written, tokenizer not yet", False),
    ("quantized", "renamed into place", False),
    ("quantized", "record written, before the rename", True),
}
KILL_CASES = [
    pytest.param(
        k, p, r, e, id=f"{k}-{p}{'-rebuilding' if r else ''}", marks=() if (k, p, r) in FAST_KILLS else pytest.mark.slow
    )
    for k, p, r, e in KILLS
]


@pytest.mark.parametrize("kind_name, point, rebuilding, expect", KILL_CASES)
def test_a_kill_during_the_work_leaves_nothing_taken_as_complete(
    kind_name, point, rebuilding, expect, world, references, cache, server, tmp_path, monkeypatch
):
    kind = KINDS[kind_name]
    if rebuilding:
        load(kind, world)
        damage(kind, "flipped byte", world)
    server.kill_at({"kind": kind_name, "point": point, "cache": str(cache), "world": str(world.root)})
    folder = kind.artefact.path(world).parent
    assert any(folder.glob(".*.tmp")) == (point in LEAVE_A_TEMPORARY)  # the dead writer's, for the next start
    assert_nothing_wrong_taken_as_complete(kind, world, references, cache, tmp_path / "probe", monkeypatch)
    assert_healed(kind, world, references, expect)


# ----- the disk under the cache: full, read-only, unreadable, failing -------------------------------------
# Each start under a real fault runs in a child process: on a small tmpfs (ENOSPC) or a read-only bind mount
# (EROFS), each in a mount namespace of its own (unshare -m); under a file size limit (EFBIG); or, where the
# tests run as root, as root without the capabilities that override file permissions (EACCES as for any
# user). A child prints one JSON line: its result, or the one error line a ModelLoadError gave.
ERROR_EXIT = 3  # a child's exit status when its start ended in a ModelLoadError
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]  # root that file modes bind
SLOW_KINDS = {"quantized": (), "converted": pytest.mark.slow, "assembled": pytest.mark.slow}
KIND_CASES = [pytest.param(name, marks=SLOW_KINDS[name]) for name in KINDS]


def _digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.contiguous().numpy().tobytes()).hexdigest()


def child_main() -> None:
    """A child start (`python -c "import test_cache_faults as t; t.child_main()" JOB`): load the job's kind."""
    job = json.loads(sys.argv[1])
    torch.set_num_threads(job.get("threads", 1))  # the references' threads: a float sum's order depends on them
    if job["kind"] == "kernel":
        return _child_kernel(job)
    world, kind = World(Path(job["world"])), KINDS[job["kind"]]
    install_bundle(world)
    try:
        out, seen = load(kind, world)
    except ModelLoadError as err:
        print(json.dumps({"error": str(err)}), flush=True)
        sys.exit(ERROR_EXIT)
    print(
        json.dumps(
            {
                "logits": _digest(out),
                "seen": seen,
                "leftovers": leftovers(kind, world),
                "files": {artefact.label: artefact.files(world) for artefact in kind.artefacts},
            }
        )
    )


@dataclass
class Outcome:
    rc: int
    result: dict | None
    stderr: str


def child_command(job: dict, prefix: list[str] = ()) -> list[str]:
    job = {"threads": torch.get_num_threads(), **job}
    return [*prefix, sys.executable, "-c", "import test_cache_faults as t; t.child_main()", json.dumps(job)]


def outcome_of(rc: int, stdout: str, stderr: str) -> Outcome:
    lines = stdout.strip().splitlines()
    return Outcome(rc, json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None, stderr)


def run_child(job: dict, prefix: list[str] = (), timeout: float = 300, **popen) -> Outcome:
    done = subprocess.run(
        child_command(job, prefix),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=TESTS.parents[1],
        env=popen.pop("env", child_env()),
        **popen,
    )
    return outcome_of(done.returncode, done.stdout, done.stderr)


class Namespace:
    """Shell lines run as one script in a mount namespace of its own; `start` adds a child start's line."""

    def __init__(self, folder: Path):
        self.folder, self.lines, self.starts = folder, ["set -u"], 0

    def run(self, line: str) -> None:
        self.lines.append(f"{line} || exit 97")

    def start(self, job: dict) -> None:
        base = self.folder / f"start-{self.starts}"
        self.lines.append(f"{shlex.join(child_command(job))} > {base}.out 2> {base}.err; echo $? > {base}.rc")
        self.starts += 1

    def outcomes(self) -> list[Outcome]:
        done = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(self.lines)],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=TESTS.parents[1],
            env=child_env(),
        )
        assert done.returncode == 0, done.stderr
        bases = [self.folder / f"start-{n}" for n in range(self.starts)]
        return [
            outcome_of(int(Path(f"{b}.rc").read_text()), Path(f"{b}.out").read_text(), Path(f"{b}.err").read_text())
            for b in bases
        ]


@pytest.fixture(scope="module")
def mounts(tmp_path_factory) -> None:
    """Skips where a test cannot mount a tmpfs in a mount namespace of its own (unshare -m; root or CAP_SYS_ADMIN)."""
    where = tmp_path_factory.mktemp("mount-probe")
    if shutil.which("unshare") is None:
        pytest.skip("no unshare (util-linux) to mount a small tmpfs or a read-only folder in a namespace")
    script = f"mount -t tmpfs -o size=64k,mode=0700 tmpfs {where} && mount -o remount,size=128k {where}"
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script], capture_output=True, text=True
    )
    if done.returncode:
        pytest.skip(f"no mount namespace here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()[:200]}")


@pytest.fixture(scope="module")
def unprivileged(tmp_path_factory) -> list[str]:
    """A command prefix under which file permissions bind a child as they bind any user: none where the tests
    do not run as root; as root, setpriv dropping the capabilities that override them (DAC_OVERRIDE, ...)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root, and no setpriv (util-linux) to drop the capabilities that ignore file modes")
    probe = tmp_path_factory.mktemp("permission-probe") / "read-only"
    probe.write_text("")
    probe.chmod(0o444)
    done = subprocess.run([*NO_DAC, sys.executable, "-c", f"open({str(probe)!r}, 'a')"], capture_output=True, text=True)
    if "PermissionError" not in done.stderr:
        pytest.skip(f"root keeps overriding file modes under setpriv here: {done.stderr.strip()[-200:]}")
    return NO_DAC


def assert_one_line_error(outcome: Outcome, *words: str) -> str:
    """The start ended in one ModelLoadError line holding each of `words`, with no traceback."""
    assert outcome.rc == ERROR_EXIT and outcome.result, outcome.stderr[-3000:]
    assert "Traceback" not in outcome.stderr, outcome.stderr[-3000:]
    line = outcome.result["error"]
    assert "\n" not in line and all(word in line for word in words), line
    return line


def assert_started(outcome: Outcome, kind: Kind, references: dict, expect: str | None) -> None:
    """A child start computed what an undamaged load does, its cache holding the undamaged artefacts."""
    assert outcome.rc == 0 and outcome.result, outcome.stderr[-3000:]
    ref_logits, ref_files = references[kind.name][:2]
    assert outcome.result["logits"] == _digest(ref_logits)
    assert outcome.result["files"] == ref_files and outcome.result["leftovers"] == []
    assert_said(kind, outcome.result["seen"], expect)


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root but the `.verified` stamps (a read may add one)."""
    return {
        str(path.relative_to(root)): _sha(path)
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.suffix != ".verified"
    }


def set_tree_writable(root: Path, writable: bool) -> None:
    """chmod -R a-w (or u+w back) on a folder and everything in it."""
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | 0o200 if writable else mode & ~0o222)


@pytest.mark.parametrize("kind_name", KIND_CASES)
def test_a_full_disk_at_the_first_start_ends_in_one_line_and_the_next_start_heals(
    kind_name, world, references, cache, mounts, tmp_path
):
    """The cache on a tmpfs half the size it needs (ENOSPC); then the tmpfs grows, as when space is freed."""
    kind, total = KINDS[kind_name], references[kind_name][2][0]
    cache.mkdir(mode=0o700)
    script = Namespace(tmp_path)
    script.run(f"mount -t tmpfs -o size={total // 2},mode=0700 tmpfs {shlex.quote(str(cache))}")
    script.start({"kind": kind_name, "world": str(world.root)})
    script.run(f"mount -o remount,size=64m {shlex.quote(str(cache))}")
    script.start({"kind": kind_name, "world": str(world.root)})
    full, freed = script.outcomes()
    assert_one_line_error(full, "ENOSPC", str(cache))
    assert_started(freed, kind, references, None)  # nothing half-written taken as done, no notice


@pytest.mark.parametrize("kind_name", KIND_CASES)
def test_a_file_size_limit_at_the_first_start_ends_in_one_line_and_the_next_start_heals(
    kind_name, world, references, cache
):
    """RLIMIT_FSIZE at half the largest file the cache needs (EFBIG, as a full disk but needing no mount)."""
    limit = references[kind_name][2][1] // 2

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    job = {"kind": kind_name, "world": str(world.root)}
    assert_one_line_error(run_child(job, preexec_fn=limited), "EFBIG", str(cache))
    out, seen = load(KINDS[kind_name], world)
    assert torch.equal(out, references[kind_name][0]) and leftovers(KINDS[kind_name], world) == []
    assert_said(KINDS[kind_name], seen, None)


@pytest.mark.parametrize("how", ["read-only mount", "no write permission"])
@pytest.mark.parametrize("kind_name", KIND_CASES)
def test_a_read_only_cache_that_holds_everything_starts(kind_name, how, world, references, cache, tmp_path, request):
    """Built by a first start, then read-only: the next start neither writes (a stamp) nor deletes, and runs."""
    kind = KINDS[kind_name]
    load(kind, world)
    for stamp in cache.rglob("*.verified"):  # so the start hashes the files and would stamp them
        stamp.unlink()
    before = tree_digest(cache)
    job = {"kind": kind_name, "world": str(world.root)}
    if how == "read-only mount":
        request.getfixturevalue("mounts")
        script = Namespace(tmp_path)
        quoted = shlex.quote(str(cache))
        script.run(f"mount --bind {quoted} {quoted} && mount -o remount,bind,ro {quoted}")
        script.start(job)
        [outcome] = script.outcomes()
    else:
        prefix = request.getfixturevalue("unprivileged")
        set_tree_writable(cache, False)
        try:
            outcome = run_child(job, prefix)
        finally:
            set_tree_writable(cache, True)
    assert_started(outcome, kind, references, "kept")
    assert tree_digest(cache) == before


UNREADABLE = {
    "quantized": lambda world: QUANTIZED.path(world),  # the file itself
    "converted": lambda world: CONVERTED.path(world) / gguf_convert.META,
}  # its record


@pytest.mark.parametrize("kind_name", ["quantized", pytest.param("converted", marks=pytest.mark.slow)])
def test_an_unreadable_cache_file_ends_in_one_line_naming_it_and_is_kept(
    kind_name, world, references, cache, unprivileged
):
    """EACCES as a user meets it: one line naming the file and the errno, and the file stays as it was."""
    kind = KINDS[kind_name]
    load(kind, world)
    unreadable = UNREADABLE[kind_name](world)
    before = tree_digest(cache)
    unreadable.chmod(0)
    try:
        outcome = run_child({"kind": kind_name, "world": str(world.root)}, unprivileged)
    finally:
        unreadable.chmod(0o600)
    assert_one_line_error(outcome, str(unreadable), "EACCES")
    assert tree_digest(cache) == before
    assert_healed(kind, world, references, "kept")


IO_ERRORS = {
    "EIO": lambda: OSError(errno.EIO, os.strerror(errno.EIO)),
    "ENOMEM": MemoryError,
    "ENOSPC": lambda: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
}
READS = {"quantized": (lambda: tensor_file, "read_tensors"), "converted": (lambda: cache_folder, "read_record")}


@pytest.mark.parametrize(
    "kind_name, code", [("quantized", "EIO"), ("quantized", "ENOMEM"), ("quantized", "ENOSPC"), ("converted", "EIO")]
)
def test_an_io_error_while_reading_keeps_a_good_file(kind_name, code, world, references, cache, monkeypatch):
    """A read that fails (a failing disk, too little memory while copying the tensors) names the file and the
    errno in one line; the good file is not deleted, and the next start uses it as it is."""
    kind = KINDS[kind_name]
    load(kind, world)
    before = tree_digest(cache)
    owner, name = READS[kind_name]

    def failing(*args, **kwargs):
        raise IO_ERRORS[code]()

    with monkeypatch.context() as patch:
        patch.setattr(owner(), name, failing)
        with pytest.raises(ModelLoadError) as raised:
            load(kind, world)
    message = str(raised.value)
    assert "\n" not in message and code in message and str(kind.artefact.path(world)) in message, message
    assert tree_digest(cache) == before
    assert_healed(kind, world, references, "kept")


BAD_BLOCKS = {  # (which tensor: the first whose name ends so, what it becomes; None: it is left out)
    "a row short": (".weight", lambda tensor: tensor[:-1].clone()),
    "a column more": (".weight", lambda tensor: torch.cat([tensor, tensor[:, :1]], dim=1)),
    "scales as int8": (".scale", lambda tensor: tensor.to(torch.int8)),
    "scales left out": (".scale", None),
}


def rewrite_quantized(path: Path, change: str) -> None:
    """Rewrite the stored-weights file with one tensor changed, and a record that matches it: a file whole
    by its size and sha256, as a mis-written or hostile one can be."""
    tensors = tensor_file.read_tensors(path)
    suffix, becomes = BAD_BLOCKS[change]
    name = next(key for key in sorted(tensors) if key.endswith(suffix))
    if becomes is None:
        del tensors[name]
    else:
        tensors[name] = becomes(tensors[name])
    tensor_file.write_tensors(path, tensors)
    meta = {"format": stored_weights.FORMAT, "size": path.stat().st_size, "sha256": _sha(path)}
    stored_weights._meta_path(path).write_text(json.dumps(meta) + "\n")
    path.with_name(path.name + ".verified").unlink(missing_ok=True)


@pytest.mark.parametrize("change", BAD_BLOCKS)
def test_blocks_that_do_not_fit_their_layer_are_rebuilt_with_one_notice(change, world, references, cache):
    """The loader compares every block's shapes and dtypes with the layer it replaces before handing it over."""
    kind = KINDS["quantized"]
    load(kind, world)
    rewrite_quantized(QUANTIZED.path(world), change)
    assert_healed(kind, world, references, "rebuilt")


def _log_fsyncs_and_renames(patch: pytest.MonkeyPatch, cache: Path) -> list[tuple]:
    """Record, in order, ("fsync", path) and ("replace", destination, files under the source) for the renames
    of finished artefacts into the cache (not those inside a temporary folder being written)."""
    events: list[tuple] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst, *args, **kwargs):
        if Path(dst).is_relative_to(cache) and not any(part.endswith(".tmp") for part in Path(dst).parent.parts):
            inside = [src, *Path(src).rglob("*")] if Path(src).is_dir() else [src]
            events.append(("replace", str(dst), {str(path) for path in inside}))
        real_replace(src, dst, *args, **kwargs)

    patch.setattr(os, "fsync", fsync)
    patch.setattr(os, "replace", replace)
    return events


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name the file an fd is open on")
@pytest.mark.parametrize("kind_name", list(KINDS))
def test_every_artefact_is_fsynced_before_its_rename_and_its_folder_after(kind_name, world, cache, monkeypatch):
    """A power cut after a rename leaves the whole new artefact, not a renamed file whose bytes never reached
    the disk: each file (every file of a folder) is fsynced before the rename, the folder it lands in after."""
    with monkeypatch.context() as patch:
        events = _log_fsyncs_and_renames(patch, cache)
        load(KINDS[kind_name], world)
    renames = [at for at, event in enumerate(events) if event[0] == "replace"]
    assert renames, events
    for at in renames:
        _, destination, inside = events[at]
        synced = {event[1] for event in events[:at] if event[0] == "fsync"}
        assert inside <= synced, (destination, inside - synced)
        assert events[at + 1] == ("fsync", str(Path(destination).parent)), destination


# ----- the kernel build: a dead builder's torch lock, a start killed while compiling ------------------------
# build_kernel with a tiny extension for sources (it compiles in seconds); the folder and the locks are the
# real ones: torch's load() under specchat's flock, in a folder under the cache's kernels/.
TINY_EXTENSION = """#include <Python.h>
static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef definition = {PyModuleDef_HEAD_INIT, "tinyext", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_tinyext() { return PyModule_Create(&definition); }
"""
SLOW_COMPILER = """#!/bin/sh
case " $* " in *" -c "*) touch {started}; sleep 600;; esac
exec {compiler} "$@"
"""


def _child_kernel(job: dict) -> None:
    from specchat.kernels import build

    build.kernel_sources = lambda paths=(): [Path(job["source"])]
    module = build.build_kernel(job["build_dir"], "tinyext")
    print(json.dumps({"answer": module.answer()}), flush=True)


@pytest.fixture
def tiny_kernel(cache, tmp_path) -> dict:
    """A kernel job: the tiny extension's source and its build folder in the cache."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler")
    source = tmp_path / "tinyext.cpp"
    source.write_text(TINY_EXTENSION)
    return {"kind": "kernel", "source": str(source), "build_dir": str(cache / "kernels" / "tiny")}


def test_a_dead_builders_torch_lock_does_not_hold_up_the_kernel_build(tiny_kernel):
    """torch's load() waits, for ever, while its `lock` file exists; a builder SIGKILLed holding it leaves it."""
    build_dir = Path(tiny_kernel["build_dir"])
    build_dir.mkdir(parents=True)
    (build_dir / "lock").touch()
    try:
        outcome = run_child(tiny_kernel, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("the build waited on the dead builder's lock")
    assert outcome.result == {"answer": 42}, outcome.stderr[-3000:]


def test_a_start_killed_while_compiling_the_kernel_does_not_hold_up_the_next(tiny_kernel, tmp_path):
    build_dir, started = Path(tiny_kernel["build_dir"]), tmp_path / "compiling"
    compiler = tmp_path / "slow-c++"
    compiler.write_text(
        SLOW_COMPILER.format(
            started=shlex.quote(str(started)), compiler=shlex.quote(shutil.which(os.environ.get("CXX", "c++")))
        )
    )
    compiler.chmod(0o755)
    first = subprocess.Popen(
        child_command(tiny_kernel),
        cwd=TESTS.parents[1],
        env=child_env(CXX=str(compiler)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while not (started.exists() and (build_dir / "lock").exists()) and first.poll() is None:
        assert time.monotonic() < deadline, "the first start never began compiling"
        time.sleep(0.1)
    assert first.poll() is None, "the first start ended before it compiled"
    os.killpg(first.pid, signal.SIGKILL)  # the start, ninja and the compiler: a power cut, an OOM kill of the group
    first.wait()
    assert (build_dir / "lock").exists()  # what the dead builder leaves
    try:
        outcome = run_child(tiny_kernel, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("the next start waited on the killed start's lock")
    finally:
        kill_running(str(compiler))  # ninja runs the compiler in a process group of its own: the kill missed it
    assert outcome.result == {"answer": 42}, outcome.stderr[-3000:]


def kill_running(program: str) -> None:
    """SIGKILL the process group of every process whose command line names `program` (Linux's /proc), so that what
    it started (the fake compiler's sleep) goes too; never this test's own group."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and program.encode() in (entry / "cmdline").read_bytes():
                group = os.getpgid(int(entry.name))
                if group != os.getpgrp():
                    os.killpg(group, signal.SIGKILL)
        except (OSError, ProcessLookupError):
            continue


def test_a_built_kernel_loads_from_a_read_only_cache(tiny_kernel, cache, unprivileged):
    """torch's load() creates its lock file even when nothing is to be built; a finished build is imported."""
    assert run_child(tiny_kernel).result == {"answer": 42}
    set_tree_writable(cache, False)
    try:
        outcome = run_child(tiny_kernel, unprivileged)
    finally:
        set_tree_writable(cache, True)
    assert outcome.result == {"answer": 42}, outcome.stderr[-3000:]

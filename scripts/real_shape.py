"""The Python half of scripts/real_shape.sh: random-weight checkpoints at real shapes, specchat's own
timings on a GGUF file, llama-bench's JSON read back, and the table that puts them side by side.

    python scripts/real_shape.py build --shape llama-1b|qwen3-1.7b|tiny-llama|tiny-qwen3 --out DIR
    python scripts/real_shape.py blocks --shape qwen2.5-7b|llama-3.1-8b|qwen2.5-14b|tiny-blocks --type Q4_K_M --out FILE
    python scripts/real_shape.py specchat --gguf FILE --threads 2 --tokens 64 --repeats 3 --json OUT
    python scripts/real_shape.py table RESULTS.jsonl
    python scripts/real_shape.py paired --gguf FILE --llama-bench BIN [--pairs 20 --tokens 32] --json OUT

`build` writes an HF checkpoint (bfloat16, random normal weights, std 0.02, norms 1) with the bundled
pair's Qwen tokenizer (the one specchat reads from the bundled drafter's GGUF), for llama.cpp's own
convert_hf_to_gguf.py. `blocks` writes a GGUF of a large shape straight from random blocks of one type (no float checkpoint of
15-30 GB to convert): every matrix in blocks of TYPE with small fixed scales (Q4_K_M: Q4_K, with the output, and
attn_v and ffn_down of every other layer, in Q6_K as llama-quantize's mix keeps them), norms 1, biases 0, the
bundled tokenizer; both tools' time does not depend on the values. `specchat` loads the file as the chat would (`target.source=FILE`, the default
config otherwise, no drafter), then times target-only decode through the engine (greedy, no stop token,
prefill left out) and T(1), T(5): one target forward over 1 or 5 new tokens after a CONTEXT-token context
(the prompt llama-bench's pp tests read at depth CONTEXT too), medians of REPEATS×5 forwards.
`paired` times the two tools in pairs seconds apart (llama-bench tg of one run, then one specchat decode in a
process that loaded the file once, or the other way round), for ratios that see nearly the same machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import statistics
import time
import traceback
from pathlib import Path

STD = 0.02
# name: (architecture, config keywords); vocab_size is the tokenizer's
SHAPES = {
    "llama-1b": (  # Llama-3.2-1B
        "llama",
        dict(
            hidden_size=2048,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            intermediate_size=8192,
            rope_theta=500000.0,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
        ),
    ),
    "qwen3-1.7b": (  # Qwen3-1.7B
        "qwen3",
        dict(
            hidden_size=2048,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            intermediate_size=6144,
            rope_theta=1000000.0,
            max_position_embeddings=40960,
            rms_norm_eps=1e-6,
        ),
    ),
    "tiny-llama": (
        "llama",
        dict(
            hidden_size=512,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=4,
            intermediate_size=1024,
            rope_theta=500000.0,
            max_position_embeddings=4096,
        ),
    ),
    "tiny-qwen3": (
        "qwen3",
        dict(
            hidden_size=512,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            intermediate_size=1024,
            rope_theta=1000000.0,
            max_position_embeddings=4096,
        ),
    ),
}
BUNDLED_TOKENIZER = "qwen2.5-coder-0.5b-instruct"  # the bundled drafter's GGUF holds the pair's tokenizer
CONTEXT = 32  # tokens in the cache before T(n) is taken (llama-bench -d CONTEXT for its pp tests)
WIDTHS = (1, 5, 9)
# large shapes written as blocks (`blocks`): name → (architecture, hidden, layers, ffn, heads, kv heads, rope base)
BLOCK_SHAPES = {
    "qwen2.5-7b": ("qwen2", 3584, 28, 18944, 28, 4, 1000000.0),
    "llama-3.1-8b": ("llama", 4096, 32, 14336, 32, 8, 500000.0),
    "qwen2.5-14b": ("qwen2", 5120, 48, 13824, 40, 8, 1000000.0),
    "tiny-blocks": ("qwen2", 256, 2, 512, 2, 1, 1000000.0),  # to check the script in seconds
}
BLOCK_TYPES = ("Q4_K_M", "Q8_0", "Q4_0", "Q4_K", "Q6_K", "IQ4_XS", "Q5_0")


def qwen_tokenizer(cache: Path):
    """The bundled pair's Qwen tokenizer, saved once under `cache` (read from the bundled drafter's GGUF)."""
    from transformers import AutoTokenizer

    if (cache / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(str(cache))
    from specchat.loading.assets import bundled_gguf_path

    gguf = bundled_gguf_path(BUNDLED_TOKENIZER)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
    tokenizer.save_pretrained(str(cache))
    return AutoTokenizer.from_pretrained(str(cache))


def build(shape: str, out: Path, tokenizer_cache: Path, untied: bool = False) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        print(f"{out}: already built")
        return
    architecture, keywords = SHAPES[shape]
    tokenizer = qwen_tokenizer(tokenizer_cache)
    config_class, model_class = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    }[architecture]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = config_class(
        vocab_size=len(tokenizer),
        tie_word_embeddings=not untied,
        initializer_range=STD,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        **keywords,
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # the 1.7B shape never exists in float32 (7 GB)
    model = model_class(config).eval()
    with torch.no_grad():  # transformers' own init leaves some tensors empty where it skips: set them all
        for name, tensor in model.named_parameters():
            if name.endswith("norm.weight"):
                tensor.fill_(1.0)
            else:
                tensor.normal_(0.0, STD)
    params = sum(p.numel() for p in model.parameters())
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    tied = "an output matrix of its own" if untied else "tied embeddings"
    print(f"{out}: {shape} ({architecture}), {params / 1e9:.2f}B parameters, vocab {len(tokenizer)}, {tied}")


def write_blocks(shape: str, kind: str, out: Path, tokenizer_cache: Path) -> None:
    """A GGUF of `shape` (BLOCK_SHAPES) in random `kind` blocks (Q4_K_M: llama-quantize's mix), written to `out`."""
    import gguf
    import numpy as np
    import torch

    from specchat.bench.layer_types import random_blocks

    architecture, hidden, layers, ffn, heads, kv_heads, rope = BLOCK_SHAPES[shape]
    tokenizer = qwen_tokenizer(tokenizer_cache)
    head = hidden // heads
    writer = gguf.GGUFWriter(str(out) + ".part", architecture)
    _block_header(writer, shape, layers, hidden, ffn, heads, kv_heads, rope, head)
    writer.add_file_type(gguf.LlamaFileType[f"MOSTLY_{'Q4_K_S' if kind == 'Q4_K' else kind}"])
    _block_tokenizer(writer, tokenizer)
    generator = torch.Generator().manual_seed(0)

    def matrix(name: str, rows: int, width: int, layer: int = -1) -> None:
        finer = kind == "Q4_K_M" and (name == "output.weight" or (layer % 2 == 0 and name.split(".")[-2] in FINER))
        stored = "Q6_K" if finer else "Q4_K" if kind == "Q4_K_M" else kind
        qtype = gguf.GGMLQuantizationType[stored]
        blocks = random_blocks(stored, rows, width, generator).numpy()  # d 0.01, dmin 0.005 (bench/layer_types.py)
        writer.add_tensor(name, blocks, raw_dtype=qtype)

    def floats(name: str, count: int, value: float) -> None:
        writer.add_tensor(name, np.full(count, value, dtype=np.float32))

    matrix("token_embd.weight", len(tokenizer), hidden)
    for layer in range(layers):
        p = f"blk.{layer}."
        floats(p + "attn_norm.weight", hidden, 1.0)
        for part, rows in (("attn_q", hidden), ("attn_k", kv_heads * head), ("attn_v", kv_heads * head)):
            matrix(p + part + ".weight", rows, hidden, layer)
            if architecture == "qwen2":
                floats(p + part + ".bias", rows, 0.0)
        matrix(p + "attn_output.weight", hidden, hidden, layer)
        floats(p + "ffn_norm.weight", hidden, 1.0)
        matrix(p + "ffn_gate.weight", ffn, hidden, layer)
        matrix(p + "ffn_up.weight", ffn, hidden, layer)
        matrix(p + "ffn_down.weight", hidden, ffn, layer)
    floats("output_norm.weight", hidden, 1.0)
    matrix("output.weight", len(tokenizer), hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(str(out) + ".part", out)
    print(f"{out}: {shape} ({architecture}) in {kind} blocks, {out.stat().st_size / 1e9:.2f} GB")


FINER = ("attn_v", "ffn_down")  # what Q4_K_M keeps in Q6_K (here every other layer's)


def _block_header(
    writer, shape: str, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int, rope, head
) -> None:

    writer.add_name(f"random {shape}")
    writer.add_context_length(32768)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(rope)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_dimension_count(head)


def _block_tokenizer(writer, tokenizer) -> None:
    """The bundled Qwen tokenizer as llama.cpp's converter writes a gpt2-style BPE vocabulary."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    tokens = [token for token, _ in sorted(spec["model"]["vocab"].items(), key=lambda item: item[1])]
    added = {entry["id"]: entry["content"] for entry in spec["added_tokens"]}
    tokens += [added[index] for index in range(len(tokens), len(tokenizer))]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list(tokens)
    # llama.cpp's types: CONTROL (3) for special tokens, USER_DEFINED (4) for other added ones (<tool_call>...), as
    # the bundled GGUFs hold them: the file's tokenizer then is the bundled drafter's, and shared with it at start
    special = {entry["id"] for entry in spec["added_tokens"] if entry["special"]}
    writer.add_token_types([(3 if index in special else 4) if index in added else 1 for index in range(len(tokens))])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]])
    writer.add_bos_token_id(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    writer.add_eos_token_id(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    writer.add_pad_token_id(tokenizer.convert_tokens_to_ids("<|endoftext|>"))
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def specchat_decoder(gguf: Path, tokens: int, context: int):
    """The file loaded as the chat loads it (no drafter): (pair, load seconds, the CONTEXT-token prompt, reply), where
    reply() decodes `tokens` new tokens target-only after the prompt (greedy, no stop token) and gives their tok/s."""
    from specchat.config import SamplingConfig, SpeculationConfig
    from specchat.loading.models import load_pair
    from specchat.progress import to_stderr
    from specchat.settings import load_config
    from specchat.speculative.engine import Engine, run_to_end

    cfg = load_config(None, [f"target.source={gguf}", "drafter.source=", "speculation.mode=target"])
    started = time.perf_counter()
    pair = load_pair(cfg, to_stderr())
    load_s = time.perf_counter() - started
    engine = Engine(pair.target, pair.tokenizer, None, eos_ids=(), vocab_size=pair.vocab_size, sampler=pair.sampler)
    prompt = pair.tokenizer.encode("def reverse(lst):\n    return lst[::-1]\n" * 8)[:context]
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=tokens)
    speculation = SpeculationConfig(gamma=0, mode="target")

    def reply() -> float:
        engine.reset()
        stats = run_to_end(engine.steps(prompt, sampling, speculation)).stats
        # the prefill reads all but the prompt's last token: each of the new_tokens is one forward of one token
        return stats.new_tokens / stats.generation_s

    return pair, load_s, prompt, reply


def measure_paired(gguf: Path, bench: Path, threads: int, tokens: int, pairs: int, context: int) -> dict:
    """PAIRS pairs, seconds apart, of llama-bench tg (-n TOKENS at depth CONTEXT, one run) and one specchat decode of
    as many tokens in this process (loaded once), taking turns going first: each pair's ratio sees nearly the same
    machine, where `specchat` and llama-bench's rounds run a minute apart (this VM's bandwidth moves by 1.8x)."""
    import subprocess

    import torch

    torch.set_num_threads(threads)
    _, _, _, reply = specchat_decoder(gguf, tokens, context)
    reply()  # warm-up: compiled paths, first-touch of the weights
    command = [str(bench), "-m", str(gguf), "-p", "0", "-n", str(tokens), "-d", str(context)]
    command += ["-t", str(threads), "-r", "1", "-o", "json"]

    def llama_cpp() -> float:
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        return json.loads(done.stdout)[0]["avg_ts"]

    ours, theirs = [], []
    for index in range(pairs):
        if index % 2:
            ours.append(reply())
            theirs.append(llama_cpp())
        else:
            theirs.append(llama_cpp())
            ours.append(reply())
        print(
            f"pair {index + 1}: specchat {ours[-1]:.1f} tok/s, llama.cpp {theirs[-1]:.1f}, ratio {ours[-1] / theirs[-1]:.3f}"
        )
    ratios = sorted(a / b for a, b in zip(ours, theirs))
    return {
        "file": gguf.name,
        "pairs": pairs,
        "tokens": tokens,
        "threads": threads,
        "specchat_tok_s": ours,
        "llama_cpp_tok_s": theirs,
        "ratio_median": statistics.median(ratios),
        "ratio_quartiles": [ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]],
        "pairs_above_1": sum(r > 1 for r in ratios),
        "cpu": cpu_name(),
    }


def measure_specchat(gguf: Path, threads: int, tokens: int, repeats: int, context: int) -> dict:
    import torch

    torch.set_num_threads(threads)
    from specchat.kernels.build import running_path
    from specchat.speculative import model_io

    pair, load_s, prompt, reply = specchat_decoder(gguf, tokens, context)
    facts = pair.target_facts
    reply()  # warm-up: compiled paths, first-touch of the weights
    decode = [reply() for _ in range(repeats)]
    times = {}
    with torch.inference_mode():
        cache = model_io.new_kv_cache(pair.target)
        model_io.forward(pair.target, cache, prompt, keep=1)
        device = model_io.input_device(pair.target)
        for width in WIDTHS * 2:  # the first round warms each width up
            ids = torch.tensor([prompt[:width]], dtype=torch.long, device=device)
            runs = []
            for _ in range(repeats * 5):
                start = time.perf_counter()
                model_io.forward_tensor(pair.target, cache, ids, keep=width)
                runs.append(time.perf_counter() - start)
                model_io.crop_to(cache, len(prompt))
            times[width] = statistics.median(runs)
    return {
        "file": gguf.name,
        "tool": "specchat",
        "decode_tok_s": statistics.median(decode),
        "decode_runs": decode,
        "t1_ms": times[1] * 1e3,
        "t5_ms": times[5] * 1e3,
        "t5_over_t1": times[5] / times[1],
        "t9_ms": times[9] * 1e3,
        "t9_over_t1": times[9] / times[1],
        "quantization": facts.quantization,
        "dtype": str(facts.dtype),
        "kernel": running_path() or getattr(facts, "kernel", "") or "—",
        "threads": torch.get_num_threads(),
        "load_s": load_s,
        "context": len(prompt),
    }


def llama_bench_rows(path: Path, file_name: str, context: int) -> dict:
    """llama-bench's JSON (-o json) of one file: tg tok/s, T(1) and T(5) from its pp tests."""
    rows = json.loads(path.read_text())
    result = {"file": file_name, "tool": "llama.cpp"}
    for row in rows:
        n_prompt, n_gen, ts = row["n_prompt"], row["n_gen"], row["avg_ts"]
        if n_gen and not n_prompt:
            result["tg_tok_s"] = ts
            result["tg_runs"] = row.get("samples_ts")
        elif n_prompt in WIDTHS and not n_gen:
            result[f"t{n_prompt}_ms"] = n_prompt / ts * 1e3
        result.setdefault("build", f"{row.get('build_commit', '?')} ({row.get('build_number', '?')})")
        result.setdefault("backend", row.get("backends", ""))
        result.setdefault("cpu", row.get("cpu_info", ""))
        result.setdefault("threads", row.get("n_threads"))
    for n in WIDTHS[1:]:
        if "t1_ms" in result and f"t{n}_ms" in result:
            result[f"t{n}_over_t1"] = result[f"t{n}_ms"] / result["t1_ms"]
    result["depth"] = context
    return result


def cpu_name() -> str:
    try:
        for line in os.popen("lscpu").read().splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def rounds_text(entries: list[dict]) -> str:
    """The rounds behind the medians: each tool's entries per file, "4", or "2–4" where files had different counts
    (results of several runs put together)."""
    counts = collections.Counter((e["file"], e["tool"]) for e in entries).values()
    low, high = min(counts, default=0), max(counts, default=0)
    return str(low) if low == high else f"{low}–{high}"


def table(results: Path) -> str:
    """One row per file: each tool's medians over the rounds, and the ratios."""
    entries = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    files = list(dict.fromkeys(e["file"] for e in entries))
    kernels = sorted({e["kernel"] for e in entries if e["tool"] == "specchat" and "kernel" in e})
    threads = sorted({str(e["threads"]) for e in entries if e.get("threads")})
    lines = [
        f"CPU: {cpu_name()} · specchat kernel path: {', '.join(kernels) or '—'} · threads {', '.join(threads)} · "
        f"{rounds_text(entries)} round(s), medians",
        "",
        "| file | llama.cpp tg tok/s | specchat tok/s | ratio | llama.cpp T(1) ms | specchat T(1) ms "
        "| llama.cpp T(5)/T(1) | specchat T(5)/T(1) | llama.cpp T(9)/T(1) | specchat T(9)/T(1) "
        "| specchat quantization |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def med(file, tool, key):
        values = [e[key] for e in entries if e["file"] == file and e["tool"] == tool and e.get(key) is not None]
        return statistics.median(values) if values else None

    def show(value, spec=".2f"):
        return "—" if value is None else format(value, spec)

    for file in files:
        tg, ours = med(file, "llama.cpp", "tg_tok_s"), med(file, "specchat", "decode_tok_s")
        ratio = ours / tg if tg and ours else None
        quantization = next(
            (
                e["quantization"]
                for e in entries
                if e["file"] == file and e["tool"] == "specchat" and "quantization" in e
            ),
            "failed",
        )
        lines.append(
            f"| {file} | {show(tg, '.1f')} | {show(ours, '.1f')} | {show(ratio)} | "
            f"{show(med(file, 'llama.cpp', 't1_ms'), '.1f')} | {show(med(file, 'specchat', 't1_ms'), '.1f')} | "
            f"{show(med(file, 'llama.cpp', 't5_over_t1'))} | {show(med(file, 'specchat', 't5_over_t1'))} | "
            f"{show(med(file, 'llama.cpp', 't9_over_t1'))} | {show(med(file, 'specchat', 't9_over_t1'))} | "
            f"{quantization} |"
        )
    for error in dict.fromkeys(f"{e['file']}: {e['error']}" for e in entries if "error" in e):
        lines.append(f"specchat failed on {error}")
    build = next((e["build"] for e in entries if e["tool"] == "llama.cpp"), "?")
    lines += ["", f"llama.cpp build {build}; goals: ratio ≥ 1.0 (1.5 at 7B, issue 75), specchat T(5)/T(1) ≤ 1.3"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="a random-weight HF checkpoint")
    b.add_argument("--shape", choices=sorted(SHAPES), required=True)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--tokenizer-cache", type=Path, required=True, help="where the Qwen tokenizer is kept")
    b.add_argument("--untied", action="store_true", help="an output matrix apart from the embeddings")
    bl = sub.add_parser("blocks", help="a GGUF of a large shape in random blocks of one type")
    bl.add_argument("--shape", choices=sorted(BLOCK_SHAPES), required=True)
    bl.add_argument("--type", choices=BLOCK_TYPES, required=True)
    bl.add_argument("--out", type=Path, required=True)
    bl.add_argument("--tokenizer-cache", type=Path, required=True, help="where the Qwen tokenizer is kept")
    s = sub.add_parser("specchat", help="specchat's decode tok/s, T(1), T(5) and T(9) on a GGUF file")
    s.add_argument("--gguf", type=Path, required=True)
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--tokens", type=int, default=64)
    s.add_argument("--repeats", type=int, default=3)
    s.add_argument("--context", type=int, default=CONTEXT)
    s.add_argument("--json", type=Path, required=True, help="JSON-lines file the result is appended to")
    lb = sub.add_parser("llama-bench", help="append llama-bench's JSON of one file to the results")
    lb.add_argument("--bench-json", type=Path, required=True)
    lb.add_argument("--file", required=True)
    lb.add_argument("--context", type=int, default=CONTEXT)
    lb.add_argument("--json", type=Path, required=True)
    pp = sub.add_parser("paired", help="llama-bench tg and specchat decode in pairs, seconds apart")
    pp.add_argument("--gguf", type=Path, required=True)
    pp.add_argument("--llama-bench", type=Path, required=True, help="llama.cpp's built llama-bench")
    pp.add_argument("--threads", type=int, default=2)
    pp.add_argument("--tokens", type=int, default=32)
    pp.add_argument("--pairs", type=int, default=20)
    pp.add_argument("--context", type=int, default=CONTEXT)
    pp.add_argument("--json", type=Path, required=True, help="JSON-lines file the result is appended to")
    t = sub.add_parser("table", help="the side-by-side table of a results file")
    t.add_argument("results", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        build(args.shape, args.out, args.tokenizer_cache, args.untied)
        return 0
    if args.command == "blocks":
        write_blocks(args.shape, args.type, args.out, args.tokenizer_cache)
        return 0
    if args.command == "table":
        print(table(args.results))
        return 0
    if args.command == "paired":
        row = measure_paired(args.gguf, args.llama_bench, args.threads, args.tokens, args.pairs, args.context)
        with args.json.open("a") as out:
            out.write(json.dumps(row) + "\n")
        print(
            f"{row['file']}: {row['pairs']} pairs, specchat ÷ llama.cpp median {row['ratio_median']:.3f} "
            f"(quartiles {row['ratio_quartiles'][0]:.3f}–{row['ratio_quartiles'][1]:.3f}), "
            f"{row['pairs_above_1']} of {row['pairs']} above 1"
        )
        return 0
    if args.command == "specchat":
        try:
            row = measure_specchat(args.gguf, args.threads, args.tokens, args.repeats, args.context)
        except Exception as err:  # a file specchat cannot load: kept in the results, shown in the table
            row = {"file": args.gguf.name, "tool": "specchat", "error": f"{type(err).__name__}: {err}"}
            traceback.print_exc()
    else:
        row = llama_bench_rows(args.bench_json, args.file, args.context)
    with args.json.open("a") as out:
        out.write(json.dumps(row) + "\n")
    shown = {k: v for k, v in row.items() if not k.endswith("_runs")}
    print(json.dumps(shown))
    return 1 if "error" in row else 0


if __name__ == "__main__":
    raise SystemExit(main())

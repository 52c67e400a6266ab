#!/usr/bin/env bash
# specchat vs llama.cpp's llama-bench at real shapes (issue 52's speed goal), on the same GGUF files.
#
#   scripts/real_shape.sh --llamacpp DIR --out DIR [--shape real|tiny|large|large-tiny] [--rounds 2] [--tokens 64]
#                         [--threads 2] [--context 32] [--types "Q4_K_M Q8_0"] [--untied] [--prepare-only]
#
# DIR (--llamacpp): a llama.cpp tree with convert_hf_to_gguf.py, gguf-py/ and the built tools
# build/bin/llama-bench and build/bin/llama-quantize.
# For each shape (real: a Llama-3.2-1B shape and a Qwen3-1.7B shape; tiny: 2-layer stand-ins to check
# the script) it builds a random-weight checkpoint with the bundled Qwen tokenizer (scripts/real_shape.py
# build), converts it with llama.cpp's own convert_hf_to_gguf.py to F16, quantizes that to Q4_K_M, Q8_0,
# Q6_K and IQ4_XS with llama-quantize; every file is kept in --out and not made again. Then, ROUNDS times, file by
# file, the two tools take turns, llama.cpp first in odd rounds and specchat in even ones: llama-bench tg
# (-n TOKENS, -r 3) and pp of 1, 5 and 9 tokens (-r 10), both at depth CONTEXT; specchat (scripts/real_shape.py
# specchat: target-only decode through the engine and T(1), T(5), T(9) after a CONTEXT-token context, the default
# config with target.source=FILE and no drafter). Threads: THREADS for both. The results go to OUT/results-<shape>-<time>.jsonl, and the table
# (medians over the rounds) is printed and written beside them (.md).
# --untied: the same shapes with an output matrix apart from the embeddings (files *-untied-*; the same
# work per token for both tools), for a specchat that cannot yet load a tied-embedding quantized file.
# --types: the quantization types timed (all are made either way), e.g. --types Q4_K_M for more rounds of one.
# --prepare-only makes the files and stops: nothing is timed.
# --shape large: Qwen2.5-7B's, Llama-3.1-8B's and Qwen2.5-14B's shapes, each file written straight from random blocks
# of its type (scripts/real_shape.py blocks: Q4_K_M, Q8_0 and Q4_0 by default; --types picks among them and Q4_K,
# Q6_K), no float checkpoint and no llama-quantize; 4.3-15 GB a file. large-tiny: a 2-layer stand-in to check it;
# --shape qwen2.5-7b (or llama-3.1-8b, qwen2.5-14b): that one shape alone.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
python="${PYTHON:-$repo/.venv/bin/python}"
llamacpp="" out="" shape="real" rounds=2 tokens=64 threads=2 context=32 prepare_only=0 untied="" types="Q4_K_M Q8_0 Q6_K"
types_given=""
made="Q4_K_M Q8_0 Q6_K IQ4_XS"  # the types quantized from F16

die() {
    echo "real_shape.sh: error: $*" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case "$1" in
    --llamacpp) llamacpp="${2:-}"; shift 2 ;;
    --out) out="${2:-}"; shift 2 ;;
    --shape) shape="${2:-}"; shift 2 ;;
    --rounds) rounds="${2:-}"; shift 2 ;;
    --tokens) tokens="${2:-}"; shift 2 ;;
    --threads) threads="${2:-}"; shift 2 ;;
    --context) context="${2:-}"; shift 2 ;;
    --types) types="${2:-}" types_given="${2:-}"; shift 2 ;;
    --untied) untied="--untied"; shift ;;
    --prepare-only) prepare_only=1; shift ;;
    -h | --help) sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done

[ -n "$llamacpp" ] || die "--llamacpp DIR is required (a llama.cpp tree with build/bin/llama-bench)"
[ -n "$out" ] || die "--out DIR is required"
case "$shape" in
real) shapes=(llama-1b qwen3-1.7b) ;;
tiny) shapes=(tiny-llama tiny-qwen3) ;;
large) shapes=(qwen2.5-7b llama-3.1-8b qwen2.5-14b) ;;
large-tiny) shapes=(tiny-blocks) ;;
qwen2.5-7b | llama-3.1-8b | qwen2.5-14b) shapes=("$shape") ;;
*) die "--shape is real, tiny, large, large-tiny or one large shape (qwen2.5-7b, llama-3.1-8b, qwen2.5-14b), got '$shape'" ;;
esac
blocks=0
case "$shape" in real | tiny) ;; *) blocks=1 made="Q4_K_M Q8_0 Q4_0 Q4_K Q6_K" types="${types_given:-Q4_K_M Q8_0 Q4_0}" ;; esac
[ -d "$llamacpp" ] || die "--llamacpp: no directory $llamacpp"
llamacpp="$(cd "$llamacpp" && pwd)"
bench="$llamacpp/build/bin/llama-bench"
quantize="$llamacpp/build/bin/llama-quantize"
convert="$llamacpp/convert_hf_to_gguf.py"
for tool in "$bench" "$quantize"; do
    [ "$blocks" = 1 ] && [ "$tool" = "$quantize" ] && continue  # block files are written, not quantized
    [ -x "$tool" ] || die "$llamacpp lacks $tool (build it: cmake --build build --target llama-bench llama-quantize)"
done
[ -f "$convert" ] && [ -d "$llamacpp/gguf-py" ] || die "$llamacpp lacks convert_hf_to_gguf.py or gguf-py/"
[ -x "$python" ] || die "no python at $python (set PYTHON, or make the repo's .venv)"

mkdir -p "$out/hf" "$out/gguf"
out="$(cd "$out" && pwd)"
# the converter imports sentencepiece even for a tokenizer.json vocabulary; kept beside the files, not in the venv
pydeps="$out/pydeps"
export PYTHONPATH="$llamacpp/gguf-py:$pydeps${PYTHONPATH:+:$PYTHONPATH}"

files=()
for shape_name in "${shapes[@]}"; do
    if [ "$blocks" = 1 ]; then
        for q in $types; do
            case " $made " in *" $q "*) ;; *) die "--types for block files are among $made, not '$q'" ;; esac
            file="$out/gguf/$shape_name-$q.gguf"
            [ -s "$file" ] || "$python" "$here/real_shape.py" blocks --shape "$shape_name" --type "$q" --out "$file" \
                --tokenizer-cache "$out/qwen-tokenizer" || die "could not write $file"
            files+=("$file")
        done
        continue
    fi
    name="$shape_name${untied:+-untied}"
    hf="$out/hf/$name"
    f16="$out/gguf/$name-F16.gguf"
    need=0
    for q in $made; do [ -s "$out/gguf/$name-$q.gguf" ] || need=1; done
    if [ "$need" = 1 ] && [ ! -s "$f16" ]; then
        "$python" "$here/real_shape.py" build --shape "$shape_name" --out "$hf" \
            --tokenizer-cache "$out/qwen-tokenizer" $untied
        if ! "$python" -c "import sentencepiece" 2>/dev/null; then
            "$python" -m pip install --quiet --target "$pydeps" "sentencepiece>=0.1.98,<0.3.0" ||
                die "cannot install sentencepiece (convert_hf_to_gguf.py imports it) into $pydeps"
        fi
        echo "converting $name to $f16"
        "$python" "$convert" "$hf" --outtype f16 --outfile "$f16.part" >"$out/gguf/$name-convert.log" 2>&1 ||
            die "convert_hf_to_gguf.py failed on $hf; see $out/gguf/$name-convert.log"
        mv "$f16.part" "$f16"
    fi
    for q in $made; do
        file="$out/gguf/$name-$q.gguf"
        if [ ! -s "$file" ]; then
            echo "quantizing $name to $q"
            "$quantize" "$f16" "$file.part" "$q" "$threads" >"$out/gguf/$name-$q-quantize.log" 2>&1 ||
                die "llama-quantize failed on $f16 ($q); see $out/gguf/$name-$q-quantize.log"
            mv "$file.part" "$file"
        fi
        case " $types " in *" $q "*) files+=("$file") ;; esac
    done
done
[ "${#files[@]}" -gt 0 ] || die "--types names none of $made: '$types'"
ls -l "${files[@]}"
[ "$prepare_only" = 0 ] || exit 0

stamp="$(date -u +%Y%m%dT%H%M%SZ)"
results="$out/results-$shape${untied:+-untied}-$stamp.jsonl"
logs="$out/logs-$stamp"
mkdir -p "$logs"
echo "timing ${#files[@]} files, $rounds round(s), $threads threads, $tokens tokens at depth $context; results in $results"
time_llamacpp() {  # round file
    local base json
    base="$(basename "$2")"
    echo "round $1 · $base · llama-bench"
    json="$logs/llama-bench-$1-${base%.gguf}.json"
    {
        "$bench" -m "$2" -p 0 -n "$tokens" -d "$context" -t "$threads" -r 3 -o json
        "$bench" -m "$2" -p 1,5,9 -n 0 -d "$context" -t "$threads" -r 10 -o json
    } >"$json.parts" 2>"$json.log" || die "llama-bench failed on $2; see $json.log"
    # two JSON arrays, one a run: join them into one
    "$python" -c 'import json,sys; t=open(sys.argv[1]).read(); d=json.JSONDecoder(); rows=[]; i=0
while i < len(t):
    if t[i].isspace(): i += 1; continue
    part, i = d.raw_decode(t, i); rows += part
json.dump(rows, open(sys.argv[2], "w"), indent=1)' "$json.parts" "$json"
    "$python" "$here/real_shape.py" llama-bench --bench-json "$json" --file "$base" --context "$context" \
        --json "$results"
}

time_specchat() {  # round file
    local base
    base="$(basename "$2")"
    echo "round $1 · $base · specchat"
    "$python" "$here/real_shape.py" specchat --gguf "$2" --threads "$threads" --tokens "$tokens" \
        --context "$context" --json "$results" 2>"$logs/specchat-$1-${base%.gguf}.log" ||
        echo "specchat failed on $base; see $logs/specchat-$1-${base%.gguf}.log" >&2
}

for round in $(seq 1 "$rounds"); do
    for file in "${files[@]}"; do
        if [ $((round % 2)) = 1 ]; then  # who goes first alternates, so neither tool always follows the other
            time_llamacpp "$round" "$file"
            time_specchat "$round" "$file"
        else
            time_specchat "$round" "$file"
            time_llamacpp "$round" "$file"
        fi
    done
done
table="${results%.jsonl}.md"
"$python" "$here/real_shape.py" table "$results" | tee "$table"
echo "wrote $results and $table"

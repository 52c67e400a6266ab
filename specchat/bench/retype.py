"""A GGUF's weights written again in another block type, for fidelity runs on real weights.

    python -m specchat.bench.retype SOURCE OUT.gguf --type Q8_0

SOURCE is a .gguf file or bundled:NAME. Every tensor gguf-py can quantize to the type (2-d, rows a whole number of
its blocks) is dequantized and quantized again with gguf-py's own quantizer (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; the
k-quants only through llama.cpp's llama-quantize --allow-requantize); the others (norms, biases) are copied as they
are, and so is the metadata but the file type. The new file's weights are what its blocks decode to:
`python -m specchat.bench.targets --gguf OUT.gguf --llamacpp` then measures specchat and llama.cpp against them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

WRITABLE = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")  # the types gguf-py's quantizer writes


def retype(source: Path, out: Path, kind: str, say=print) -> int:
    """Write `source` again as `out` with its quantizable tensors in `kind`; returns how many were retyped."""
    import gguf
    from gguf.quants import dequantize, quantize

    qtype = gguf.GGMLQuantizationType[kind]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    reader = gguf.GGUFReader(str(source))
    architecture = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(str(out), architecture)
    for field in reader.fields.values():
        if field.name in (gguf.Keys.General.ARCHITECTURE, gguf.Keys.General.FILE_TYPE) or field.name.startswith(
            "GGUF."
        ):
            continue
        kind_of = field.types[0]
        sub_type = field.types[-1] if kind_of == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind_of, sub_type=sub_type)
    retyped = 0
    for tensor in reader.tensors:
        shape = [int(n) for n in reversed(tensor.shape)]  # rows first, as numpy holds them
        if len(shape) == 2 and shape[1] % block == 0:
            values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape(shape)
            writer.add_tensor(tensor.name, quantize(values, qtype), raw_dtype=qtype)
            retyped += 1
        else:
            writer.add_tensor(tensor.name, np.array(tensor.data), raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    say(f"{out}: {retyped} of {len(reader.tensors)} tensors written as {kind}")
    return retyped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specchat.bench.retype", description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a .gguf file or bundled:NAME")
    parser.add_argument("out", type=Path, help="the file to write")
    parser.add_argument("--type", dest="kind", choices=WRITABLE, required=True, help="the block type to write")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    from specchat.bench.llamacpp import gguf_path
    from specchat.config import ConfigError
    from specchat.errors import ModelLoadError
    from specchat.loading.assets import AssetError

    try:
        source = gguf_path(args.source)
    except (ConfigError, AssetError, ModelLoadError) as err:
        source, why = None, str(err)
    else:
        why = f"{args.source} is not a GGUF file"
    if source is None or not source.is_file():
        print(f"specchat bench retype: error: {why}", file=sys.stderr)
        return 2
    retype(source, args.out, args.kind)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

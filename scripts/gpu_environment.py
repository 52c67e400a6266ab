"""What the GPU check runs on: torch and CUDA, each GPU, and the versions of the libraries the GPU paths use."""

from importlib.metadata import PackageNotFoundError, version

import torch

print(
    "torch",
    torch.__version__,
    "cuda",
    torch.version.cuda,
    "available",
    torch.cuda.is_available(),
    "devices",
    torch.cuda.device_count(),
)
for index in range(torch.cuda.device_count()):
    free, total = torch.cuda.mem_get_info(index)
    print(
        f"  cuda:{index}",
        torch.cuda.get_device_name(index),
        "capability",
        torch.cuda.get_device_capability(index),
        f"memory {total / 2**30:.1f} GiB ({free / 2**30:.1f} free)",
    )
for name in ("transformers", "accelerate", "bitsandbytes", "gguf", "prompt_toolkit", "rich", "pytest"):
    try:
        print(name, version(name))
    except PackageNotFoundError:  # a missing package is part of the report
        print(name, "not installed")

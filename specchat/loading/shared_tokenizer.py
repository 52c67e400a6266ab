"""A checkpoint's tokenizer (the last materialise step), and one tokenizer for a pair whose two checkpoints
hold the same tokenizer files.

A target and its drafter usually ship byte-identical tokenizer files (the bundled Qwen2.5-Coder pair
does: 11 MB of tokenizer.json each). Reading them twice, and then comparing 152k ids one by one to
prove the two tokenizers agree, took about 2 s of a 15 s start, and each read tokenizer holds about 100 MB.
When the files are the same, the drafter gets the target's tokenizer object and there is nothing to compare;
when only their chat templates differ (the bundled pair's do), a copy of it that shares its vocabulary (the
backend tokenizer) and carries its own template.

A tokenizer with no chat template (a base model's, gpt2's) gets specchat's plain User:/Assistant: one.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from specchat.loading.checkpoint import Checkpoint
from specchat.loading.hfquiet import quiet_transformers
from specchat.loading.plan import ModelPlan
from specchat.loading.sources import load_failure

# Used only for models whose tokenizer has no chat template (base models such as gpt2);
# ModelFacts.template says so, for the banner.
PLAIN_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}\n\n"
    "{% elif m['role'] == 'user' %}User: {{ m['content'] }}\n"
    "{% else %}Assistant: {{ m['content'] }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
PLAIN_TURN_STOP = "\nUser:"  # a base model under PLAIN_TEMPLATE that writes this has begun the user's next turn

# What AutoTokenizer reads from a directory for the vocabulary: the tokenizer's own files, remote code (the chat
# template apart: chat_template.jinja or .json, and tokenizer_config.json's "chat_template").
TOKENIZER_FILES = re.compile(
    r"^(tokenizer.*|vocab.*|merges\.txt|special_tokens_map\.json|added_tokens\.json|.*\.model|.*\.tiktoken|.*\.py)$"
)
UNREAD = object()  # a chat template this module does not read itself (named templates, a folder of them)


def tokenizer_digest(location: str, trust_remote_code: bool) -> str | None:
    """A digest of everything a local checkpoint's vocabulary is built from: its tokenizer files (with
    tokenizer_config.json less its chat template), and the config's model type (which picks the tokenizer class
    when tokenizer_config.json names none). None for a hub id: those are not compared."""
    folder = Path(location)
    if not folder.is_dir():
        return None
    digest = hashlib.sha256(f"remote code: {trust_remote_code}\n".encode())
    for path in sorted(folder.iterdir()):
        if path.is_file() and TOKENIZER_FILES.match(path.name) and not path.name.endswith(".verified"):
            data = _without_template(path.read_bytes()) if path.name == "tokenizer_config.json" else path.read_bytes()
            digest.update(f"{path.name}\n{len(data)}\n".encode())
            digest.update(data)
    digest.update(f"model type: {_model_type(folder)}".encode())
    return digest.hexdigest()


def _without_template(config: bytes) -> bytes:
    """tokenizer_config.json's bytes less its "chat_template" (as they are where it is not a JSON object)."""
    try:
        fields = json.loads(config)
    except ValueError:
        return config
    if not isinstance(fields, dict):
        return config
    fields.pop("chat_template", None)
    return json.dumps(fields, sort_keys=True).encode()


def chat_template_of(folder: Path) -> str | None | object:
    """The chat template a checkpoint's tokenizer would load (chat_template.jinja, chat_template.json, else
    tokenizer_config.json's), None where it has none, UNREAD where it is not one string (named templates)."""
    if (folder / "additional_chat_templates").exists():
        return UNREAD
    try:
        if (folder / "chat_template.jinja").is_file():
            return (folder / "chat_template.jinja").read_text()
        for name in ("chat_template.json", "tokenizer_config.json"):
            if (folder / name).is_file():
                template = json.loads((folder / name).read_text()).get("chat_template")
                if template is not None or name == "chat_template.json":
                    return template if isinstance(template, str) else UNREAD
    except (OSError, ValueError, AttributeError):
        return UNREAD
    return None


def _model_type(folder: Path) -> str:
    try:
        return str(json.loads((folder / "config.json").read_text()).get("model_type", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def shared_tokenizer(checkpoint: Checkpoint, plan: ModelPlan, tokenizers: dict | None = None) -> tuple[Any, str]:
    """The tokenizer already read from identical files (local checkpoints only), else a new one; with whether
    its chat template is its own or specchat's plain one. `tokenizers`: digest of the files -> (tokenizer, template)."""
    shareable = tokenizers is not None and checkpoint.local
    key = tokenizer_digest(checkpoint.location, plan.trust_remote_code) if shareable else None
    if key is None or tokenizers is None:
        return load_tokenizer(checkpoint, plan)
    if key not in tokenizers:
        tokenizers[key] = load_tokenizer(checkpoint, plan)
        return tokenizers[key]
    tokenizer, kind = tokenizers[key]
    template = chat_template_of(Path(checkpoint.location))
    if template is UNREAD:
        return load_tokenizer(checkpoint, plan)
    if template == (tokenizer.chat_template if kind == "own" else None):
        return tokenizer, kind
    return with_template(tokenizer, template)


def with_template(tokenizer, template) -> tuple[Any, str]:
    """A copy of `tokenizer` (its vocabulary, the backend tokenizer, shared) with its own chat template, or the
    plain one where `template` is None."""
    copied = copy.copy(tokenizer)
    if template is None:
        copied.chat_template = plain_template(tokenizer)
        return copied, "plain"
    copied.chat_template = template
    return copied, "own"


def load_tokenizer(checkpoint: Checkpoint, plan: ModelPlan) -> tuple[Any, str]:
    """The tokenizer, and whether its chat template is its own or specchat's plain one."""
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(checkpoint.location, **checkpoint.load_kwargs)
    except Exception as err:  # any failure inside transformers becomes one line for the user
        raise load_failure(err, plan.source, "the tokenizer") from err
    if getattr(tokenizer, "chat_template", None):
        return tokenizer, "own"
    tokenizer.chat_template = plain_template(tokenizer)
    return tokenizer, "plain"


def plain_template(tokenizer) -> str:
    """PLAIN_TEMPLATE, opened with the BOS token when the tokenizer puts one before ordinary text (Llama-2 does,
    gpt2 and bloom do not): apply_chat_template adds no special tokens of its own."""
    bos = getattr(tokenizer, "bos_token_id", None)
    ids = tokenizer("a")["input_ids"]
    if bos is not None and ids and ids[0] == bos:
        return "{{ bos_token }}" + PLAIN_TEMPLATE
    return PLAIN_TEMPLATE

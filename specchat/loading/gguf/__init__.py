"""GGUF files: the bounded header reader (header.py), the metadata and config it states (metadata.py,
config.py), tensors read a row chunk at a time (tensors.py), Q4_K blocks taken as they are (blocks.py),
and the conversion to a cached transformers checkpoint (convert.py; slim.py: with no float copy of what the
kernel runs)."""

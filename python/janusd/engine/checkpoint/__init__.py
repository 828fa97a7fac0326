"""Checkpoint readers: HF safetensors dirs (hf.py), GGUF files (gguf_file.py), demo checkpoints (demo.py)."""

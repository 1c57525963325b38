"""`rlvr model [NAME]`: build a built-in model once (later runs find it in the cache): the
default small model, or a pinned coder model by name."""
from __future__ import annotations

from modeling.default_model import prepare_default_model
from modeling.pinned_models import PINNED, PinError, prepare_pinned_model
from rl.config import DEFAULT_MODEL


def build(name: str, force: bool) -> None:
    if name == DEFAULT_MODEL:
        print(prepare_default_model(force=force))
        return
    try:
        print(prepare_pinned_model(name, force=force))
    except PinError as e:   # the files are not the pinned ones: a refusal, not a crash
        raise SystemExit(f"rlvr model: {e}") from None


def register(sub) -> None:
    p = sub.add_parser("model", help="prepare a built-in model: the default SmolLM2-135M-Instruct, or a pinned "
                                     "coder model by name")
    p.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=[DEFAULT_MODEL, *PINNED],
                   help=f"the model.path name (default: {DEFAULT_MODEL}, SmolLM2-135M-Instruct)")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.set_defaults(func=lambda a: build(a.name, a.force))

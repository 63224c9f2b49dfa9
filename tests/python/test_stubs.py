"""The shipped type stubs (_kvstrand.pyi, sim.pyi) say what the module has:
every public name, every class member and every parameter name, both ways."""

import ast
import inspect
import os
import re

import pytest

import kvstrand
import kvstrand._kvstrand as native
import kvstrand.sim

STUB_DIR = os.path.dirname(kvstrand.__file__)
ALIASES = {"Seconds", "Tokens"}  # the stubs' own type aliases


def stub(name):
    with open(os.path.join(STUB_DIR, name)) as f:
        return ast.parse(f.read())


def top_level(tree):
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            out.setdefault(node.name, node)
        elif isinstance(node, ast.AnnAssign):
            out[node.target.id] = node
    return out


def members(cls_node):
    names = set()
    for node in cls_node.body:
        if isinstance(node, ast.FunctionDef) and not (node.name.startswith("_") and node.name != "__init__"):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
    return names - {"__init__"}


def split_args(text):
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch in "[(" and 1 or (ch in "])" and -1 or 0)
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p.strip() for p in parts + [cur] if p.strip()]


def runtime_params(fn):
    """Parameter names from pybind11's signature line; None when it has none."""
    first = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
    m = re.match(r"^\w+\((.*)\) ->", first)
    if not m:
        return None
    names = [p.split(":")[0].split("=")[0].strip() for p in split_args(m.group(1))]
    return [n for n in names if n not in ("self", "*") and not n.startswith("*")]


def stub_params(fn_node):
    a = fn_node.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg != "self"]


def test_every_public_name_of_the_module_has_a_stub_and_every_stub_a_name():
    names = top_level(stub("_kvstrand.pyi"))
    runtime = {n for n in dir(native) if not n.startswith("_") and n != "sim"} | {"__version__"}
    assert set(names) - ALIASES == runtime


def test_every_class_member_is_in_its_stub_and_every_stubbed_member_exists():
    names = top_level(stub("_kvstrand.pyi"))
    for name, node in names.items():
        obj = getattr(native, name, None)
        if not isinstance(node, ast.ClassDef) or not inspect.isclass(obj):
            continue
        if issubclass(obj, BaseException):
            stub_bases = {b.id for b in node.bases}
            assert {b.__name__ for b in obj.__bases__} == stub_bases, name
            continue
        runtime = {k for k in vars(obj) if not k.startswith("_")} | (
            {"__len__"} if "__len__" in vars(obj) else set())
        assert members(node) | ({"__len__"} & runtime) == runtime, name


def test_parameter_names_match():
    checked = 0
    for name, node in top_level(stub("_kvstrand.pyi")).items():
        obj = getattr(native, name, None)
        fns = []
        if isinstance(node, ast.FunctionDef):
            fns.append((name, obj, node))
        elif isinstance(node, ast.ClassDef):
            for m in node.body:
                if isinstance(m, ast.FunctionDef) and not any(
                        isinstance(d, ast.Name) and d.id == "property" for d in m.decorator_list):
                    fns.append((f"{name}.{m.name}", getattr(obj, m.name, None), m))
        for label, fn, fn_node in fns:
            params = runtime_params(fn) if fn is not None else None
            if params is None:
                continue  # no signature line: overloads, Python's own __init__
            assert stub_params(fn_node) == params, label
            checked += 1
    assert checked > 50


def test_the_sim_module_and_its_stub_agree():
    names = top_level(stub("sim.pyi"))
    assert set(names) == set(kvstrand.sim.__all__)
    for name in ("allocate", "hold_stream", "release_stream", "set_stream_delay"):
        assert stub_params(names[name]) == runtime_params(getattr(kvstrand.sim, name)), name


def test_the_stubs_parse_as_python():
    for name in ("_kvstrand.pyi", "sim.pyi"):
        compile(open(os.path.join(STUB_DIR, name)).read(), name, "exec")


@pytest.mark.parametrize("name", ["py.typed", "_kvstrand.pyi", "sim.pyi"])
def test_the_typing_files_ship_with_the_package(name):
    assert os.path.exists(os.path.join(STUB_DIR, name))

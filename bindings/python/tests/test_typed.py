"""The public API is typed for editors and type checkers (py.typed ships with
the package): every public function, method and property has a docstring,
every parameter and result an annotation that is not a bare Any, and options
are keyword parameters (no **kwargs), so an editor flags topk= for top_k=."""
from __future__ import annotations

import inspect
import typing
from pathlib import Path

import kvmem

PKG = Path(kvmem.__file__).resolve().parent


def public_callables():
    for name in sorted(kvmem.__all__):
        obj = getattr(kvmem, name)
        if inspect.isclass(obj) and obj.__module__.startswith("kvmem"):
            if issubclass(obj, BaseException):
                continue
            yield name, obj, obj
            for mname, member in inspect.getmembers(obj):
                static = inspect.getattr_static(obj, mname)
                if mname.startswith("_") and mname != "__init__":
                    continue
                if mname == "__init__" and "__init__" not in obj.__dict__:
                    continue
                if isinstance(static, property):
                    yield f"{name}.{mname}", static.fget, obj
                elif inspect.isfunction(member) or isinstance(static, classmethod):
                    if getattr(member, "__module__", "").startswith("kvmem"):
                        yield f"{name}.{mname}", member, obj
        elif inspect.isfunction(obj) and obj.__module__.startswith("kvmem"):
            yield name, obj, None


def test_every_public_callable_has_a_docstring():
    missing = []
    for name, fn, owner in public_callables():
        doc = fn.__doc__ if not inspect.isclass(fn) else fn.__dict__.get("__doc__")
        if name.endswith(".__init__"):
            continue  # the class's docstring describes its constructor
        if not (doc and doc.strip()):
            missing.append(name)
    assert not missing, f"no docstring: {missing}"


def test_every_parameter_and_result_is_annotated_without_bare_any_and_no_kwargs():
    bad = []
    for name, fn, owner in public_callables():
        if inspect.isclass(fn):
            continue
        hints = typing.get_type_hints(fn)
        sig = inspect.signature(fn)
        for p in sig.parameters.values():
            if p.name in ("self", "cls"):
                continue
            if p.kind is p.VAR_KEYWORD:
                bad.append(f"{name}(**{p.name})")
            elif p.kind is p.VAR_POSITIONAL:
                continue  # __exit__(*exc)
            elif p.name not in hints:
                bad.append(f"{name}({p.name}): no annotation")
            elif hints[p.name] is typing.Any and "Any" == str(fn.__annotations__.get(p.name)):
                bad.append(f"{name}({p.name}): Any")
        if "return" not in hints:
            bad.append(f"{name}: no return annotation")
    assert not bad, "\n".join(bad)


def test_py_typed_ships_with_the_package():
    assert (PKG / "py.typed").is_file()

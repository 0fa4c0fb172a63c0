"""Import SGLang's own modules from its wheel on a machine without SGLang's dependencies.

Used by the device scripts (scripts/capture-sglang-options, scripts/check-adaptive-threshold):
unpacks the wheel and puts it first on sys.path, then lets any third-party module that one of
SGLang's modules imports and that is not installed be a stub. Only code that declares things
(argument parsers, config classes) can run this way; nothing stubbed may be called.
torch and msgspec must be real (installed).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import tempfile
import types
import zipfile


class _Anything:
    """Stands in for whatever a stubbed module is asked for at import time."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> object:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _Anything()

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()

    def __mro_entries__(self, bases: tuple[object, ...]) -> tuple[type, ...]:
        return (object,)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(())

    def __getitem__(self, key: object) -> object:
        return _Anything()


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything()


def _imported_by_sglang() -> bool:
    """Is the import statement that got here in one of SGLang's modules?"""
    frame = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("importlib") and module != "__main__":
            return module.split(".")[0] == "sglang"
        frame = frame.f_back
    return False


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: reached only for modules nothing else can find."""

    def __init__(self) -> None:
        self.stubbed: list[str] = []

    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        top = name.split(".")[0]
        if top == "sglang" or top in sys.stdlib_module_names or top.startswith("_"):
            return None  # SGLang itself, and the standard library, are never faked
        if "." in name and top not in self.stubbed:
            return None  # a missing part of a real package: let its import fail as it would
        if not _imported_by_sglang():
            return None  # other libraries' optional imports fail as they expect
        self.stubbed.append(name)
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return _StubModule(spec.name)

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        module.__path__ = []


def add_wheel(wheel: str) -> list[str]:
    """Unpack the wheel's sglang/ and make it importable; return the stubbed names (filled
    in as imports happen)."""
    root = tempfile.mkdtemp(prefix="sglang-wheel-")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(root, [n for n in archive.namelist() if n.startswith("sglang/")])
    sys.path.insert(0, root)
    finder = _StubFinder()
    sys.meta_path.append(finder)
    return finder.stubbed

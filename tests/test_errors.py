"""The exception tree that server/errors.py draws is the real one: every
class drawn exists where the drawing says and subclasses what it is drawn
under, and every public exception class of the project is drawn."""

from __future__ import annotations

import builtins
import importlib
import pkgutil
import re
from dataclasses import dataclass

import pytest

import protocol
import reducers
import server
import server.errors

_NAME = re.compile(r"[A-Z]\w*")
_MODULE = re.compile(r"(?:server|protocol)(?:\.\w+)+")


@dataclass(frozen=True)
class Drawn:
    name: str
    module: str
    parent: Drawn | None

    @property
    def cls(self) -> type[BaseException]:
        found = getattr(importlib.import_module(self.module), self.name)
        assert isinstance(found, type)
        assert issubclass(found, BaseException)
        return found


def drawn_tree() -> list[Drawn]:
    """The classes of the docstring's drawings (``::`` blocks), each with the
    module named on its line, else its parent's (builtins for a root)."""
    doc = server.errors.__doc__ or ""
    drawn: list[Drawn] = []
    in_block = False
    path: list[Drawn] = []
    for line in doc.splitlines():
        if line.endswith("::"):
            in_block, path = True, []
            continue
        if in_block and line and not line.startswith("    "):
            in_block = False
        if not in_block or not line.strip():
            continue
        name = _NAME.search(line)
        prefix = line[4 : name.start()] if name else "-"
        if name is None or (prefix and not prefix.endswith("── ")):
            continue  # a line that only continues the one above
        depth = len(prefix) // 4
        rest = line[name.end() :].split()
        module = _MODULE.fullmatch(rest[0].rstrip(":")) if rest else None
        parent = path[depth - 1] if depth else None
        inherited = parent.module if parent else "builtins"
        entry = Drawn(name.group(), module.group() if module else inherited, parent)
        path[depth:] = [entry]
        drawn.append(entry)
    return drawn


def project_exceptions() -> set[type[BaseException]]:
    """Every public exception class defined in protocol/, reducers/, server/."""
    found: set[type[BaseException]] = set()
    for package in (protocol, reducers, server):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for value in vars(module).values():
                if (
                    isinstance(value, type)
                    and issubclass(value, BaseException)
                    and value.__module__ == info.name
                    and not value.__name__.startswith("_")
                ):
                    found.add(value)
    return found


DRAWN = drawn_tree()


def test_the_drawing_has_both_trees() -> None:
    roots = [d.name for d in DRAWN if d.parent is None]
    assert roots == ["HuddleError", "InternalError", "MalformedFrame", "ValueError"]


@pytest.mark.parametrize("entry", DRAWN, ids=lambda d: d.name)
def test_a_drawn_class_lives_where_drawn_under_its_drawn_parent(entry: Drawn) -> None:
    if entry.module == "builtins":
        assert getattr(builtins, entry.name) is entry.cls
    if entry.parent is not None:
        assert entry.parent.cls in entry.cls.__bases__


def test_every_public_exception_of_the_project_is_drawn() -> None:
    drawn = {entry.cls for entry in DRAWN}
    missing = sorted(f"{c.__module__}.{c.__name__}" for c in project_exceptions() - drawn)
    assert missing == []


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("server.runner.agent", "FormRequired"),
        ("server.runner.agent", "TransientError"),
        ("server.runner.agent", "FormDefinition"),
        ("server.runner.runner", "ResumeRejected"),
        ("server.runner.runner", "TurnBusy"),
        ("server.runner.turn_store", "TurnNotFound"),
        ("server.runner.turn_store", "VersionConflict"),
        ("server.runner.turn_store", "Fenced"),
        ("server.runner.openai", "ModelUnavailable"),
        ("server.runner.openai", "ModelError"),
        ("server.runner.openai", "ModelRequestRejected"),
        ("server.runner.openai", "ModelReplyInvalid"),
        ("server.runner.openai", "ModelNotConfigured"),
        ("server.client", "ProtocolError"),
        ("server.client", "Disconnected"),
        ("server.mcp", "McpToolFailed"),
    ],
)
def test_a_class_is_still_importable_where_users_import_it(path: str, name: str) -> None:
    assert hasattr(importlib.import_module(path), name)

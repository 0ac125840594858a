"""The core knows no domain: the demo shop is an agent built on the public API.

Nothing in the core (`durable_agent/`, `workflows/`, `activities/`, `frontends/`)
imports the shop, and none of its strings (docstrings and comments aside) says a
word of the shop's: its orders, return ids, soap or sample ids. The worker names the
shop as its default agent in one string; `client.py`'s demo gets it from there.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ("durable_agent", "workflows", "activities", "frontends")
SHOP = re.compile(r"(durable_agent\.)?shop\b")
SHOP_WORDS = re.compile(
    # SQL's `ORDER BY` is no order of the shop's.
    r"\b(?:orders?(?!\s+by\b)|return ids?|rtn\d*|shop|soap|handsoap|123456|customer-support)\b",
    re.I,
)


COMMANDS = ROOT / "durable_agent" / "commands"
"""The commands (`client.py`, `worker.py`) run the demo by name; the core does not."""


def core_files() -> Iterator[Path]:
    for folder in CORE:
        yield from (p for p in sorted((ROOT / folder).rglob("*.py")) if COMMANDS not in p.parents)


def imported(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_nothing_in_the_core_imports_the_shop() -> None:
    for path in [*core_files(), *COMMANDS.glob("*.py")]:
        shop = {m for m in imported(ast.parse(path.read_text())) if SHOP.match(m)}
        assert not shop, f"{path.relative_to(ROOT)} imports {shop}"


def test_the_worker_names_the_shop_only_as_its_default_agent() -> None:
    source = (ROOT / "durable_agent" / "commands" / "worker.py").read_text()
    assert re.findall(r"[\w.]*\bshop[.:][\w.:]*", source) == ["durable_agent.shop.agent:agent"]


def test_no_string_of_the_core_speaks_of_the_shop() -> None:
    found = []
    for path in core_files():
        tree = ast.parse(path.read_text())
        docs = {
            id(n.value)
            for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
        }
        for node in ast.walk(tree):
            is_text = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if is_text and id(node) not in docs and SHOP_WORDS.search(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
    assert found == []


def test_the_web_page_takes_its_words_from_the_agent() -> None:
    static = ROOT / "frontends" / "web" / "static"
    for page in ("index.html", "app.js"):
        text = (static / page).read_text()
        assert not SHOP_WORDS.search(text), (page, SHOP_WORDS.search(text))

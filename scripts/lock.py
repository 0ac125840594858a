"""The tested set of dependencies: `constraints.txt` (PyPI) and `tests/npm/package-lock.json`
(the npm MCP servers the tests run).

    python scripts/lock.py check      # is what this environment holds exactly the lock? (.ci/run)
    python scripts/lock.py compile    # the lock again from pyproject.toml, keeping every pin
                                      # it can (after adding or changing a dependency)
    python scripts/lock.py upgrade    # the newest releases of everything, then the whole
                                      # suite on them in a fresh clone (docs/upgrading.md)

`pyproject.toml` keeps ranges, so `pip install durable-agent` still resolves; the lock is
the one set the suite passed with, and `.ci/run` installs nothing else. Newer releases are
taken on purpose, by `upgrade`, never by accident in a landing.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints.txt"
NPM = ROOT / "tests" / "npm"
NPM_FILES = ("package.json", "package-lock.json")
# npm packages an upgrade leaves where they are: the MCP conformance suite's releases after
# 0.1.13 need Node 22, and these machines have 20 (docs/mcp.md, Conformance).
HELD_NPM = {"@modelcontextprotocol/conformance": "0.1.13"}
# The project itself and the installer are not pinned: the lock is what they install.
NOT_LOCKED = frozenset({"durable-agent", "pip"})
# The oldest Python the lock is made for; it holds for newer ones too (universal markers).
PYTHON = "3.11"
COMPILE_COMMAND = "python scripts/lock.py compile"


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares names (`PyYAML` and `pyyaml` are one)."""
    return "-".join(name.replace("_", "-").replace(".", "-").lower().split("-"))


def pins(text: str, environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """The lock's `name==version` lines whose markers hold in `environment` (this
    interpreter's by default), by canonical name."""
    from packaging.requirements import Requirement

    pinned: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(
            dict(environment) if environment else None
        ):
            continue
        (spec,) = requirement.specifier
        if spec.operator != "==":
            raise ValueError(f"{LOCK.name}: {line!r} is not pinned with ==")
        pinned[canonical(requirement.name)] = spec.version
    return pinned


def differences(installed: Mapping[str, str], locked: Mapping[str, str]) -> list[str]:
    """One line for each installed distribution the lock does not name, or names at
    another version. Lock entries that are not installed (other extras) are fine."""
    lines = []
    for name, version in sorted(installed.items()):
        if name in NOT_LOCKED:
            continue
        if name not in locked:
            lines.append(f"{name}=={version} is installed but not in {LOCK.name}")
        elif locked[name] != version:
            lines.append(f"{name}=={version} is installed; {LOCK.name} pins {locked[name]}")
    return lines


def installed() -> dict[str, str]:
    from importlib.metadata import distributions

    return {canonical(d.metadata["Name"]): d.version for d in distributions()}


def check() -> int:
    found = differences(installed(), pins(LOCK.read_text()))
    for line in found:
        print(line, file=sys.stderr)
    if found:
        print(
            f"this environment is not the tested set: install with "
            f'pip install -c {LOCK.name} -e ".[dev]", or refresh the lock '
            f"(python scripts/lock.py compile) after changing pyproject.toml",
            file=sys.stderr,
        )
        return 1
    print(f"{len(installed())} installed distributions, all as {LOCK.name} pins them")
    return 0


def _uv() -> str:
    """The `uv` that compiles the lock: on PATH, or installed once into build/lock-tools."""
    found = shutil.which("uv")
    if found:
        return found
    tools = ROOT / "build" / "lock-tools"
    uv = tools / "bin" / "uv"
    if not uv.exists():
        print(f"installing uv into {tools.relative_to(ROOT)}/ to compile the lock")
        subprocess.run([sys.executable, "-m", "venv", str(tools)], check=True)
        subprocess.run(
            [str(tools / "bin" / "python"), "-m", "pip", "install", "-q", "uv"], check=True
        )
    return str(uv)


def compile_lock(upgrade: bool) -> None:
    """`constraints.txt` from every extra of pyproject.toml, for every platform and each
    Python from 3.11 (universal markers)."""
    command = [
        _uv(), "pip", "compile", "pyproject.toml", "--all-extras", "--universal",
        "--python-version", PYTHON, "--output-file", LOCK.name, "--quiet",
        "--custom-compile-command", COMPILE_COMMAND,
    ]  # fmt: skip
    if upgrade:
        command.append("--upgrade")
    subprocess.run(command, cwd=ROOT, check=True)


def upgrade_npm() -> None:
    """The npm servers at their newest releases (but those held), pinned exactly, and a
    new lock."""
    import json

    manifest = json.loads((NPM / "package.json").read_text())
    newest = [f"{name}@{HELD_NPM.get(name, 'latest')}" for name in manifest["dependencies"]]
    (NPM / "package-lock.json").unlink(missing_ok=True)
    subprocess.run(
        ["npm", "install", "--package-lock-only", "--save-exact", "--no-audit", "--no-fund",
         "--prefix", str(NPM), *newest],
        check=True,
    )  # fmt: skip


def _changes(before: Mapping[str, str], after: Mapping[str, str]) -> Iterable[str]:
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old != new:
            yield f"  {name}: {old or '(new)'} -> {new or '(gone)'}"


def run_suite() -> int:
    """`.ci/run` in a fresh clone of HEAD with the working tree's lock files: the suite on
    exactly what the lock names, nothing from this checkout's own environment."""
    with tempfile.TemporaryDirectory(prefix="lock-upgrade-") as folder:
        clone = Path(folder) / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        shutil.copy2(LOCK, clone / LOCK.name)
        for name in NPM_FILES:
            shutil.copy2(NPM / name, clone / "tests" / "npm" / name)
        print(f"running .ci/run in {clone} (HEAD with the new lock; this takes a while)")
        return subprocess.run(
            ["bash", ".ci/run"], cwd=clone, env={**os.environ, "CI": "true"},
            stdin=subprocess.DEVNULL,
        ).returncode  # fmt: skip


def upgrade(test: bool) -> int:
    before = pins(LOCK.read_text(), _environment())
    npm_before = (NPM / "package-lock.json").read_text()
    compile_lock(upgrade=True)
    upgrade_npm()
    changed = list(_changes(before, pins(LOCK.read_text(), _environment())))
    npm_changed = (NPM / "package-lock.json").read_text() != npm_before
    print("\n".join(changed) if changed else f"{LOCK.name}: nothing newer")
    if npm_changed:
        diff = difflib.unified_diff(
            npm_before.splitlines(), (NPM / "package-lock.json").read_text().splitlines(), n=0
        )
        moved = [line for line in diff if line.startswith(("+", "-")) and '"version"' in line]
        print(f"tests/npm/package-lock.json: {len(moved) // 2} version(s) moved")
    if not (changed or npm_changed):
        return 0
    if not test:
        print("not tested (--no-test): run the suite before committing the new lock")
        return 0
    code = run_suite()
    if code == 0:
        print(f"the suite passed on the newest releases: commit {LOCK.name} and tests/npm/")
    else:
        print(
            "the suite failed on the newest releases: the new lock is left in the working "
            "tree to fix the code against it (git checkout constraints.txt tests/npm "
            "restores the tested set)",
            file=sys.stderr,
        )
    return code


def _environment() -> dict[str, str]:
    """Markers as for the lock's Python on this platform, whatever runs this script."""
    from packaging.markers import default_environment

    environment = dict(default_environment())
    environment.update(python_version=PYTHON, python_full_version=f"{PYTHON}.0")
    return environment


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python scripts/lock.py", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="compare this environment with the lock")
    commands.add_parser("compile", help="the lock again from pyproject.toml, keeping pins")
    up = commands.add_parser("upgrade", help="the newest releases, then the suite on them")
    up.add_argument("--no-test", action="store_true", help="only write the new lock")
    args = parser.parse_args(argv)
    if args.command == "check":
        return check()
    if args.command == "compile":
        compile_lock(upgrade=False)
        return 0
    return upgrade(test=not args.no_test)


if __name__ == "__main__":
    sys.exit(main())

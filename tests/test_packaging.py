"""What installing the project adds: one import name, `durable_agent`, and its two
commands. A team's own `workflows.py`, `client.py` or `shop.py` can then never meet a
module of ours (tests/test_from_your_application.py runs beside such files)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

READ = """\
import importlib.metadata as m, json
d = m.distribution("durable-agent")
scripts = sorted(e.name for e in d.entry_points if e.group == "console_scripts")
top_level = (d.read_text("top_level.txt") or "").split()
print(json.dumps({"top_level": top_level, "files": [str(f) for f in d.files], "scripts": scripts}))
"""


def test_the_wheel_installs_one_import_name_and_two_commands(tmp_path: Path) -> None:
    # Built and installed with what is here: nothing is downloaded.
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("durable_agent-*.whl")
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True
    )
    python = tmp_path / "venv" / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    read = subprocess.run(  # away from the clone, whose build metadata it would read
        [str(python), "-c", READ], cwd=tmp_path, check=True, capture_output=True, text=True
    )
    installed = json.loads(read.stdout)
    assert installed["top_level"] == ["durable_agent"]
    tops = {Path(f).parts[0] for f in installed["files"]}
    assert tops - {"..", "__pycache__"} == {
        "durable_agent",
        wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info",
    }
    assert installed["scripts"] == ["durable-agent", "durable-agent-worker"]
    # The folders at the repository's root are inside it, with their data.
    files = set(installed["files"])
    for inside in (
        "workflows/turn.py",
        "activities/plan.py",
        "shop/policies",
        "frontends/web/static/index.html",
        "commands/worker.py",
    ):
        assert any(f.startswith(f"durable_agent/{inside}") for f in files), inside

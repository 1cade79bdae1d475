"""Settings that would make a deployment silently insecure are refused at start."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from detlab.core.settings import Settings


def test_lists_come_comma_separated_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETLAB_ALLOWED_HOSTS", "localhost, Detlab.Example.com,[::1]")
    monkeypatch.setenv("DETLAB_TRUSTED_PROXIES", "10.0.0.5,172.18.0.0/16")
    settings = Settings()
    assert settings.allowed_hosts == ["localhost", "detlab.example.com", "::1"]
    assert settings.trusted_proxies == ["10.0.0.5", "172.18.0.0/16"]


def test_defaults_trust_and_serve_loopback_only() -> None:
    settings = Settings()
    assert settings.auth_mode == "none"
    assert settings.trusted_proxies == ["127.0.0.1", "::1"]
    assert settings.allowed_hosts == ["localhost", "127.0.0.1", "::1"]


@pytest.mark.parametrize("value", ["0.0.0.0/0", "::/0", "10.0.0.1,0.0.0.0/0"])
def test_trusting_every_address_is_refused(value: str) -> None:
    with pytest.raises(ValidationError, match="trusts every address"):
        Settings(trusted_proxies=value)


def test_a_proxy_that_is_not_an_address_is_refused() -> None:
    with pytest.raises(ValidationError, match="not an IP address or network"):
        Settings(trusted_proxies="proxy.example.com")


def test_any_host_is_refused() -> None:
    with pytest.raises(ValidationError, match="DNS rebinding"):
        Settings(allowed_hosts="*")


def test_the_generated_ingest_token_is_kept_for_the_servers_account_only(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    # docs/sdk.md: `<data dir>/ingest-token`, mode 0600; made once, the same on every read
    monkeypatch.delenv("DETLAB_INGEST_TOKEN", raising=False)
    token = Settings(data_dir=tmp_path).resolved_ingest_token()
    path = tmp_path / "ingest-token"
    assert path.stat().st_mode & 0o777 == 0o600
    assert Settings(data_dir=tmp_path).resolved_ingest_token() == token == path.read_text().strip()

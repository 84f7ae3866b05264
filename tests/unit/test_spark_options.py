"""The Spark bridge's TLS options become SDK security settings."""

from __future__ import annotations

import pytest

from gridstream.config import SecurityConfig
from spark_bridge.sink import BridgeError, security_from


def test_plaintext_without_tls_options() -> None:
    assert security_from({}) is None


def test_tls_options_map_to_security_settings() -> None:
    assert security_from({"tls_ca": "/ca.pem", "tls_cert": "/c.pem", "tls_key": "/k.pem",
                          "token": "t"}) == SecurityConfig(
        tls=True, ca_file="/ca.pem", cert_file="/c.pem", key_file="/k.pem", token="t")


def test_a_token_without_tls_is_refused() -> None:
    with pytest.raises(BridgeError, match="need \"tls_ca\""):
        security_from({"token": "secret"})

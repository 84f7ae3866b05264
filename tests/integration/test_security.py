"""A cluster with mutual TLS and bearer tokens: both examples run; a client
without a certificate, with a certificate from another CA, without a token or
with a token lacking the right is refused, and nothing changes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio

from gridstream.certs import create_ca, create_dev_certs, issue
from gridstream.client import Client
from gridstream.config import ClusterConfig, Config, SecurityConfig
from gridstream.demo import run_on
from gridstream.errors import PermissionDenied, Unauthenticated, Unavailable
from gridstream.examples import wordcount
from gridstream.local import LocalCluster

pytestmark = pytest.mark.integration

MEMBER_TOKEN = "member-token-for-tests"
USER_TOKEN = "user-token-for-tests"
READER_TOKEN = "reader-token-for-tests"


@pytest_asyncio.fixture(scope="module")
async def secure(tmp_path_factory: pytest.TempPathFactory
                 ) -> AsyncIterator[tuple[LocalCluster, Path]]:
    certs = tmp_path_factory.mktemp("certs")
    issued = create_dev_certs(certs, ["localhost", "127.0.0.1"])
    tokens = certs / "tokens.toml"
    tokens.write_text(f'[tokens]\n"{MEMBER_TOKEN}" = ["admin"]\n'
                      f'"{USER_TOKEN}" = ["submit", "send", "read"]\n'
                      f'"{READER_TOKEN}" = ["read"]\n')
    security = SecurityConfig(tls=True, ca_file=str(issued["ca"].cert),
                              cert_file=str(issued["node"].cert),
                              key_file=str(issued["node"].key), tokens_file=str(tokens),
                              token=MEMBER_TOKEN)
    config = replace(Config(), cluster=ClusterConfig(window_size=2_000, partitions=6),
                     security=security)
    async with LocalCluster(tmp_path_factory.mktemp("secure"), config) as cluster:
        yield cluster, certs


def client_security(certs: Path, token: str = USER_TOKEN, cert: str = "client",
                    ca: Path | None = None) -> SecurityConfig:
    return SecurityConfig(tls=True, ca_file=str(ca or certs / "ca.pem"),
                          cert_file=str(certs / f"{cert}.pem"),
                          key_file=str(certs / f"{cert}-key.pem"), token=token)


async def test_both_examples_run_with_mutual_tls_and_tokens(
        secure: tuple[LocalCluster, Path]) -> None:
    cluster, certs = secure
    for name, size in (("taxi", 20_000), ("wordcount", 30_000)):
        report = await run_on(cluster.scheduler_address, name, size,
                              security=client_security(certs))
        assert report.match, report.summary()


async def test_a_client_without_a_certificate_is_refused(
        secure: tuple[LocalCluster, Path]) -> None:
    cluster, certs = secure
    no_cert = SecurityConfig(tls=True, ca_file=str(certs / "ca.pem"), token=USER_TOKEN)
    async with Client(cluster.scheduler_address, security=no_cert) as client:
        with pytest.raises(Unavailable):
            await client.jobs()


async def test_a_client_with_a_certificate_from_another_ca_is_refused(
        secure: tuple[LocalCluster, Path], tmp_path: Path) -> None:
    cluster, certs = secure
    other = create_ca(tmp_path / "other", "some other CA")
    issue(other, tmp_path / "other", "intruder", ["intruder"])
    intruder = SecurityConfig(tls=True, ca_file=str(certs / "ca.pem"),
                              cert_file=str(tmp_path / "other" / "intruder.pem"),
                              key_file=str(tmp_path / "other" / "intruder-key.pem"),
                              token=USER_TOKEN)
    async with Client(cluster.scheduler_address, security=intruder) as client:
        with pytest.raises(Unavailable):
            await client.jobs()


async def test_a_plaintext_client_is_refused(secure: tuple[LocalCluster, Path]) -> None:
    cluster, _ = secure
    async with Client(cluster.scheduler_address, security=SecurityConfig()) as client:
        with pytest.raises(Unavailable):
            await client.jobs()


async def test_tokens_are_checked_and_refusals_change_nothing(
        secure: tuple[LocalCluster, Path]) -> None:
    cluster, certs = secure
    async with Client(cluster.scheduler_address,
                      security=client_security(certs, token="")) as anonymous:
        with pytest.raises(Unauthenticated, match="missing or unknown bearer token"):
            await anonymous.jobs()
    async with Client(cluster.scheduler_address,
                      security=client_security(certs, token="forged")) as forged:
        with pytest.raises(Unauthenticated):
            await forged.submit(wordcount.job())
    async with Client(cluster.scheduler_address,
                      security=client_security(certs, token=READER_TOKEN)) as reader:
        before = [j.job_id for j in await reader.jobs()]
        with pytest.raises(PermissionDenied, match="lacks the 'submit' right"):
            await reader.submit(wordcount.job())
        assert [j.job_id for j in await reader.jobs()] == before
        # A read-only token may read results but not send records.
        async with Client(cluster.scheduler_address,
                          security=client_security(certs)) as user:
            job_id = await user.submit(wordcount.job())
            await user.send(job_id, ["a b"])
            await user.drain(job_id)
            with pytest.raises(PermissionDenied, match="lacks the 'send' right"):
                await reader.send(job_id, ["c"])
            assert await reader.results(job_id) == {"a": 1, "b": 1}

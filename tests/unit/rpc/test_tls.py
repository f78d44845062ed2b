"""TLS and mutual TLS on a real server (RunService, the lightest to start) with certificates made by
the openssl command line for this test."""

from __future__ import annotations

import os
import shutil
import subprocess

import grpc
import pytest

from rlcore.client import ClientOptions, RpcError, RunClient
from rlcore.core.rpc.security import TLSFiles
from rlcore.core.rpc.server import RpcServer, ServerOptions
from rlcore.runtime.run_service import start_run_server

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

TOKEN = "tls-test-token"


def _openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CA, a server certificate for 'localhost' and a client certificate, all signed by the CA."""
    d = str(tmp_path_factory.mktemp("pki"))
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "2", "-subj", "/CN=rlcore-test-ca", cwd=d)  # fmt: skip
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext", cwd=d)  # fmt: skip
    return d


def _server(pki: str, mutual: bool) -> RpcServer:
    tls = TLSFiles(
        cert_file=os.path.join(pki, "server.pem"),
        key_file=os.path.join(pki, "server.key"),
        ca_file=os.path.join(pki, "ca.pem"),
        require_client_cert=mutual,
    )
    server, _ = start_run_server("it/tls", ServerOptions(token=TOKEN, tls=tls), heartbeat_interval_s=1.0)
    return server


def _client(address: str, tls: TLSFiles | None) -> RunClient:
    return RunClient(address, ClientOptions(token=TOKEN, timeout=5, retry_attempts=1, tls=tls))


def test_tls_server_answers_clients_that_trust_its_ca_only(pki: str) -> None:
    server = _server(pki, mutual=False)
    try:
        with _client(f"localhost:{server.port}", TLSFiles(ca_file=os.path.join(pki, "ca.pem"))) as c:
            assert c.get_status().run == "it/tls"
        with _client(f"localhost:{server.port}", None) as c, pytest.raises(RpcError) as plain:
            c.get_status()  # plaintext against a TLS port
        assert plain.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(grace=0)


def test_mutual_tls_refuses_clients_without_a_certificate(pki: str) -> None:
    server = _server(pki, mutual=True)
    ca = os.path.join(pki, "ca.pem")
    try:
        with_cert = TLSFiles(os.path.join(pki, "client.pem"), os.path.join(pki, "client.key"), ca, True)
        with _client(f"localhost:{server.port}", with_cert) as c:
            assert c.get_status().state in ("STARTING", "RUNNING")
        with (
            _client(f"localhost:{server.port}", TLSFiles(ca_file=ca)) as c,
            pytest.raises(RpcError) as refused,
        ):
            c.get_status()
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE  # the handshake fails
    finally:
        server.stop(grace=0)

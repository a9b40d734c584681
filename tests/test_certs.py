"""The development PKI for Flower TLS deployments (fedbandit.flower.certs); no Flower processes."""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import shutil
import socket
import ssl
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from cryptography.x509.verification import PolicyBuilder, Store

from fedbandit.errors import ConfigError, DeploymentError
from fedbandit.flower import certs
from fedbandit.flower.certs import DevPki, make_dev_pki, make_node_key

HOSTS = ["127.0.0.1", "localhost", "10.77.0.1", "MyHost.Example", "::1"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return make_dev_pki(tmp_path_factory.mktemp("pki"), HOSTS, nodes=["node0", "node1"], days=7)


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_files_and_modes(pki: DevPki) -> None:
    out = pki.out_dir
    assert pki.ca_cert == out / "ca.crt" and pki.ca_key == out / "ca.key"
    assert pki.server_cert == out / "server.pem" and pki.server_key == out / "server.key"
    assert [n.name for n in pki.nodes] == ["node0", "node1"]
    assert pki.nodes[0].private_key == out / "nodes" / "node0"
    assert pki.nodes[0].public_key == out / "nodes" / "node0.pub"
    for private in [pki.ca_key, pki.server_key, *(n.private_key for n in pki.nodes)]:
        assert _mode(private) == 0o600, private
    for public in [pki.ca_cert, pki.server_cert, *(n.public_key for n in pki.nodes)]:
        assert _mode(public) & 0o711 == 0o600, public  # owner rw, not executable
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_server_certificate_verifies_against_ca(pki: DevPki) -> None:
    ca, server = _cert(pki.ca_cert), _cert(pki.server_cert)
    server.verify_directly_issued_by(ca)
    verifier_time = dt.datetime.now(dt.UTC)
    store = Store([ca])
    for host in ["127.0.0.1", "10.77.0.1", "::1"]:
        subject = x509.verification.IPAddress(ipaddress.ip_address(host))
        verifier = PolicyBuilder().store(store).time(verifier_time).build_server_verifier(subject)
        chain = verifier.verify(server, [])
        assert chain[-1] == ca
    for host in ["localhost", "myhost.example"]:
        subject = x509.verification.DNSName(host)
        verifier = PolicyBuilder().store(store).time(verifier_time).build_server_verifier(subject)
        verifier.verify(server, [])
    wrong = PolicyBuilder().store(store).time(verifier_time)
    with pytest.raises(x509.verification.VerificationError):
        wrong.build_server_verifier(x509.verification.DNSName("other.example")).verify(server, [])


def test_san_and_extensions(pki: DevPki) -> None:
    server = _cert(pki.server_cert)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in san.get_values_for_type(x509.IPAddress)} == {
        "127.0.0.1",
        "10.77.0.1",
        "::1",
    }
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", "myhost.example"}
    assert pki.hosts == ("127.0.0.1", "localhost", "10.77.0.1", "myhost.example", "::1")

    basic = server.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and not basic.value.ca
    usage = server.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and usage.key_encipherment and not usage.key_cert_sign
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]

    ca = _cert(pki.ca_cert)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert ca.subject == ca.issuer == server.issuer


def test_validity_days(pki: DevPki) -> None:
    now = dt.datetime.now(dt.UTC)
    for cert in (_cert(pki.ca_cert), _cert(pki.server_cert)):
        assert cert.not_valid_before_utc <= now
        remaining = cert.not_valid_after_utc - now
        assert dt.timedelta(days=7) - dt.timedelta(minutes=1) < remaining <= dt.timedelta(days=7)


def test_key_types(pki: DevPki) -> None:
    server_key = serialization.load_pem_private_key(pki.server_key.read_bytes(), None)
    assert isinstance(server_key, ec.EllipticCurvePrivateKey)
    assert server_key.public_key() == _cert(pki.server_cert).public_key()
    ca_key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), None)
    assert ca_key.public_key() == _cert(pki.ca_cert).public_key()
    for node in pki.nodes:
        private = serialization.load_ssh_private_key(node.private_key.read_bytes(), None)
        public = serialization.load_ssh_public_key(node.public_key.read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert isinstance(private.curve, ec.SECP384R1)
        assert private.public_key() == public
    a, b = (serialization.load_ssh_public_key(n.public_key.read_bytes()) for n in pki.nodes)
    assert a != b


def test_public_key_line(pki: DevPki) -> None:
    for node in pki.nodes:
        text = node.public_key.read_text()
        assert text.endswith("\n") and text.count("\n") == 1
        kind, blob, comment = text.split()
        assert kind == "ecdsa-sha2-nistp384" and blob.startswith("AAAA") and comment == node.name
        assert node.private_key.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")


def test_flower_accepts_node_public_key(pki: DevPki) -> None:
    register = pytest.importorskip("flwr.cli.supernode.register")
    assert register.try_load_public_key(pki.nodes[0].public_key)


def test_tls_handshake(pki: DevPki) -> None:
    """A real TLS handshake over loopback: the client trusts only ca.crt and checks the name."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(pki.server_cert, pki.server_key)
    client_ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    for name in ["localhost", "127.0.0.1"]:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            port = listener.getsockname()[1]

            def serve(sock: socket.socket = listener) -> None:
                conn, _ = sock.accept()
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")

            thread = threading.Thread(target=serve, daemon=True)
            thread.start()
            with (
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
                client_ctx.wrap_socket(raw, server_hostname=name) as tls,
            ):
                assert tls.recv(2) == b"ok"
            thread.join(timeout=10)


def test_refuses_to_overwrite(tmp_path: Path) -> None:
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "node0.pub").write_text("keep")
    with pytest.raises(DeploymentError, match=r"node0\.pub"):
        make_dev_pki(tmp_path, ["localhost"], nodes=["node0"])
    assert not (tmp_path / "ca.crt").exists()  # nothing written
    assert (tmp_path / "nodes" / "node0.pub").read_text() == "keep"

    pki = make_dev_pki(tmp_path, ["localhost"], nodes=["node0"], overwrite=True)
    first = pki.ca_cert.read_bytes()
    with pytest.raises(DeploymentError, match=r"ca\.crt"):
        make_dev_pki(tmp_path, ["localhost"])
    assert pki.ca_cert.read_bytes() == first
    make_dev_pki(tmp_path, ["localhost"], overwrite=True)
    assert pki.ca_cert.read_bytes() != first
    assert _mode(pki.ca_key) == 0o600


@pytest.mark.parametrize(
    "host",
    ["bad_host", "-lead.example", "trail-.example", "a..b", "", "exa mple", "256.1.1.1", "ü.de"],
)
def test_bad_host(tmp_path: Path, host: str) -> None:
    with pytest.raises(ConfigError, match="host") as err:
        make_dev_pki(tmp_path, ["localhost", host])
    assert repr(host) in str(err.value)
    assert not list(tmp_path.iterdir())


def test_host_forms() -> None:
    assert certs.parse_host("[::1]") == x509.IPAddress(ipaddress.ip_address("::1"))
    assert certs.parse_host("10.77.0.1") == x509.IPAddress(ipaddress.ip_address("10.77.0.1"))
    assert certs.parse_host("Node-1.Lan") == x509.DNSName("node-1.lan")


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "x.pub", "a b", "n" * 65])
def test_bad_node_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="node name") as err:
        make_dev_pki(tmp_path, ["localhost"], nodes=[name])
    assert repr(name) in str(err.value)
    assert not list(tmp_path.iterdir())


def test_other_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="duplicate node names: a"):
        make_dev_pki(tmp_path, ["localhost"], nodes=["a", "b", "a"])
    with pytest.raises(ConfigError, match="days"):
        make_dev_pki(tmp_path, ["localhost"], days=0)
    with pytest.raises(ConfigError, match="at least one host"):
        make_dev_pki(tmp_path, [])
    with pytest.raises(TypeError):
        make_dev_pki(tmp_path, "localhost")


def test_make_node_key_later(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    old = os.umask(0o277)  # even a strict umask gives exactly 0600
    try:
        node = make_node_key(tmp_path / "keys" / "node7", "node7")
    finally:
        os.umask(old)
    assert node.public_key == tmp_path / "keys" / "node7.pub"
    assert _mode(node.private_key) == 0o600
    assert node.public_key.read_text().split()[2] == "node7"
    with pytest.raises(DeploymentError, match="node7"):
        make_node_key(tmp_path / "keys" / "node7", "node7")
    again = make_node_key(tmp_path / "keys" / "node7", "node7", overwrite=True)
    assert again == node


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="ssh-keygen not installed")
def test_ssh_keygen_reads_keys(pki: DevPki) -> None:
    node = pki.nodes[0]
    out = subprocess.run(
        ["ssh-keygen", "-l", "-f", str(node.public_key)], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("384 SHA256:") and "(ECDSA)" in out and "node0" in out
    derived = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(node.private_key)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert derived.split()[:2] == node.public_key.read_text().split()[:2]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_openssl_verifies(pki: DevPki) -> None:
    base = ["openssl", "verify", "-CAfile", str(pki.ca_cert), "-purpose", "sslserver"]
    ok = subprocess.run(
        [*base, "-verify_ip", "10.77.0.1", str(pki.server_cert)], capture_output=True, text=True
    )
    assert ok.returncode == 0 and ok.stdout.strip().endswith("OK"), ok.stdout + ok.stderr
    bad = subprocess.run(
        [*base, "-verify_hostname", "other.example", str(pki.server_cert)],
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fedbandit")
    certs.add_cli(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "keys"
    argv = ["keys", str(out_dir), "--host", "127.0.0.1", "--host", "myhost.example"]
    argv += ["--node", "node0", "--node", "node1", "--days", "3"]
    assert _cli(argv) == 0
    printed = capsys.readouterr().out
    for path in ["ca.crt", "ca.key", "server.pem", "server.key", "nodes/node0", "nodes/node1.pub"]:
        assert str(out_dir / path) in printed
    assert (
        f"fedbandit superlink --host 0.0.0.0 --port 9092 --tls-dir {out_dir.resolve()}" in printed
    )
    assert f"register-node {(out_dir / 'nodes' / 'node0.pub').resolve()}" in printed
    assert "fedbandit supernode --superlink 127.0.0.1:9092 --clients" in printed
    assert f"--auth-key {(out_dir / 'nodes' / 'node1').resolve()}" in printed
    assert "site's CA" in printed
    san = _cert(out_dir / "server.pem").extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert san.value.get_values_for_type(x509.DNSName) == ["myhost.example"]

    assert _cli(argv) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and str(out_dir / "ca.crt") in err
    assert _cli([*argv, "--overwrite"]) == 0
    assert _cli(["keys", str(tmp_path / "x"), "--host", "no_such"]) == 2
    assert "'no_such'" in capsys.readouterr().err


def test_cli_default_hosts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["keys", str(tmp_path)]) == 0
    assert "127.0.0.1, localhost" in capsys.readouterr().out


def _commands(text: str) -> list[list[str]]:
    """The ``fedbandit ...`` commands of a shell text (continuation lines joined), as argv."""
    import shlex

    joined = text.replace("\\\n", " ")
    return [
        shlex.split(line)[1:]
        for line in joined.splitlines()
        if line.strip().startswith("fedbandit ")
    ]


def test_printed_recipe_is_the_readmes_and_parses(tmp_path: Path) -> None:
    """`fedbandit keys` prints the deployment commands of docs/deployments.md: each parses with
    fedbandit's own command line, uses the default ports, and has the same options as the docs'
    command of the same kind (paths and client ranges aside)."""
    from fedbandit.cli import build_parser

    pki = certs.make_dev_pki(tmp_path / "pki", ["server.example"], ["node0", "node1"])
    printed = _commands(certs.next_steps(pki))
    page = (Path(__file__).resolve().parents[1] / "docs" / "deployments.md").read_text()
    section = page[page.index("## Run across hosts") :]
    documented = {argv[0]: argv for argv in _commands(section[: section.index("### Keys")])}
    assert [argv[0] for argv in printed] == [
        "superlink", "register-node", "supernode", "supernode", "run",
    ]  # fmt: skip
    parser = build_parser()
    for argv in printed:
        args = parser.parse_args([a.replace("FIRST-LAST", "0-49") for a in argv])
        if argv[0] in ("supernode", "run", "register-node"):
            assert args.superlink == "server.example:9092"
        flags = {a for a in argv if a.startswith("--")}
        assert flags - {"--set"} == {a for a in documented[argv[0]] if a.startswith("--")} - {
            "--set"
        }, argv
    assert parser.parse_args(printed[0]).port == 9092
    assert [parser.parse_args(a).port for a in printed[2:4]] == [9094, 9095]

"""A development PKI for Flower deployments: a CA, a SuperLink TLS certificate, SuperNode keys.

**For development and testing only.** The CA key sits unencrypted next to the certificates and
everything expires after ``days`` (default 30); a production deployment should get its server
certificate from the site's CA and have each SuperNode operator make (and keep) their own key.

Files made by :func:`make_dev_pki` in ``OUT`` (``fedbandit keys OUT --host ... --node ...``):

- ``ca.crt``, ``ca.key``: a self-signed EC P-256 CA (``CA:TRUE``, ``keyCertSign``).
- ``server.pem``, ``server.key``: the SuperLink certificate signed by the CA (``CA:FALSE``,
  ``digitalSignature``/``keyEncipherment``, ``serverAuth``), its subjectAltName holding every
  host (``IP:`` for addresses, ``DNS:`` for names) SuperNodes and the ``flwr`` CLI use to reach
  the SuperLink.
- ``nodes/NAME``, ``nodes/NAME.pub``: a SuperNode's EC P-384 key pair in OpenSSH format, for
  SuperNode authentication (``flower-superlink --enable-supernode-auth``).

Private keys are written with mode 0600. The same files with the system tools::

    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key
    openssl req -x509 -new -key ca.key -sha256 -days 30 -subj "/CN=fedbandit development CA" \\
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \\
        -addext "keyUsage=critical,keyCertSign,cRLSign" -out ca.crt
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out server.key
    openssl req -new -key server.key -subj "/CN=fedbandit development server" -out server.csr
    printf '%s\\n' "basicConstraints=critical,CA:FALSE" \\
        "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth" \\
        "subjectAltName=IP:127.0.0.1,DNS:localhost" > server.ext
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \\
        -sha256 -extfile server.ext -out server.pem
    ssh-keygen -t ecdsa -b 384 -N "" -C node0 -f nodes/node0    # nodes/node0, nodes/node0.pub

Then ``fedbandit superlink --tls-dir OUT --node-auth``, ``fedbandit register-node
OUT/nodes/node0.pub ...`` and ``fedbandit supernode ... --auth-key OUT/nodes/node0``
(``fedbandit keys`` prints these with the actual paths; ``--print-command`` shows the plain
Flower commands they run).
"""

from __future__ import annotations

import argparse
import datetime as dt
import errno
import ipaddress
import os
import re
import secrets
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedbandit.errors import ConfigError, DeploymentError, FedbanditError
from fedbandit.flower.processes import DEFAULT_SUPERLINK_PORT, DEFAULT_SUPERNODE_PORT

CA_NAME = "fedbandit development CA"
SERVER_NAME = "fedbandit development server"
#: Validity starts a little in the past so that small clock differences do not matter.
CLOCK_SKEW = dt.timedelta(minutes=5)
MAX_DAYS = 3650

_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")

PRIVATE_MODE = 0o600
PUBLIC_MODE = 0o644


@dataclass(frozen=True)
class NodeKey:
    """A SuperNode's OpenSSH key pair (EC P-384)."""

    name: str
    private_key: Path
    public_key: Path


@dataclass(frozen=True)
class DevPki:
    """The files made by :func:`make_dev_pki`."""

    out_dir: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    hosts: tuple[str, ...]
    nodes: tuple[NodeKey, ...] = ()


def parse_host(host: str) -> x509.IPAddress | x509.DNSName:
    """The subjectAltName entry of ``host``: an IP address (``[::1]`` allowed) or a DNS name."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        pass
    name = text.lower()
    labels = name.split(".")
    if (
        not name
        or len(name) > 253
        or not all(_DNS_LABEL.fullmatch(label) for label in labels)
        or labels[-1].isdigit()
    ):
        raise ConfigError(f"host {host!r} is neither an IP address nor a valid DNS name")
    return x509.DNSName(name)


def validate_node_name(name: str) -> str:
    """Return ``name`` if it is usable as a key file name and key comment, else raise."""
    if not _NODE_NAME.fullmatch(name) or name.endswith(".pub"):
        raise ConfigError(
            f"node name {name!r} is invalid: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit and not ending in '.pub'"
        )
    return name


def _write_file(path: Path, data: bytes, mode: int, overwrite: bool) -> None:
    """Write ``data`` to ``path`` atomically (temp file + rename); the temp file is created with
    ``mode`` so a private key is never readable by others, even briefly."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            if mode == PRIVATE_MODE:
                os.fchmod(handle.fileno(), mode)  # exactly 0600 whatever the umask
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            _link_new(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _link_new(tmp: Path, path: Path) -> None:
    """Move ``tmp`` to ``path`` unless ``path`` exists (atomically where hard links work)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise _exists_error(path) from None
    except OSError as err:
        if err.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
            raise
        if path.exists():
            raise _exists_error(path) from None
        os.replace(tmp, path)


def _exists_error(path: Path) -> DeploymentError:
    return DeploymentError(
        f"{path} already exists (pass overwrite=True / --overwrite to replace it)"
    )


def _refuse_existing(paths: Sequence[Path], overwrite: bool) -> None:
    if overwrite:
        return
    for path in paths:
        if path.exists() or path.is_symlink():
            raise _exists_error(path)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _node_paths(path: Path) -> tuple[Path, Path]:
    return path, path.with_name(path.name + ".pub")


def _node_key_files(name: str) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP384R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private, public + b" " + name.encode() + b"\n"


def make_node_key(path: Path, name: str, overwrite: bool = False) -> NodeKey:
    """Make a SuperNode key pair: ``path`` (OpenSSH private key, no passphrase, mode 0600) and
    ``path.pub`` (one ``ecdsa-sha2-nistp384 AAAA... NAME`` line)."""
    validate_node_name(name)
    path = Path(path)
    private_path, public_path = _node_paths(path)
    _refuse_existing((private_path, public_path), overwrite)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    private, public = _node_key_files(name)
    _write_file(private_path, private, PRIVATE_MODE, overwrite)
    _write_file(public_path, public, PUBLIC_MODE, overwrite)
    return NodeKey(name, private_path, public_path)


def _ca_certificate(
    key: ec.EllipticCurvePrivateKey, start: dt.datetime, end: dt.datetime
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def _server_certificate(
    key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    san: list[x509.GeneralName],
    start: dt.datetime,
    end: dt.datetime,
) -> x509.Certificate:
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)]))
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=True,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )


def make_dev_pki(
    out_dir: Path,
    hosts: Sequence[str],
    nodes: Sequence[str] = (),
    days: int = 30,
    overwrite: bool = False,
) -> DevPki:
    """Make a development CA, a SuperLink certificate valid for ``hosts`` and ``days``, and an
    OpenSSH P-384 key pair per node name in ``out_dir`` (see the module docstring).

    Raises ``ConfigError`` (a ``ValueError``) for a bad host, node name or ``days``, and
    ``DeploymentError`` (naming the file) if a file exists and ``overwrite`` is false; nothing is
    written in either case.
    """
    if isinstance(hosts, str) or isinstance(nodes, str):
        raise TypeError("hosts and nodes must be sequences of strings, not a string")
    if not isinstance(days, int) or not 1 <= days <= MAX_DAYS:
        raise ConfigError(f"days must be an integer from 1 to {MAX_DAYS}, got {days!r}")
    san: list[x509.GeneralName] = []
    for host in hosts:
        entry = parse_host(host)
        if entry not in san:
            san.append(entry)
    if not san:
        raise ConfigError("at least one host (IP address or DNS name) is needed for the SAN")
    for name in nodes:
        validate_node_name(name)
    duplicates = sorted(name for name, count in Counter(nodes).items() if count > 1)
    if duplicates:
        raise ConfigError(f"duplicate node names: {', '.join(duplicates)}")

    out_dir = Path(out_dir)
    pki = DevPki(
        out_dir=out_dir,
        ca_cert=out_dir / "ca.crt",
        ca_key=out_dir / "ca.key",
        server_cert=out_dir / "server.pem",
        server_key=out_dir / "server.key",
        hosts=tuple(str(entry.value) for entry in san),
        nodes=tuple(NodeKey(name, *_node_paths(out_dir / "nodes" / name)) for name in nodes),
    )
    targets = [pki.ca_cert, pki.ca_key, pki.server_cert, pki.server_key]
    for node in pki.nodes:
        targets += [node.private_key, node.public_key]
    _refuse_existing(targets, overwrite)

    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = dt.datetime.now(dt.UTC)
    start, end = now - CLOCK_SKEW, now + dt.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_certificate(ca_key, start, end)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _server_certificate(server_key, ca_cert, ca_key, san, start, end)

    pem = serialization.Encoding.PEM
    _write_file(pki.ca_key, _pem_key(ca_key), PRIVATE_MODE, overwrite)
    _write_file(pki.ca_cert, ca_cert.public_bytes(pem), PUBLIC_MODE, overwrite)
    _write_file(pki.server_key, _pem_key(server_key), PRIVATE_MODE, overwrite)
    _write_file(pki.server_cert, server_cert.public_bytes(pem), PUBLIC_MODE, overwrite)
    for node in pki.nodes:
        make_node_key(node.private_key, node.name, overwrite=overwrite)
    return pki


def next_steps(pki: DevPki, port: int = DEFAULT_SUPERLINK_PORT) -> str:
    """The commands that start a TLS deployment with ``pki``'s files (absolute paths), in order:
    the SuperLink, the registration of the node keys, the SuperNodes, a run. They are the
    docs' "Run across hosts" commands (``fedbandit docs deployments``), with the fedbandit
    wrappers and their default ports."""
    ca, out = pki.ca_cert.resolve(), pki.out_dir.resolve()
    host = pki.hosts[0]
    superlink = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [
        f"# Ports: the SuperLink serves SuperNodes, `fedbandit run` (flwr) and its ServerApp on "
        f"TCP {port} alone;",
        "# open it on the SuperLink host. SuperNodes need no inbound port (--port is a local API).",
        "",
        "# 1. On the SuperLink host (state and node registrations in ./flower-state/superlink):",
        f"fedbandit superlink --host 0.0.0.0 --port {port} --tls-dir {out} --node-auth",
    ]
    if pki.nodes:
        keys = " ".join(str(node.public_key.resolve()) for node in pki.nodes)
        lines += [
            "",
            "# 2. Once it listens, register the node keys (kept across SuperLink restarts):",
            f"fedbandit register-node {keys} \\",
            f"    --superlink {superlink} --root-certificates {ca}",
            "",
            "# 3. On each client host (copy ca.crt and that node's private key there); the",
            "#    --clients ranges (FIRST-LAST) must cover every client of the experiment once:",
        ]
        for index, node in enumerate(pki.nodes):
            lines += [
                f"fedbandit supernode --superlink {superlink} --clients FIRST-LAST \\",
                f"    --root-certificates {ca} --auth-key {node.private_key.resolve()} "
                f"--port {DEFAULT_SUPERNODE_PORT + index}",
            ]
    else:
        lines += [
            "",
            "# No node keys made: add some with --node NAME, or start the SuperLink without",
            "# --node-auth and the SuperNodes with --root-certificates only.",
        ]
    lines += [
        "",
        "# 4. Run an experiment from any host that reaches the SuperLink (results: --out):",
        f"fedbandit run fedpe_tiny --runtime flower --superlink {superlink} \\",
        f"    --root-certificates {ca} --out results/fedpe_deployed",
        "",
        "# Development only: a production deployment should use the site's CA.",
    ]
    return "\n".join(lines)


def _cmd_keys(args: argparse.Namespace) -> int:
    hosts = args.host or ["127.0.0.1", "localhost"]
    try:
        pki = make_dev_pki(args.out_dir, hosts, args.node or (), args.days, args.overwrite)
    except FedbanditError as err:
        print(f"fedbandit keys: error: {err}", file=sys.stderr)
        return 2
    print(f"made (valid {args.days} days, server names: {', '.join(pki.hosts)}):")
    files = [pki.ca_cert, pki.ca_key, pki.server_cert, pki.server_key]
    for node in pki.nodes:
        files += [node.private_key, node.public_key]
    for path in files:
        print(f"  {path}")
    print()
    print(next_steps(pki))
    return 0


def add_cli(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``fedbandit keys OUT_DIR --host H --node N [--days D] [--overwrite]``."""
    parser = subparsers.add_parser(
        "keys",
        help="make a development CA, SuperLink certificate and SuperNode keys (not production)",
        description="Make a development PKI for a Flower TLS deployment with SuperNode "
        "authentication: ca.crt/ca.key, server.pem/server.key and nodes/NAME[.pub]. "
        "For development and testing only; production should use the site's CA.",
    )
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR", help="folder for the files")
    parser.add_argument(
        "--host",
        action="append",
        metavar="HOST",
        help="IP address or DNS name SuperNodes use to reach the SuperLink (repeatable; "
        "default: 127.0.0.1 and localhost)",
    )
    parser.add_argument(
        "--node", action="append", metavar="NAME", help="make a SuperNode key pair (repeatable)"
    )
    parser.add_argument("--days", type=int, default=30, help="validity in days (default 30)")
    parser.add_argument("--overwrite", action="store_true", help="replace existing files")
    parser.set_defaults(func=_cmd_keys)
    return parser

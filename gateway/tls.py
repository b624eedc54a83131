"""The Gateway's TLS: the PKI directory it reads, its server context for worker mTLS, and worker
identities (certificate fingerprints). Creating a PKI is the development CA's job
(:mod:`cli.dev_ca`); in production the files come from your own CA.

Layout of a PKI directory::

    ca.pem              the CA certificate (the only trust anchor for worker certificates)
    ca-key.pem          the CA private key (mode 0600)
    server.pem          the Gateway's TLS server certificate, signed by the CA
    server-key.pem      its private key (mode 0600)
    workers/NAME.pem    a worker's client certificate, signed by the CA
    workers/NAME-key.pem

A worker *is* its client certificate: the Gateway identifies it by the SHA-256 fingerprint of
the DER certificate (lowercase hex), see :func:`fingerprint_of_der` and :func:`peer_fingerprint`.

The TLS contexts built here trust **only** the PKI's CA, never the system trust store: a
certificate from a public CA must not authenticate a worker, and a worker must only talk to a
Gateway whose certificate our CA signed.
"""

from __future__ import annotations

import hashlib
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

__all__ = [
    "CA_CERT_FILE",
    "CA_KEY_FILE",
    "SERVER_CERT_FILE",
    "SERVER_KEY_FILE",
    "WORKERS_DIR",
    "PkiError",
    "PkiNotFoundError",
    "PkiPaths",
    "client_certificate_problem",
    "fingerprint_of_der",
    "fingerprint_of_pem",
    "load_pki",
    "peer_certificate",
    "peer_fingerprint",
    "server_ssl_context",
]

CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
SERVER_CERT_FILE = "server.pem"
SERVER_KEY_FILE = "server-key.pem"
WORKERS_DIR = "workers"


class PkiError(Exception):
    """A PKI operation could not be carried out."""



class PkiNotFoundError(PkiError, FileNotFoundError):
    """The PKI directory does not hold the expected files."""


@dataclass(frozen=True, slots=True)
class PkiPaths:
    """Where the files of one PKI directory live."""

    directory: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path

    @classmethod
    def for_directory(cls, directory: Path | str) -> PkiPaths:
        """Return the standard file locations inside ``directory`` (nothing is read or created)."""
        base = Path(directory)
        return cls(
            directory=base,
            ca_cert=base / CA_CERT_FILE,
            ca_key=base / CA_KEY_FILE,
            server_cert=base / SERVER_CERT_FILE,
            server_key=base / SERVER_KEY_FILE,
        )

    @property
    def workers_dir(self) -> Path:
        """The folder that holds issued worker certificates."""
        return self.directory / WORKERS_DIR



# --------------------------------------------------------------------------------------------
# Fingerprints
# --------------------------------------------------------------------------------------------


def fingerprint_of_der(der: bytes) -> str:
    """Return the SHA-256 fingerprint (lowercase hex) of a DER-encoded certificate."""
    return hashlib.sha256(der).hexdigest()


def fingerprint_of_pem(pem: bytes) -> str:
    """Return the SHA-256 fingerprint (lowercase hex) of the first certificate in ``pem``."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise PkiError(f"not a PEM certificate: {exc}") from exc
    return fingerprint_of_der(cert.public_bytes(serialization.Encoding.DER))


def peer_certificate(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> bytes | None:
    """The peer's certificate on a TLS connection (DER), or ``None``."""
    if ssl_object is None:
        return None
    return ssl_object.getpeercert(binary_form=True) or None


def peer_fingerprint(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str | None:
    """Return the fingerprint of the peer's certificate on a TLS connection, or ``None``.

    With aiohttp: ``peer_fingerprint(request.transport.get_extra_info("ssl_object"))``.
    """
    der = peer_certificate(ssl_object)
    return None if der is None else fingerprint_of_der(der)


def client_certificate_problem(der: bytes) -> str | None:
    """Why a certificate the handshake accepted still may not authenticate a worker (None: it may).

    OpenSSL's purpose check on the server refuses a client certificate whose extendedKeyUsage
    lacks clientAuth, but accepts one with no extendedKeyUsage at all, and does not look at a
    leaf's basicConstraints. A worker certificate must say both: extendedKeyUsage with
    clientAuth, and basicConstraints CA:FALSE (a CA certificate, signed by our CA by mistake,
    could otherwise sign certificates of its own).
    """
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as exc:
        return f"the client certificate cannot be read: {exc}"
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return "the client certificate has no basicConstraints extension: a worker certificate must say CA:FALSE"
    if constraints.ca:
        return "the client certificate is a CA certificate (basicConstraints CA:TRUE): a worker certificate must say CA:FALSE"
    try:
        usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return "the client certificate has no extendedKeyUsage extension: a worker certificate must carry clientAuth"
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usage:
        return "the client certificate's extendedKeyUsage lacks clientAuth"
    return None



def load_pki(directory: Path | str) -> PkiPaths:
    """Return the paths of an existing PKI directory, checking that its files are there."""
    paths = PkiPaths.for_directory(directory)
    missing = [
        str(p) for p in (paths.ca_cert, paths.ca_key, paths.server_cert, paths.server_key) if not p.is_file()
    ]
    if missing:
        raise PkiNotFoundError(f"incomplete PKI in {paths.directory}: missing {', '.join(missing)}")
    return paths


# --------------------------------------------------------------------------------------------
# TLS contexts
# --------------------------------------------------------------------------------------------


def server_ssl_context(pki: PkiPaths | Path | str) -> ssl.SSLContext:
    """Build the Gateway's TLS server context: TLS 1.2+, client certificate required.

    Only the PKI's own CA is trusted for client certificates (never the system store), and the
    client certificate must carry EKU clientAuth (OpenSSL's default purpose check on a server).
    The worker's identity is then :func:`peer_fingerprint` of the connection.
    """
    paths = pki if isinstance(pki, PkiPaths) else load_pki(pki)
    # A bare PROTOCOL_TLS_SERVER context, not ssl.create_default_context(): that one would load
    # the system CA store and so let any publicly issued certificate authenticate as a worker.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    ctx.load_cert_chain(certfile=str(paths.server_cert), keyfile=str(paths.server_key))
    ctx.load_verify_locations(cafile=str(paths.ca_cert))
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx

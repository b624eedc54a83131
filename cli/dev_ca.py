"""The development PKI: a CA, the Gateway's server certificate and worker certificates, built on
``cryptography`` (``leasehold pki``, the demo, the tests and the benchmarks use it).

In production bring your own CA (see docs/guides/deploy/gateway.md); the Gateway itself only reads a PKI directory
(:mod:`gateway.tls`).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from leasehold.gateway.tls import SERVER_CERT_FILE, PkiError, PkiNotFoundError, PkiPaths, fingerprint_of_der

DEFAULT_SERVER_NAMES: tuple[str, ...] = ("localhost", "127.0.0.1")

_CA_DAYS = 3650
# Certificates start a little in the past so that a peer whose clock lags ours still accepts them.
_BACKDATE = dt.timedelta(minutes=5)
# Certificate names become file names: keep them to a safe, boring alphabet.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_KEY_MODE = 0o600
_CERT_MODE = 0o644


class PkiExistsError(PkiError, FileExistsError):
    """The file or CA already exists and ``force`` was not given."""


@dataclass(frozen=True, slots=True)
class IssuedCertificate:
    """A certificate written to disk, with its identity."""

    name: str
    cert_path: Path
    key_path: Path
    fingerprint: str
    """SHA-256 of the DER certificate, lowercase hex: the worker's identity at the Gateway."""
    serial_number: int
    not_before: dt.datetime
    not_after: dt.datetime


# --------------------------------------------------------------------------------------------
# Creating the PKI and issuing certificates
# --------------------------------------------------------------------------------------------


def init_pki(
    directory: Path | str,
    *,
    server_names: Sequence[str] = DEFAULT_SERVER_NAMES,
    days: int = 825,
    force: bool = False,
    exist_ok: bool = False,
) -> PkiPaths:
    """Create a CA and a Gateway server certificate in ``directory``.

    ``days`` is the validity of the server certificate (the CA is valid ten years).
    ``server_names`` go into the server certificate's subjectAltName: IP literals as IP entries,
    everything else as DNS entries.

    An existing CA is never overwritten by accident: if ``ca.pem`` or ``ca-key.pem`` exists,
    :class:`PkiExistsError` is raised, unless ``force=True`` (make a new CA and server
    certificate; previously issued worker certificates then no longer validate) or
    ``exist_ok=True`` (keep the CA, issue a server certificate only if none exists, and return
    the paths — safe to call on every start-up).
    """
    _check_days(days)
    paths = PkiPaths.for_directory(directory)
    names = _normalise_names(server_names)
    ca_exists = paths.ca_cert.exists() or paths.ca_key.exists()
    if ca_exists and not force:
        if not exist_ok:
            raise PkiExistsError(f"a CA already exists in {paths.directory} (use force to replace it)")
        _load_ca(paths)  # fail early if what is there is not a usable CA
        if not paths.server_cert.exists() or not paths.server_key.exists():
            issue_server_certificate(paths.directory, server_names=names, days=days)
        return paths

    _make_private_dir(paths.directory)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    ca_name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "leasehold"),
            # A unique name per CA, so two CAs (old and new, or another site's) never collide.
            x509.NameAttribute(NameOID.COMMON_NAME, f"leasehold CA {secrets.token_hex(4)}"),
        ]
    )
    ca_public = ca_key.public_key()
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + dt.timedelta(days=_CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _write_private_key(paths.ca_key, ca_key)
    _write_certificate(paths.ca_cert, ca_cert)
    issue_server_certificate(paths.directory, server_names=names, days=days)
    return paths



def issue_server_certificate(
    directory: Path | str,
    *,
    server_names: Sequence[str] = DEFAULT_SERVER_NAMES,
    days: int = 825,
) -> IssuedCertificate:
    """(Re)issue the Gateway's server certificate (``server.pem``) with the existing CA.

    The certificate has a subjectAltName with the given DNS names and IP addresses, EKU
    serverAuth, and is signed by the CA in ``directory``. An existing server certificate is
    replaced (rotation); the CA is left alone.
    """
    _check_days(days)
    paths = PkiPaths.for_directory(directory)
    names = _normalise_names(server_names)
    now = _now()
    return _issue_leaf(
        paths,
        common_name=names[0],
        san_names=names,
        eku=[ExtendedKeyUsageOID.SERVER_AUTH],
        key_usage_ok=True,
        not_before=now - _BACKDATE,
        not_after=now + dt.timedelta(days=days),
        cert_path=paths.server_cert,
        key_path=paths.server_key,
        display_name=SERVER_CERT_FILE.removesuffix(".pem"),
    )


def issue_worker_certificate(
    directory: Path | str,
    name: str,
    *,
    days: int = 365,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
    eku_client: bool = True,
    key_usage_ok: bool = True,
    eku_absent: bool = False,
    ca: bool = False,
    force: bool = False,
) -> IssuedCertificate:
    """Issue a worker's client certificate, signed by the CA in ``directory``.

    Writes ``workers/NAME.pem`` and ``workers/NAME-key.pem`` (0600) and returns their paths and
    the certificate's SHA-256 fingerprint, which is what the Gateway registers for the worker.
    An existing certificate of the same name is only replaced with ``force=True``.

    The remaining knobs exist for security tests: ``not_before``/``not_after`` (timezone-aware,
    they override ``days``) make expired or not-yet-valid certificates; ``eku_client=False``
    gives the certificate EKU serverAuth instead of clientAuth; ``key_usage_ok=False`` gives it
    a keyUsage that allows neither digitalSignature nor keyAgreement; ``eku_absent=True`` leaves
    the extendedKeyUsage extension out; ``ca=True`` makes it say basicConstraints CA:TRUE. The
    Gateway must refuse all of these (the last two pass OpenSSL's own purpose check: the Gateway
    refuses them itself, see :func:`gateway.tls.client_certificate_problem`).
    """
    _check_name(name)
    paths = PkiPaths.for_directory(directory)
    cert_path = paths.workers_dir / f"{name}.pem"
    key_path = paths.workers_dir / f"{name}-key.pem"
    if not force and (cert_path.exists() or key_path.exists()):
        raise PkiExistsError(f"worker certificate {cert_path} already exists (use force to replace it)")
    start, end = _validity(days, not_before, not_after)
    paths.workers_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    eku = [] if eku_absent else [ExtendedKeyUsageOID.CLIENT_AUTH] if eku_client else [ExtendedKeyUsageOID.SERVER_AUTH]
    return _issue_leaf(
        paths,
        common_name=name,
        san_names=None,
        eku=eku,
        key_usage_ok=key_usage_ok,
        ca=ca,
        not_before=start,
        not_after=end,
        cert_path=cert_path,
        key_path=key_path,
        display_name=name,
    )


def issue_self_signed(
    directory: Path | str,
    name: str,
    *,
    days: int = 365,
    not_before: dt.datetime | None = None,
    not_after: dt.datetime | None = None,
    server_names: Sequence[str] | None = None,
) -> IssuedCertificate:
    """Write a self-signed certificate ``NAME.pem`` / ``NAME-key.pem`` into ``directory``.

    Meant for tests: a "worker" certificate that no CA vouches for, or the certificate of a
    scanned HTTPS server. It carries EKU serverAuth and clientAuth and a subjectAltName of
    ``server_names`` (default: ``["localhost", "127.0.0.1"]``).
    """
    _check_name(name)
    start, end = _validity(days, not_before, not_after)
    base = Path(directory)
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "leasehold self-signed"),
            x509.NameAttribute(NameOID.COMMON_NAME, name),
        ]
    )
    names = _normalise_names(DEFAULT_SERVER_NAMES if server_names is None else server_names)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_leaf_key_usage(ok=True), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(_general_names(names)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path = base / f"{name}.pem"
    key_path = base / f"{name}-key.pem"
    _write_private_key(key_path, key)
    _write_certificate(cert_path, cert)
    return _issued(name, cert, cert_path, key_path)


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _check_days(days: int) -> None:
    if days < 1:
        raise PkiError(f"days must be at least 1, got {days}")


def _check_name(name: str) -> None:
    if not _NAME_RE.fullmatch(name) or name.endswith("-key"):
        raise PkiError(
            f"invalid certificate name {name!r}: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit and not ending in '-key'"
        )


def _validity(
    days: int, not_before: dt.datetime | None, not_after: dt.datetime | None
) -> tuple[dt.datetime, dt.datetime]:
    for label, value in (("not_before", not_before), ("not_after", not_after)):
        if value is not None and value.tzinfo is None:
            raise PkiError(f"{label} must be timezone-aware")
    now = _now()
    start = not_before if not_before is not None else now - _BACKDATE
    if not_after is not None:
        end = not_after
    else:
        _check_days(days)
        end = max(start, now) + dt.timedelta(days=days)
    if end <= start:
        raise PkiError("not_after must be later than not_before")
    return start, end


def _normalise_names(server_names: Sequence[str]) -> list[str]:
    if isinstance(server_names, str):  # a lone string is a Sequence[str] too; be kind
        server_names = [server_names]
    names: list[str] = []
    for raw in server_names:
        name = raw.strip()
        if not name:
            continue
        try:
            name = str(ipaddress.ip_address(name.strip("[]")))
        except ValueError:
            name = name.lower()
            try:
                x509.DNSName(name)
            except ValueError as exc:
                raise PkiError(f"invalid server name {raw!r}") from exc
        if name not in names:
            names.append(name)
    if not names:
        raise PkiError("at least one server name is needed")
    return names


def _general_names(names: Sequence[str]) -> list[x509.GeneralName]:
    result: list[x509.GeneralName] = []
    for name in names:
        try:
            result.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            result.append(x509.DNSName(name))
    return result


def _leaf_key_usage(*, ok: bool) -> x509.KeyUsage:
    # EC keys sign the handshake (digitalSignature). The "bad" variant allows only
    # nonRepudiation, which OpenSSL's sslclient/sslserver purpose checks reject.
    return x509.KeyUsage(
        digital_signature=ok,
        content_commitment=not ok,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def _load_ca(paths: PkiPaths) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
        key = serialization.load_pem_private_key(paths.ca_key.read_bytes(), password=None)
    except FileNotFoundError as exc:
        raise PkiNotFoundError(f"no CA in {paths.directory}: {exc.filename} is missing") from exc
    except (ValueError, TypeError) as exc:
        raise PkiError(f"unreadable CA in {paths.directory}: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"unsupported CA key type in {paths.ca_key}: {type(key).__name__}")
    if cert.public_key() != key.public_key():
        raise PkiError(f"{paths.ca_key} does not belong to {paths.ca_cert}")
    return cert, key


def _issue_leaf(
    paths: PkiPaths,
    *,
    common_name: str,
    san_names: Sequence[str] | None,
    eku: list[x509.ObjectIdentifier],
    key_usage_ok: bool,
    ca: bool = False,
    not_before: dt.datetime,
    not_after: dt.datetime,
    cert_path: Path,
    key_path: Path,
    display_name: str,
) -> IssuedCertificate:
    ca_cert, ca_key = _load_ca(paths)
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "leasehold"),
                    x509.NameAttribute(NameOID.COMMON_NAME, common_name),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(_leaf_key_usage(ok=key_usage_ok), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
    )
    if eku:
        builder = builder.add_extension(x509.ExtendedKeyUsage(eku), critical=False)
    if san_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(_general_names(san_names)), critical=False
        )
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_private_key(key_path, key)
    _write_certificate(cert_path, cert)
    return _issued(display_name, cert, cert_path, key_path)


def _issued(name: str, cert: x509.Certificate, cert_path: Path, key_path: Path) -> IssuedCertificate:
    return IssuedCertificate(
        name=name,
        cert_path=cert_path,
        key_path=key_path,
        fingerprint=fingerprint_of_der(cert.public_bytes(serialization.Encoding.DER)),
        serial_number=cert.serial_number,
        not_before=cert.not_valid_before_utc,
        not_after=cert.not_valid_after_utc,
    )


def _make_private_dir(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)


def _write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        encoding=serialization.Encoding.PEM,
        format=serialization.PrivateFormat.PKCS8,
        encryption_algorithm=serialization.NoEncryption(),
    )
    _write_atomically(path, data, _KEY_MODE)


def _write_certificate(path: Path, cert: x509.Certificate) -> None:
    _write_atomically(path, cert.public_bytes(serialization.Encoding.PEM), _CERT_MODE)


def _write_atomically(path: Path, data: bytes, mode: int) -> None:
    """Write via a temporary file created with ``mode`` (so a key is never world-readable)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask may have narrowed or the platform ignored `mode`
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

"""TLS inspection: handshake with each service in scope and describe its certificate.

Services are the ``service`` assets in ``scope.assets``, ``https://`` URL targets, and targets
with an explicit ``host:port``. The handshake does not verify anything (that is the point: we
want to see bad certificates) and accepts old protocol versions so that they can be reported.

Parameters (all optional): ``timeout`` (seconds per handshake, default 10), ``concurrency``
(default 10), ``expiry_warning_days`` (default 30).

For each service that completes a handshake it emits a ``certificate`` asset (value: the
SHA-256 fingerprint of the DER certificate) with subject, issuer, validity, ``days_to_expiry``,
``self_signed``, SANs, the negotiated ``protocol`` and ``cipher``, and threats on the service:

* ``tls-self-signed`` (medium): subject == issuer and the signature verifies with its own key;
* ``tls-expired`` (high) / ``tls-not-yet-valid`` (medium) / ``tls-expiring-soon`` (low);
* ``tls-legacy-protocol`` (medium): TLS 1.0/1.1 or SSL negotiated.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import ssl
import sys
import warnings
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa

from leasehold.worker.plugins.common import (
    Emitter,
    PluginInput,
    Service,
    asset_record,
    asset_ref,
    is_ip,
    log,
    param_float,
    param_int,
    raw_record,
    run_plugin,
    threat_record,
)

__all__ = ["describe_certificate", "handshake", "is_self_signed", "scan", "services_to_inspect"]

PLUGIN = "tls_inspect"
_LEGACY_PROTOCOLS = frozenset({"SSLv2", "SSLv3", "TLSv1", "TLSv1.1"})


def _inspection_context() -> ssl.SSLContext:
    with warnings.catch_warnings():
        # Old protocol versions are deprecated for use; we only want to *see* them.
        warnings.simplefilter("ignore", DeprecationWarning)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        with contextlib.suppress(ssl.SSLError):
            ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    return ctx


def is_self_signed(cert: x509.Certificate) -> bool:
    """True when subject == issuer and the certificate's signature verifies with its own key."""
    if cert.subject != cert.issuer:
        return False
    try:
        cert.verify_directly_issued_by(cert)
    except (InvalidSignature, ValueError, TypeError, UnsupportedAlgorithm):
        return False
    return True


def _key_description(cert: x509.Certificate) -> dict[str, Any]:
    try:
        key = cert.public_key()
    except (ValueError, UnsupportedAlgorithm):
        return {"type": "unknown"}
    if isinstance(key, rsa.RSAPublicKey):
        return {"type": "RSA", "bits": key.key_size}
    if isinstance(key, ec.EllipticCurvePublicKey):
        return {"type": "EC", "curve": key.curve.name, "bits": key.key_size}
    if isinstance(key, dsa.DSAPublicKey):
        return {"type": "DSA", "bits": key.key_size}
    if isinstance(key, ed25519.Ed25519PublicKey):
        return {"type": "Ed25519"}
    if isinstance(key, ed448.Ed448PublicKey):
        return {"type": "Ed448"}
    return {"type": type(key).__name__}


def describe_certificate(der: bytes, now: dt.datetime | None = None) -> dict[str, Any]:
    """Parse a DER certificate into the attributes of a ``certificate`` asset."""
    cert = x509.load_der_x509_certificate(der)
    moment = now if now is not None else dt.datetime.now(dt.UTC)
    not_before = cert.not_valid_before_utc
    not_after = cert.not_valid_after_utc
    remaining = not_after - moment
    dns_names: list[str] = []
    ip_addresses: list[str] = []
    with contextlib.suppress(x509.ExtensionNotFound):
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns_names = san.get_values_for_type(x509.DNSName)
        ip_addresses = [str(a) for a in san.get_values_for_type(x509.IPAddress)]
    is_ca = False
    with contextlib.suppress(x509.ExtensionNotFound):
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    oid = cert.signature_algorithm_oid
    # `_name` is the readable name cryptography keeps for known OIDs ("ecdsa-with-SHA256").
    signature_algorithm = str(getattr(oid, "_name", oid.dotted_string))
    return {
        "sha256": hashlib.sha256(der).hexdigest(),
        "subject": cert.subject.rfc4514_string(),
        "issuer": cert.issuer.rfc4514_string(),
        "serial_number": format(cert.serial_number, "x"),
        "not_before": not_before.isoformat(),
        "not_after": not_after.isoformat(),
        # Whole days left, rounded down: negative once expired.
        "days_to_expiry": remaining.days,
        "expired": moment > not_after,
        "not_yet_valid": moment < not_before,
        "self_signed": is_self_signed(cert),
        "is_ca": is_ca,
        "dns_names": dns_names,
        "ip_addresses": ip_addresses,
        "signature_algorithm": signature_algorithm,
        "public_key": _key_description(cert),
        "version": cert.version.name,
    }


async def handshake(
    service: Service, time_limit: float
) -> tuple[bytes, str | None, tuple[str, str, int] | None]:
    """Complete a TLS handshake with ``service``; return (DER certificate, protocol, cipher)."""
    server_hostname = None if is_ip(service.host) else service.host  # SNI only for names
    async with asyncio.timeout(time_limit):
        _reader, writer = await asyncio.open_connection(
            service.host, service.port, ssl=_inspection_context(), server_hostname=server_hostname
        )
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        if not der:
            raise ssl.SSLError("the server sent no certificate")
        return der, ssl_object.version(), ssl_object.cipher()
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            async with asyncio.timeout(time_limit):
                await writer.wait_closed()


def services_to_inspect(request: PluginInput) -> list[Service]:
    """Services from assets, ``https://`` URL targets and ``host:port`` targets, in scope."""
    scope = request.scope
    found: dict[str, Service] = {s.value: s for s in scope.services()}
    for target in scope.targets:
        if target.port is None or target.network is not None:
            continue
        if target.kind == "url" and target.scheme != "https":
            continue
        service = Service(host=target.host, port=target.port)
        if scope.allows(service.host, service.port):
            found.setdefault(service.value, service)
    return list(found.values())


def _threats(service: Service, info: dict[str, Any], expiry_warning_days: int) -> list[dict[str, Any]]:
    ref = asset_ref("service", service.value)
    base = {
        "certificate_sha256": info["sha256"],
        "subject": info["subject"],
        "issuer": info["issuer"],
        "not_after": info["not_after"],
        "days_to_expiry": info["days_to_expiry"],
    }
    threats: list[dict[str, Any]] = []
    if info["self_signed"]:
        threats.append(
            threat_record(
                external_id="tls-self-signed",
                title="Self-signed TLS certificate",
                severity="medium",
                asset=ref,
                details=base,
            )
        )
    if info["expired"]:
        threats.append(
            threat_record(
                external_id="tls-expired",
                title="Expired TLS certificate",
                severity="high",
                asset=ref,
                details=base,
            )
        )
    elif info["not_yet_valid"]:
        threats.append(
            threat_record(
                external_id="tls-not-yet-valid",
                title="TLS certificate not yet valid",
                severity="medium",
                asset=ref,
                details={**base, "not_before": info["not_before"]},
            )
        )
    elif info["days_to_expiry"] < expiry_warning_days:
        threats.append(
            threat_record(
                external_id="tls-expiring-soon",
                title="TLS certificate expires soon",
                severity="low",
                asset=ref,
                details=base,
            )
        )
    if info["protocol"] in _LEGACY_PROTOCOLS:
        threats.append(
            threat_record(
                external_id="tls-legacy-protocol",
                title=f"Legacy TLS protocol negotiated ({info['protocol']})",
                severity="medium",
                asset=ref,
                details={"protocol": info["protocol"]},
            )
        )
    return threats


async def scan(request: PluginInput, out: Emitter) -> None:
    """Inspect the certificate of every TLS service in scope."""
    parameters = request.parameters
    timeout = param_float(parameters, "timeout", 10.0, maximum=300.0)
    concurrency = param_int(parameters, "concurrency", 10, maximum=256)
    expiry_warning_days = param_int(parameters, "expiry_warning_days", 30, minimum=0)
    services = services_to_inspect(request)
    log("inspecting", services=len(services))
    semaphore = asyncio.Semaphore(concurrency)

    async def inspect(service: Service) -> None:
        async with semaphore:
            try:
                der, protocol, cipher = await handshake(service, timeout)
            except (TimeoutError, OSError, ssl.SSLError) as exc:
                log("no TLS handshake", service=service.value, error=str(exc) or type(exc).__name__)
                out.emit(
                    raw_record(
                        plugin=PLUGIN,
                        event="tls_handshake_failed",
                        service=service.value,
                        error=f"{type(exc).__name__}: {exc}",
                    )
                )
                return
        try:
            info = describe_certificate(der)
        except ValueError as exc:
            log("unparseable certificate", service=service.value, error=str(exc))
            out.emit(
                raw_record(
                    plugin=PLUGIN, event="certificate_unparseable", service=service.value, error=str(exc)
                )
            )
            return
        info.update(
            service=service.value,
            host=service.host,
            port=service.port,
            protocol=protocol,
            cipher=cipher[0] if cipher else None,
            cipher_bits=cipher[2] if cipher else None,
        )
        out.emit(asset_record("certificate", info["sha256"], info))
        out.emit_all(_threats(service, info, expiry_warning_days))

    await asyncio.gather(*(inspect(s) for s in services))


if __name__ == "__main__":
    sys.exit(run_plugin(PLUGIN, scan))

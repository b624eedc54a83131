"""Which scan targets an organisation may aim workers at: its target policy, and the addresses
nobody may scan unless an administrator says so.

One implementation for both places it is enforced: the Gateway, when a scan, schedule or task
is created (names resolved there), and the worker agent, after resolving each target's name and
before a plugin runs (:mod:`worker.runner`). Pure: resolving names is the caller's business;
:func:`check_target` takes the addresses a name resolved to.

Rules, for one target (a host name, an IP, ``host:port``, a URL or a CIDR network):

1. A name under a denied domain (the organisation's ``deny``, or :data:`DEFAULT_DENIED_DOMAINS`)
   is refused.
2. An address (or a network overlapping one) in the organisation's ``deny`` networks is refused.
3. An address in :data:`DEFAULT_DENIED_NETWORKS` (loopback, link-local, cloud metadata, "this
   host") is refused unless an ``allow`` network inside that default-denied network names it
   (e.g. ``169.254.10.0/24``): a broad allow such as ``0.0.0.0/0`` never opens them.
4. With ``allow`` entries other than such exceptions, the target must match one: its name under
   an allowed domain, or every address in an allowed network. (So ``allow: ["127.0.0.0/8"]``
   opens loopback and restricts nothing else; ``allow: ["10.0.0.0/8"]`` restricts scans to it.)

A domain entry (``example.com``) covers the domain and every name under it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from leasehold.domain.errors import Forbidden, InvalidRequest
from leasehold.domain.events import OrganizationTargetPolicySet

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

#: Denied by default: loopback, link-local (where cloud metadata services answer, e.g.
#: 169.254.169.254), the unspecified "this host" addresses (0.0.0.0 reaches the local host), and
#: the metadata addresses outside link-local (AWS over IPv6, Alibaba Cloud).
DEFAULT_DENIED_NETWORKS: tuple[Network, ...] = tuple(ipaddress.ip_network(n) for n in (
    "127.0.0.0/8", "::1/128", "169.254.0.0/16", "fe80::/10", "0.0.0.0/8", "::/128",
    "fd00:ec2::254/128", "100.100.100.200/32"))
#: Metadata service names, denied by default whatever they resolve to.
DEFAULT_DENIED_DOMAINS: tuple[str, ...] = ("metadata.google.internal", "metadata.goog")
#: Entries per list of a policy.
MAX_POLICY_ENTRIES = 1000


class TargetRefused(Forbidden):
    """A scan target the organisation's target policy refuses."""

    code = "target-refused"


@dataclass(frozen=True, slots=True)
class TargetPolicy:
    """An organisation's allowed and denied networks and domains (normalised, see :func:`parse_policy`)."""

    allow_networks: tuple[Network, ...] = ()
    allow_domains: tuple[str, ...] = ()
    deny_networks: tuple[Network, ...] = ()
    deny_domains: tuple[str, ...] = ()

    @property
    def allow(self) -> list[str]:
        return [str(n) for n in self.allow_networks] + list(self.allow_domains)

    @property
    def deny(self) -> list[str]:
        return [str(n) for n in self.deny_networks] + list(self.deny_domains)

    def as_json(self) -> dict[str, list[str]]:
        return {"allow": self.allow, "deny": self.deny}

    @property
    def opens_default_denied(self) -> list[str]:
        """The allow networks that open part of a default-denied network (administrators only)."""
        return [str(n) for n in self.allow_networks if _default_denied_parent(n) is not None]


DEFAULT_POLICY = TargetPolicy()


def _entry(text: str) -> Network | str:
    item = text.strip().lower().rstrip(".")
    if not item or len(item) > 253:
        raise InvalidRequest(f"bad target policy entry {text!r}")
    try:
        return ipaddress.ip_network(item, strict=False)
    except ValueError:
        pass
    labels = item.split(".")
    if not all(label and len(label) <= 63 and all(c.isalnum() or c in "-_" for c in label) for label in labels):
        raise InvalidRequest(f"target policy entry {text!r} is neither a network, an address nor a domain")
    return item


def parse_policy(allow: Iterable[str] = (), deny: Iterable[str] = ()) -> TargetPolicy:
    """A policy from its entries (networks, addresses, domains); InvalidRequest naming a bad one."""
    lists = []
    for name, entries in (("allow", list(allow)), ("deny", list(deny))):
        if len(entries) > MAX_POLICY_ENTRIES:
            raise InvalidRequest(f"{name} has more than {MAX_POLICY_ENTRIES} entries")
        parsed = [_entry(e) for e in entries]
        networks = tuple(dict.fromkeys(p for p in parsed if not isinstance(p, str)))
        domains = tuple(dict.fromkeys(p for p in parsed if isinstance(p, str)))
        lists.append((networks, domains))
    (allow_networks, allow_domains), (deny_networks, deny_domains) = lists
    return TargetPolicy(allow_networks, allow_domains, deny_networks, deny_domains)


def policy_from_json(value: Mapping[str, Any] | None) -> TargetPolicy:
    """The policy stored (or sent to a worker) as ``{"allow": [...], "deny": [...]}``; None: the default."""
    if not value:
        return DEFAULT_POLICY
    return parse_policy(value.get("allow") or (), value.get("deny") or ())


@dataclass(frozen=True, slots=True)
class TargetHost:
    """What a target string points at: a name to resolve, an address, or a network."""

    raw: str
    name: str | None = None
    network: Network | None = None


def target_host(raw: str) -> TargetHost:
    """The host of a target as plugins read it (host, IP, ``host:port``, ``[v6]:port``, URL,
    CIDR network). Lenient: what is not an address or network is taken as a name."""
    text = raw.strip()
    host = text
    if "://" in text:
        host = urlsplit(text).hostname or ""
    elif "/" in text:
        try:
            return TargetHost(raw, network=ipaddress.ip_network(text, strict=False))
        except ValueError:
            host = text.split("/", 1)[0]
    elif text.startswith("["):
        host = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        host = text.partition(":")[0]
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return TargetHost(raw, network=ipaddress.ip_network(host.split("%", 1)[0]))
    except ValueError:
        return TargetHost(raw, name=host)


def targets_of(scope: Mapping[str, Any] | None) -> list[str]:
    """The target strings of a scan's targets or a task's scope (``targets``: a list of strings,
    as plugins read them; anything else there is not a target)."""
    found = (scope or {}).get("targets")
    if isinstance(found, str):
        return [found]
    if isinstance(found, list):
        return [t for t in found if isinstance(t, str)]
    return []


def _unmapped(network: Network) -> Network:
    """IPv4-mapped and 6to4/NAT64-free form: ``::ffff:127.0.0.1`` is 127.0.0.1."""
    if isinstance(network, ipaddress.IPv6Network) and network.prefixlen >= 96:
        mapped = network.network_address.ipv4_mapped
        if mapped is not None:
            return ipaddress.ip_network(f"{mapped}/{network.prefixlen - 96}")
    return network


def _default_denied_parent(network: Network) -> Network | None:
    network = _unmapped(network)
    for denied in DEFAULT_DENIED_NETWORKS:
        if denied.version == network.version and network.subnet_of(denied):  # type: ignore[arg-type]
            return denied
    return None


def _overlaps(network: Network, others: Sequence[Network]) -> Network | None:
    return next((o for o in others if o.version == network.version and network.overlaps(o)), None)


def _under(name: str, domains: Iterable[str]) -> str | None:
    return next((d for d in domains if name == d or name.endswith("." + d)), None)


def check_target(policy: TargetPolicy, raw: str, addresses: Iterable[str] = ()) -> None:
    """Refuse (:class:`TargetRefused`, naming the target and the rule) a target the policy does
    not allow. ``addresses``: what the target's name resolved to (none for an address or a
    network, or a name the caller could not resolve: then only the name is judged)."""
    host = target_host(raw)
    if host.name is not None:
        denied = _under(host.name, (*policy.deny_domains, *DEFAULT_DENIED_DOMAINS))
        if denied is not None:
            raise TargetRefused(f"target {raw!r}: the domain {denied} is denied", target=raw)
    networks = [host.network] if host.network is not None else []
    for address in addresses:
        try:
            networks.append(ipaddress.ip_network(address.split("%", 1)[0]))
        except ValueError:
            continue
    networks = [_unmapped(n) for n in networks]
    for network in networks:
        denied_network = _overlaps(network, [_unmapped(n) for n in policy.deny_networks])
        if denied_network is not None:
            raise TargetRefused(f"target {raw!r}: {network} is in the denied network {denied_network}", target=raw)
        for default in DEFAULT_DENIED_NETWORKS:
            if default.version != network.version or not network.overlaps(default):
                continue
            opened = [n for n in map(_unmapped, policy.allow_networks)
                      if n.version == network.version and network.subnet_of(n)  # type: ignore[arg-type]
                      and _default_denied_parent(n) is not None]
            if not opened:
                via = f" ({host.name} resolves to it)" if host.name is not None else ""
                raise TargetRefused(f"target {raw!r}: {network}{via} is in {default}, denied by default "
                                    "(loopback, link-local and cloud metadata addresses)", target=raw)
    restricting = [n for n in policy.allow_networks if _default_denied_parent(n) is None]
    if restricting or policy.allow_domains:
        by_name = host.name is not None and _under(host.name, policy.allow_domains) is not None
        by_network = bool(networks) and all(
            any(n.version == a.version and n.subnet_of(a) for a in map(_unmapped, policy.allow_networks))  # type: ignore[arg-type]
            for n in networks)
        if not (by_name or by_network):
            raise TargetRefused(f"target {raw!r} is not in the organisation's allow list", target=raw)


def set_target_policy(organization_id: UUID, version: int, policy: TargetPolicy, *, now: datetime,
                      actor: str) -> list[OrganizationTargetPolicySet]:
    """The event replacing the organisation's target policy."""
    return [OrganizationTargetPolicySet(originator_id=organization_id, originator_version=version + 1,
                                        timestamp=now, actor=actor, allow=tuple(policy.allow),
                                        deny=tuple(policy.deny))]


def check_scope(policy: TargetPolicy, scope: Mapping[str, Any] | None,
                resolved: Mapping[str, Sequence[str]] | None = None) -> None:
    """:func:`check_target` on every target of a scan's targets or a task's scope; ``resolved``:
    the addresses each name resolved to (see :func:`names_of`)."""
    for raw in targets_of(scope):
        host = target_host(raw)
        check_target(policy, raw, (resolved or {}).get(host.name, ()) if host.name is not None else ())


def names_of(scope: Mapping[str, Any] | None) -> list[str]:
    """The host names (to resolve) among a scope's targets, without duplicates."""
    return list(dict.fromkeys(h.name for h in map(target_host, targets_of(scope)) if h.name))

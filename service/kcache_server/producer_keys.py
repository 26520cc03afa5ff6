"""Producer keys per namespace: the service's half of signed entries (:mod:`kcache_schemas.signed_envelope`).

A namespace with Ed25519 keys registered for it (``KCACHE_PRODUCER_KEYS``) takes only entries
that one of them signed for that layer and key: a write token alone no longer lets anyone put
code (a pickle, a shared object) in front of its consumers. Elsewhere entries stay opaque; a
signed one's envelope is only read, for the provenance the entry info route shows. The service
never unpickles or loads anything either way: it checks a hash and a signature.

Entries are write-once, so an entry stored before the keys were registered, or signed by a key
since retired, would hold its key forever and every consumer would recompile past it. In a
namespace with registered keys such an entry gives way to an upload a registered key signed.
Kernel packs are not signed (see docs/deployment.md, "Signed entries").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kcache_schemas import EntryInfo, EntrySignature
from kcache_schemas import signed_envelope as envelope
from kcache_schemas.signed_envelope import SignatureError, TrustedKeys

from kcache_server.domain_errors import UntrustedSignature

ALL_NAMESPACES = "*"


def registered_keys(registry: Mapping[str, TrustedKeys], namespace: str) -> TrustedKeys:
    """The keys registered for ``namespace``: its own and those for every namespace."""
    own, shared = registry.get(namespace), registry.get(ALL_NAMESPACES)
    if own is None or shared is None:
        return own or shared or TrustedKeys()
    return TrustedKeys({**shared.ed25519, **own.ed25519})


def admit_entry(keys: TrustedKeys, layer: str, key: str, body: bytes) -> EntrySignature | None:
    """What an upload's envelope says, checked against ``keys`` if there are any (else only
    read); :class:`UntrustedSignature` when registered keys exist and none of them signed it."""
    if not keys:
        if not envelope.is_signed(body):
            return None
        try:
            return envelope.parse(body).info(verified=False)
        except SignatureError:
            return None  # opaque bytes that merely look like an envelope: stored as they are
    try:
        signed = envelope.verify(body, layer, key, keys)
    except SignatureError as exc:
        raise UntrustedSignature(
            f"this namespace takes only entries signed by its registered producer keys ({', '.join(keys.key_ids())}): {exc}",
            detail={"reason": exc.reason, "registered_key_ids": keys.key_ids()},
        ) from None
    return signed.info(verified=True)


def supersedes(keys: TrustedKeys) -> Callable[[EntryInfo], bool] | None:
    """Which stored entries a trusted upload replaces: those no key registered now signed."""
    if not keys:
        return None

    def untrusted(stored: EntryInfo) -> bool:
        sig = stored.signature
        return sig is None or not sig.verified or sig.key_id not in keys.ed25519

    return untrusted

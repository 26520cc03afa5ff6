"""Signed cache entries on the client: who may produce what this process unpickles or loads.

FX-graph, AOTAutograd and autotune entries carry pickles, ``triton-module`` entries shared
objects: using one runs its producer's code. With signing configured, producers wrap each entry
in the schemas' envelope (:mod:`kcache_schemas.signed_envelope`: scheme, key id, layer, key, payload
hash and a :class:`~kcache_schemas.models.Provenance`: host, ``KCACHE_RUN_ID``, time,
environment fingerprint, kcache version), and consumers refuse, as a counted error and before
Inductor or Triton see a byte, anything unsigned or signed by a key they do not trust.

Two schemes behind one interface (:class:`EntrySigning`):

* Ed25519 (``KCACHE_SIGNING_PRIVATE_KEY`` signs, ``KCACHE_TRUSTED_KEYS`` lists the public keys
  accepted; a process that signs also trusts its own key). Whoever can verify cannot forge.
  Needs ``cryptography`` (``pip install cryptography``, kcache-client's ``[signing]`` extra).
* HMAC-SHA256 (``KCACHE_SIGNING_KEY``): one shared secret signs and verifies; simple setups.
  Entries from kcache before the envelope (``KCSIG1``) still verify with it.

Configured but unusable (``cryptography`` missing, an unreadable or malformed key): every entry
is refused and none is uploaded, with one warning. Safe, and never an error in the job: a refused
entry is a recompile, and an unsigned upload would only occupy a write-once key that the
signed entry should have.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import hmac
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcache_schemas import signed_envelope as envelope
from kcache_schemas.models import Provenance, SignatureAlg
from kcache_schemas.signed_envelope import SignatureError, SignatureHeader, TrustedKeys

from kcache.version import __version__

if TYPE_CHECKING:
    from kcache.config import ClientConfig

# The envelope of kcache 0.1 (HMAC only, no provenance): ``KCSIG1 | hmac(layer, key, data) | data``.
LEGACY_HMAC_MAGIC = b"KCSIG1"
_LEGACY_MAC_LEN = 32
INSTALL_HINT = "pip install cryptography (kcache-client's [signing] extra)"


class SigningUnavailable(Exception):
    """Signing is configured but cannot be done here; the entry must not be uploaded."""


@dataclass(frozen=True)
class Signer:
    alg: SignatureAlg
    key_id: str
    sign: Callable[[bytes], bytes] = field(repr=False)


@dataclass(frozen=True)
class EntrySigning:
    """One process's signing setup: how it signs (``signer``) and what it accepts (``trusted``).
    ``problem`` set: configured but unusable, so nothing is accepted and nothing signed."""

    trusted: TrustedKeys
    signer: Signer | None = None
    legacy_secret: bytes | None = field(default=None, repr=False)
    run_id: str | None = None
    problem: str | None = None

    @classmethod
    def from_config(cls, config: ClientConfig) -> EntrySigning | None:
        """None when no signing setting is given (entries travel as they are)."""
        secret = config.signing_key.encode() if config.signing_key else None
        if secret is None and not config.signing_private_key and not config.trusted_keys:
            return None
        hmac_signer = Signer("hmac-sha256", envelope.hmac_key_id(secret), functools.partial(envelope.hmac_signature, secret)) if secret else None
        if not config.signing_private_key and not config.trusted_keys:
            assert secret is not None
            return cls(TrustedKeys.of(hmac_secrets=[secret]), hmac_signer, secret, config.run_id)
        try:
            public_keys = load_trusted_keys(config.trusted_keys) if config.trusted_keys else []
            signer = hmac_signer
            if config.signing_private_key:
                private = load_private_key(config.signing_private_key)
                own = public_key_bytes(private)
                public_keys.append(own)
                signer = Signer("ed25519", envelope.ed25519_key_id(own), private.sign)
            require_cryptography()  # verifying needs it even where no private key is given
        except Exception as exc:  # unreadable, malformed, encrypted, another kind of key, no cryptography
            problem = str(exc) if isinstance(exc, (OSError, ValueError, SigningUnavailable)) else f"{type(exc).__name__}: {exc}"
            return cls(TrustedKeys(), run_id=config.run_id, problem=problem)
        return cls(TrustedKeys.of(public_keys, [secret] if secret else []), signer, secret, config.run_id)

    def seal(self, layer: str, key: str, data: bytes) -> bytes:
        """``data`` in a signed envelope, with this process's provenance."""
        if self.signer is None:
            raise SigningUnavailable(self.problem or "no signing key: KCACHE_TRUSTED_KEYS alone only verifies")
        header = SignatureHeader(
            alg=self.signer.alg, key_id=self.signer.key_id, layer=layer, key=key,
            payload_size=len(data), payload_sha256=envelope.payload_sha256(data), provenance=provenance(self.run_id),
        ).encode()
        return envelope.encode(header, self.signer.sign(envelope.DOMAIN + header), data)

    def open(self, layer: str, key: str, stored: bytes) -> bytes:
        """The payload of an entry a trusted key signed for ``layer``/``key``; else
        :class:`~kcache_schemas.signed_envelope.SignatureError`."""
        if self.problem is not None:
            raise SignatureError("unavailable", self.problem)
        if self.legacy_secret is not None and stored.startswith(LEGACY_HMAC_MAGIC):
            return _open_legacy(self.legacy_secret, layer, key, stored)
        return envelope.verify(stored, layer, key, self.trusted).payload()


def _legacy_mac(secret: bytes, layer: str, key: str, data: bytes) -> bytes:
    h = hmac.new(secret, digestmod=hashlib.sha256)
    h.update(f"{layer}\0{key}\0".encode())
    h.update(data)
    return h.digest()


def _open_legacy(secret: bytes, layer: str, key: str, stored: bytes) -> bytes:
    start = len(LEGACY_HMAC_MAGIC)
    mac, data = stored[start : start + _LEGACY_MAC_LEN], stored[start + _LEGACY_MAC_LEN :]
    if len(mac) != _LEGACY_MAC_LEN or not hmac.compare_digest(mac, _legacy_mac(secret, layer, key, data)):
        raise SignatureError("bad_signature", "entry signature does not verify")
    return data


# ---- provenance -----------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _machine() -> tuple[str, dict[str, str | None]]:
    from kcache.store.fingerprint import current

    return socket.gethostname(), dict(current().model_dump())


def provenance(run_id: str | None) -> Provenance:
    host, environment = _machine()
    return Provenance(
        host=host[:255], run_id=run_id, created_at=datetime.datetime.now(datetime.timezone.utc),
        environment=environment, kcache_version=__version__,
    )


# ---- keys -----------------------------------------------------------------------------------


def require_cryptography() -> None:
    try:
        import cryptography.hazmat.primitives.asymmetric.ed25519  # noqa: F401
    except ImportError:
        raise SigningUnavailable(f"Ed25519 keys are configured but the cryptography package is missing: {INSTALL_HINT}") from None


def _text(value: str) -> str:
    """A setting's value, or the contents of the file it names."""
    return Path(value).read_text(encoding="utf-8") if os.path.isfile(value) else value


def load_private_key(value: str) -> Any:
    """An Ed25519 private key from ``KCACHE_SIGNING_PRIVATE_KEY``: a file (PEM, as ``kcache keygen``
    writes) or the value itself (PEM, or base64 of the 32-byte seed). ValueError/OSError if not."""
    require_cryptography()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    text = _text(value).strip()
    if text.startswith("-----BEGIN"):
        key = load_pem_private_key(text.encode("ascii"), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError("KCACHE_SIGNING_PRIVATE_KEY is not an Ed25519 key")
        return key
    try:
        seed = envelope.parse_public_key(text)  # the same base64-of-32-bytes rule
    except ValueError:
        raise ValueError("KCACHE_SIGNING_PRIVATE_KEY is neither a readable file, a PEM private key, nor base64 of 32 bytes") from None
    return Ed25519PrivateKey.from_private_bytes(seed)


def public_key_bytes(private_key: Any) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return bytes(private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw))


def load_trusted_keys(value: str) -> list[bytes]:
    """``KCACHE_TRUSTED_KEYS``: comma- or newline-separated public-key files (``.pub`` as
    ``kcache keygen`` writes, several keys a file allowed, or PEM) and inline keys
    (``kcache-ed25519 <base64>`` or bare base64)."""
    keys: list[bytes] = []
    for item in (part.strip() for line in value.splitlines() for part in line.split(",")):
        if not item:
            continue
        try:
            keys += envelope.parse_public_keys(_text(item)) if os.path.isfile(item) else [envelope.parse_public_key(item)]
        except ValueError as exc:
            raise ValueError(f"KCACHE_TRUSTED_KEYS: {item[:60]!r} is neither a public-key file nor a public key: {exc}") from None
    if not keys:
        raise ValueError("KCACHE_TRUSTED_KEYS names no key")
    return keys


def generate_key_pair(comment: str) -> tuple[bytes, str, str]:
    """``(private key PEM, public key line, key id)`` of a new Ed25519 key pair."""
    require_cryptography()
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    public = public_key_bytes(private)
    return pem, envelope.format_public_key(public, comment), envelope.ed25519_key_id(public)

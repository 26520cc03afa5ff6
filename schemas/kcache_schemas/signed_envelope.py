"""The signed-entry envelope: how a producer vouches for an opaque cache entry, and how anyone
holding the right key checks it. Spelled once for the client (which signs and verifies) and the
service (which reads provenance and, where a namespace has registered producer keys, verifies).

FX-graph, AOTAutograd and autotune entries carry pickles and ``triton-module`` entries carry
shared objects: using one runs its producer's code. So a consumer that trusts a set of keys
refuses, before Inductor unpickles or Triton loads anything, an entry that is not signed by one
of them. Two schemes share the envelope:

* ``ed25519``: each producer signs with its own private key; consumers and the service hold only
  public keys, so whoever can verify cannot forge. Needs the ``cryptography`` package.
* ``hmac-sha256``: one shared secret signs and verifies (simple setups; Turborepo's
  ``x-artifact-tag``). The service cannot check it (it has no secret), only show it.

Layout, version 1 (integers big-endian)::

    MAGIC "KCSIG2\\n"  | u16 header length | header (JSON, ≤ MAX_HEADER_BYTES)
    | u16 signature length | signature | payload (the entry as the producer's cache made it)

The header (:class:`SignatureHeader`) names the scheme, the key id, the entry's layer and key, the
payload's size and sha256, and the :class:`~kcache_schemas.models.Provenance`. The signature is
over ``DOMAIN + header bytes`` exactly as stored (no canonical JSON needed); the payload is bound
through its hash, so checking costs one sha256 of the payload plus one signature check. A key id
is a short hash of the public key (of an HMAC-derived value for HMAC: never of the secret).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kcache_schemas.models import EntryKey, EntrySignature, Layer, Provenance, Sha256, SignatureAlg

MAGIC: Final = b"KCSIG2\n"
FORMAT_VERSION: Final = 1
MAX_HEADER_BYTES: Final = 16 * 1024
DOMAIN: Final = b"kcache-entry-signature-v1\x00"
SIGNATURE_SIZE: Final[Mapping[str, int]] = {"ed25519": 64, "hmac-sha256": 32}
_LEN = 2  # bytes of each length prefix

# The public key's text form (what ``kcache keygen`` writes to ``<name>.pub``, one per line):
# ``kcache-ed25519 <base64 of the 32 raw bytes> [comment]``.
PUBLIC_KEY_PREFIX: Final = "kcache-ed25519"
# DER SubjectPublicKeyInfo of an Ed25519 key is this prefix plus the 32 raw bytes (RFC 8410).
_ED25519_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
ED25519_KEY_SIZE: Final = 32

Reason = Literal["unsigned", "malformed", "mismatch", "untrusted_key", "bad_signature", "unavailable"]


class SignatureError(ValueError):
    """An entry that must not be used. ``reason`` says why, in a word a counter can carry:
    ``unsigned`` (no envelope), ``malformed`` (a damaged one), ``mismatch`` (signed for another
    layer or key), ``untrusted_key``, ``bad_signature`` (the signature or the payload hash does
    not check), ``unavailable`` (this process cannot check: ``cryptography`` missing)."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason


class SignatureHeader(BaseModel):
    # Unknown fields are ignored, not refused: they are signed all the same, and a newer
    # producer's entries must not read as damaged to an older consumer.
    model_config = ConfigDict(extra="ignore", frozen=True)

    version: Literal[1] = FORMAT_VERSION
    alg: SignatureAlg
    key_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    layer: Layer
    key: EntryKey
    payload_size: int = Field(ge=0)
    payload_sha256: Sha256
    provenance: Provenance

    def encode(self) -> bytes:
        raw = self.model_dump_json(exclude_none=True).encode()
        if len(raw) > MAX_HEADER_BYTES:
            raise ValueError(f"signature header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
        return raw


@dataclass(frozen=True)
class SignedEnvelope:
    """A parsed (not yet verified) envelope. The payload stays inside ``data`` until asked for:
    entries run to hundreds of MB."""

    header: SignatureHeader
    header_bytes: bytes
    signature: bytes
    payload_offset: int
    data: bytes = field(repr=False)

    @property
    def message(self) -> bytes:
        return DOMAIN + self.header_bytes

    def payload(self) -> bytes:
        return self.data[self.payload_offset :]

    def payload_matches(self) -> bool:
        view = memoryview(self.data)[self.payload_offset :]
        return len(view) == self.header.payload_size and hashlib.sha256(view).hexdigest() == self.header.payload_sha256

    def info(self, verified: bool = False) -> EntrySignature:
        h = self.header
        return EntrySignature(alg=h.alg, key_id=h.key_id, provenance=h.provenance, verified=verified)


def is_signed(data: bytes) -> bool:
    return data.startswith(MAGIC)


def payload_sha256(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def encode(header_bytes: bytes, signature: bytes, payload: bytes) -> bytes:
    """The envelope; ``header_bytes`` from :meth:`SignatureHeader.encode`, signed as
    ``DOMAIN + header_bytes``."""
    return b"".join((
        MAGIC, len(header_bytes).to_bytes(_LEN, "big"), header_bytes,
        len(signature).to_bytes(_LEN, "big"), signature, payload,
    ))


def parse(data: bytes) -> SignedEnvelope:
    """Read an envelope without verifying it. Raises :class:`SignatureError` (``unsigned`` or
    ``malformed``); reads at most ``MAX_HEADER_BYTES`` of header whatever the prefix claims."""
    if not data.startswith(MAGIC):
        raise SignatureError("unsigned", "entry is not signed")
    pos = len(MAGIC)
    size = int.from_bytes(data[pos : pos + _LEN], "big")
    pos += _LEN
    if size > MAX_HEADER_BYTES or len(data) < pos + size + _LEN:
        raise SignatureError("malformed", "signature header is truncated or too large")
    header_bytes = data[pos : pos + size]
    pos += size
    try:
        header = SignatureHeader.model_validate_json(header_bytes)
    except ValidationError as exc:
        raise SignatureError("malformed", f"signature header is invalid: {exc.errors()[0].get('msg', exc)}") from None
    sig_size = int.from_bytes(data[pos : pos + _LEN], "big")
    pos += _LEN
    if sig_size != SIGNATURE_SIZE[header.alg] or len(data) < pos + sig_size:
        raise SignatureError("malformed", f"{header.alg} signature has the wrong length")
    return SignedEnvelope(header, header_bytes, data[pos : pos + sig_size], pos + sig_size, data)


# ---- keys ----------------------------------------------------------------------------------


def ed25519_key_id(public_key: bytes) -> str:
    """A short, stable name for an Ed25519 public key (16 hex chars of a sha256)."""
    return hashlib.sha256(b"ed25519\x00" + public_key).hexdigest()[:16]


def hmac_key_id(secret: bytes) -> str:
    """A name for an HMAC secret that reveals nothing about it (a MAC, not a hash, of it)."""
    return hmac.new(secret, b"kcache-key-id", hashlib.sha256).hexdigest()[:16]


def hmac_signature(secret: bytes, message: bytes) -> bytes:
    return hmac.new(secret, message, hashlib.sha256).digest()


def format_public_key(public_key: bytes, comment: str = "") -> str:
    text = f"{PUBLIC_KEY_PREFIX} {base64.b64encode(public_key).decode('ascii')}"
    return f"{text} {comment}".rstrip()


def parse_public_key(text: str) -> bytes:
    """The 32 raw bytes of an Ed25519 public key given as ``kcache-ed25519 <base64> [comment]``,
    bare base64, or a PEM ``PUBLIC KEY`` (what ``openssl pkey -pubout`` writes). ValueError
    otherwise."""
    text = text.strip()
    if text.startswith("-----BEGIN PUBLIC KEY-----"):
        body = "".join(line for line in text.splitlines()[1:] if line and not line.startswith("-----"))
        der = _b64(body)
        if len(der) != len(_ED25519_SPKI_PREFIX) + ED25519_KEY_SIZE or not der.startswith(_ED25519_SPKI_PREFIX):
            raise ValueError("PEM public key is not an Ed25519 key")
        return der[len(_ED25519_SPKI_PREFIX) :]
    parts = text.split()
    if parts and parts[0] == PUBLIC_KEY_PREFIX:
        parts = parts[1:]
    if not parts:
        raise ValueError("empty public key")
    raw = _b64(parts[0])
    if len(raw) != ED25519_KEY_SIZE:
        raise ValueError(f"an Ed25519 public key is {ED25519_KEY_SIZE} bytes, this one {len(raw)}")
    return raw


def parse_public_keys(text: str) -> list[bytes]:
    """Every key in a public-key file or list: one PEM block, or one key per line (blank lines
    and ``#`` comments skipped)."""
    if text.lstrip().startswith("-----BEGIN"):
        return [parse_public_key(text)]
    return [parse_public_key(line) for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("not valid base64") from None


@dataclass(frozen=True)
class TrustedKeys:
    """The keys a verifier accepts, by key id: Ed25519 public keys and HMAC secrets."""

    ed25519: Mapping[str, bytes] = field(default_factory=dict)
    hmac: Mapping[str, bytes] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, public_keys: Iterable[bytes] = (), hmac_secrets: Iterable[bytes] = ()) -> TrustedKeys:
        return cls({ed25519_key_id(k): k for k in public_keys}, {hmac_key_id(s): s for s in hmac_secrets})

    def __bool__(self) -> bool:
        return bool(self.ed25519 or self.hmac)

    def key_ids(self) -> list[str]:
        return sorted([*self.ed25519, *self.hmac])


def _ed25519_valid(public_key: bytes, signature: bytes, message: bytes) -> bool:
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError:
        raise SignatureError("unavailable", "Ed25519 needs the cryptography package (pip install cryptography)") from None
    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def verify(data: bytes, layer: str, key: str, trusted: TrustedKeys) -> SignedEnvelope:
    """The envelope of an entry signed for ``layer``/``key`` by a trusted key, its payload intact;
    else :class:`SignatureError`."""
    env = parse(data)
    h = env.header
    if h.layer != layer or h.key != key:
        raise SignatureError("mismatch", f"entry was signed for {h.layer} {h.key[:80]!r}, not for this one")
    if h.alg == "ed25519":
        public_key = trusted.ed25519.get(h.key_id)
        if public_key is None:
            raise _untrusted(h)
        valid = _ed25519_valid(public_key, env.signature, env.message)
    else:
        secret = trusted.hmac.get(h.key_id)
        if secret is None:
            raise _untrusted(h)
        valid = hmac.compare_digest(env.signature, hmac_signature(secret, env.message))
    if not valid:
        raise SignatureError("bad_signature", f"signature by {h.alg} key {h.key_id} does not verify")
    if not env.payload_matches():
        raise SignatureError("bad_signature", "entry does not match what its signature covers")
    return env


def _untrusted(h: SignatureHeader) -> SignatureError:
    return SignatureError("untrusted_key", f"entry is signed by {h.alg} key {h.key_id}, which is not trusted here")

"""Signed entries with real Ed25519 keys (made by ``kcache keygen``): producers sign, consumers
trust a set of public keys and refuse the rest before anything is unpickled or loaded, the
service shows provenance and, where a namespace registers producer keys, refuses other signers.

Through the real runtime, a real service (uvicorn on loopback or the app in-process), real
Triton (host modules) and real Inductor (``torch.compile`` on the CPU, in fresh processes)."""

from __future__ import annotations

import json
import os
import pickle
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from fastapi.testclient import TestClient
from kcache.config import ClientConfig
from kcache.runtime import Runtime
from kcache.store.fingerprint import current
from kcache.transport.entry_signing import LEGACY_HMAC_MAGIC, EntrySigning, _legacy_mac
from kcache.transport.http import KcacheClient
from kcache_schemas import signed_envelope as envelope
from kcache_schemas.signed_envelope import SignatureError
from kcache_server.app import create_app
from kcache_server.settings import Settings
from pydantic import ValidationError

from kcache_testkit.pace import HANG_S

pytestmark = pytest.mark.torch

if TYPE_CHECKING:
    from live import LiveService

pytest_plugins = ["live"]

# The layers whose entries run code when used: pickles (FX graph, AOTAutograd, autotune results
# are JSON but Inductor trusts them into its compile) and shared objects (Triton's host modules).
LAYERS = ("fx-graph", "aot-autograd", "autotune", "triton-module")
KEYS = {
    "fx-graph": "pt2:fx-graph-v1::fsig{}:c1",
    "aot-autograd": "pt2:autograd-v1::asig{}:c1",
    "autotune": "pt2:autotune-v1::tsig{}:c1",
    "triton-module": "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567ABCDEFGHIJKLMNOPQRST:glibc2.36:sig{}.cpython-311-x86_64-linux-gnu.so",
}


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path
    key_id: str

    @property
    def public_line(self) -> str:
        return self.public.read_text().strip()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KeyPair]:
    """Two producers' key pairs, made the way users make them: ``kcache keygen``."""
    from kcache.cli.commands import main as cli

    root = tmp_path_factory.mktemp("keys")
    pairs = {}
    for name in ("a", "b"):
        assert cli(["keygen", "--out", str(root / name), "--comment", f"producer-{name}"]) == 0
        public = root / f"{name}.pub"
        pairs[name] = KeyPair(root / f"{name}.key", public, envelope.ed25519_key_id(envelope.parse_public_key(public.read_text())))
    return pairs


def runtime(url: str, tmp: Path, name: str, **options: Any) -> Runtime:
    # The test's producers and consumer are about signing, not deadlines: a loaded machine's service
    # answered an upload slower than the 2 s default.
    return Runtime(ClientConfig(url=url, local_dir=str(tmp / name), **{"read_timeout_s": HANG_S, **options}))


@pytest.fixture
def runtimes() -> Iterator[list[Runtime]]:
    made: list[Runtime] = []
    yield made
    for rt in made:
        rt.close()


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(keys: dict[str, KeyPair], capsys: pytest.CaptureFixture[str]) -> None:
    from kcache.cli.commands import main as cli

    a = keys["a"]
    assert stat.S_IMODE(a.private.stat().st_mode) == 0o600
    assert a.private.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert a.public_line.startswith("kcache-ed25519 ") and a.public_line.endswith("producer-a")
    assert keys["a"].key_id != keys["b"].key_id
    before = a.private.read_bytes()
    assert cli(["keygen", "--out", str(a.private.with_suffix(""))]) == 1
    assert "exists" in capsys.readouterr().err and a.private.read_bytes() == before


@pytest.mark.parametrize("layer", LAYERS)
def test_a_consumer_trusting_a_takes_as_entries_and_refuses_bs_and_unsigned_ones(
    layer: str, keys: dict[str, KeyPair], live_service: LiveService, tmp_path: Path, runtimes: list[Runtime]
) -> None:
    url = live_service.url
    payload = pickle.dumps({"layer": layer, "graph": list(range(1000))})
    key_a, key_b, key_unsigned = (KEYS[layer].format(n) for n in ("a", "b", "u"))
    producer_a = runtime(url, tmp_path, "pa", signing_private_key=str(keys["a"].private), run_id="ci-7")
    producer_b = runtime(url, tmp_path, "pb", signing_private_key=str(keys["b"].private))
    plain = runtime(url, tmp_path, "pu")
    consumer = runtime(url, tmp_path, "c", trusted_keys=str(keys["a"].public), mode="readonly")
    runtimes += [producer_a, producer_b, plain, consumer]

    producer_a.put_entry(layer, key_a, payload, 2.5, now=True)
    producer_b.put_entry(layer, key_b, payload, now=True)
    plain.put_entry(layer, key_unsigned, payload, now=True)
    assert [rt.stats.snapshot()[layer].puts for rt in (producer_a, producer_b, plain)] == [1, 1, 1]
    stored = KcacheClient(ClientConfig(url=url, read_timeout_s=HANG_S)).get_entry(layer, key_a)[0]
    assert stored.startswith(envelope.MAGIC) and stored.endswith(payload)

    assert consumer.get_entry(layer, key_a) == payload
    assert consumer.get_entry(layer, key_b) is None
    assert consumer.get_entry(layer, key_unsigned) is None
    counts = consumer.stats.snapshot()[layer]
    assert (counts.hits, counts.errors, counts.misses) == (1, 2, 0)
    assert counts.error_kinds == {"untrusted_key": 1, "unsigned": 1}
    # The post-install check names each refusal with its reason (stats, kcache stats, dashboard).
    assert consumer.stats.document().verification == {"refused": {f"{layer}: untrusted_key": 1, f"{layer}: unsigned": 1}}
    assert counts.saved_s == 2.5  # the producer's compile time, credited on the trusted hit
    # Refused entries never reach the local tier (a later offline start would refuse them again).
    assert consumer.local.get(layer, key_b) is None and consumer.local.get(layer, key_unsigned) is None

    # The producer trusts its own key; B's consumers (trusting B) take B's entry and refuse A's.
    assert producer_a.get_entry(layer, key_a) == payload
    consumer_b = runtime(url, tmp_path, "cb", trusted_keys=keys["b"].public_line, mode="readonly")
    runtimes.append(consumer_b)
    assert consumer_b.get_entry(layer, key_b) == payload and consumer_b.get_entry(layer, key_a) is None


def test_a_prefetched_entry_no_trusted_key_signed_is_dropped_and_the_service_asked(
    keys: dict[str, KeyPair], live_service: LiveService, tmp_path: Path, runtimes: list[Runtime]
) -> None:
    """The local tier (prefetch, ``kcache warm``) holds bytes as the service gave them; they are
    checked on use like bytes from the network."""
    layer, key, payload = "fx-graph", KEYS["fx-graph"].format("local"), b"trusted graph"
    producer_a = runtime(live_service.url, tmp_path, "pa", signing_private_key=str(keys["a"].private))
    forger = EntrySigning.from_config(ClientConfig(signing_private_key=str(keys["b"].private)))
    consumer = runtime(live_service.url, tmp_path, "c", trusted_keys=str(keys["a"].public), mode="readonly")
    runtimes += [producer_a, consumer]
    producer_a.put_entry(layer, key, payload, now=True)
    assert forger is not None
    consumer.local.put(layer, key, forger.seal(layer, key, b"forged graph"))

    assert consumer.get_entry(layer, key) == payload
    counts = consumer.stats.snapshot()[layer]
    assert counts.hits == 1 and counts.errors == 0
    local = consumer.local.get(layer, key)
    assert local is None or local.endswith(payload)  # the forged copy is gone (A's written off-thread)


def test_provenance_round_trips_and_any_change_to_a_signed_entry_is_refused(keys: dict[str, KeyPair]) -> None:
    signing = EntrySigning.from_config(ClientConfig(signing_private_key=str(keys["a"].private), run_id="train-2024-11-23"))
    assert signing is not None and signing.signer is not None and signing.signer.key_id == keys["a"].key_id
    layer, key, payload = "aot-autograd", "pt2:autograd-v1::prov:c1", os.urandom(4096)
    before = time.time()
    sealed = signing.seal(layer, key, payload)
    after = time.time()

    header = envelope.parse(sealed).header
    assert (header.alg, header.key_id, header.layer, header.key) == ("ed25519", keys["a"].key_id, layer, key)
    assert header.payload_size == len(payload) and header.payload_sha256 == envelope.payload_sha256(payload)
    prov = header.provenance
    assert prov.host == socket.gethostname() and prov.run_id == "train-2024-11-23"
    assert prov.environment == current().model_dump() and prov.kcache_version
    assert before - 1e-3 <= prov.created_at.timestamp() <= after + 1e-3  # when it was sealed, however slowly
    assert signing.open(layer, key, sealed) == payload

    def refused(data: bytes, layer: str = layer, key: str = key) -> str:
        with pytest.raises(SignatureError) as exc:
            signing.open(layer, key, data)
        return exc.value.reason

    start = len(envelope.MAGIC) + 2
    header_end = start + int.from_bytes(sealed[len(envelope.MAGIC) : start], "big")
    run_at = sealed.index(b"train-2024-11-23")
    assert refused(sealed[:run_at] + b"T" + sealed[run_at + 1 :]) == "bad_signature"  # provenance edited
    assert refused(sealed[:-1] + bytes([sealed[-1] ^ 1])) == "bad_signature"  # payload edited
    assert refused(sealed + b"\0") == "bad_signature"  # payload extended
    assert refused(sealed[: header_end + 2 + 10]) == "malformed"  # signature cut
    assert refused(sealed, key="pt2:autograd-v1::other:c1") == "mismatch"  # replayed under another key
    assert refused(sealed, layer="fx-graph") == "mismatch"
    assert refused(payload) == "unsigned"
    huge = envelope.MAGIC + (envelope.MAX_HEADER_BYTES + 1).to_bytes(2, "big") + b"{" * (envelope.MAX_HEADER_BYTES + 1)
    assert refused(huge) == "malformed"  # a header past the bound is not read
    assert refused(envelope.MAGIC + b"\x00\x05{bad}\x00\x00") == "malformed"
    # A header a newer producer extended still verifies (the extra field is signed, and ignored).
    newer = json.loads(sealed[start:header_end])
    newer["provenance"]["cluster"] = "west"
    newer_bytes = json.dumps(newer).encode()
    resigned = envelope.encode(newer_bytes, signing.signer.sign(envelope.DOMAIN + newer_bytes), payload)
    assert signing.open(layer, key, resigned) == payload


def test_public_keys_parse_from_every_form_users_have(keys: dict[str, KeyPair], tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_private_key,
    )

    private = load_pem_private_key(keys["a"].private.read_bytes(), password=None)
    raw = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    pem = private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
    line = keys["a"].public_line
    assert envelope.parse_public_key(line) == envelope.parse_public_key(line.split()[1]) == envelope.parse_public_key(pem) == raw
    both = tmp_path / "trusted.pub"
    both.write_text(f"# the fleet's producers\n{line}\n\n{keys['b'].public_line}\n")
    signing = EntrySigning.from_config(ClientConfig(trusted_keys=f"{both}"))
    assert signing is not None and signing.problem is None and signing.signer is None
    assert signing.trusted.key_ids() == sorted([keys["a"].key_id, keys["b"].key_id])
    pem_file = tmp_path / "a.pem"
    pem_file.write_text(pem)
    mixed = EntrySigning.from_config(ClientConfig(trusted_keys=f"{pem_file}, {keys['b'].public_line}"))
    assert mixed is not None and mixed.trusted.key_ids() == signing.trusted.key_ids()
    from cryptography.hazmat.primitives.serialization import BestAvailableEncryption, PrivateFormat

    encrypted = tmp_path / "encrypted.key"  # a passphrase kcache cannot type in
    encrypted.write_bytes(private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(b"passphrase")))
    unusable = [{"trusted_keys": bad} for bad in ("kcache-ed25519 not-base64!", "kcache-ed25519 " + "QUJD" * 4, str(tmp_path / "missing.pub"))]
    unusable += [{"signing_private_key": str(encrypted)}, {"signing_private_key": str(tmp_path / "missing.key")}]
    for options in unusable:
        broken = EntrySigning.from_config(ClientConfig(**options))
        assert broken is not None and broken.problem is not None and not broken.trusted, options
        with pytest.raises(SignatureError) as exc:  # configured but unusable: nothing gets through
            broken.open("fx-graph", "k", b"anything")
        assert exc.value.reason == "unavailable"


def test_hmac_still_signs_now_with_provenance_and_reads_kcache_01_entries(
    live_service: LiveService, tmp_path: Path, runtimes: list[Runtime]
) -> None:
    url, layer = live_service.url, "autotune"
    secret = "a-shared-hmac-secret-of-the-team"
    producer = runtime(url, tmp_path, "p", signing_key=secret, run_id="hmac-run")
    consumer = runtime(url, tmp_path, "c", signing_key=secret, mode="readonly")
    outsider = runtime(url, tmp_path, "o", signing_key="another-secret-entirely", mode="readonly")
    unconfigured = runtime(url, tmp_path, "u", mode="readonly")
    runtimes += [producer, consumer, outsider, unconfigured]
    payload = b'{"triton.Config": {"XBLOCK": 128}, "time_taken_ms": 9}'
    producer.put_entry(layer, "pt2:autotune-v1::h1:c1", payload, now=True)
    stored = KcacheClient(ClientConfig(url=url, read_timeout_s=HANG_S)).get_entry(layer, "pt2:autotune-v1::h1:c1")[0]
    header = envelope.parse(stored).header
    assert header.alg == "hmac-sha256" and header.provenance.run_id == "hmac-run"
    assert secret.encode() not in stored and header.key_id == envelope.hmac_key_id(secret.encode())

    assert consumer.get_entry(layer, "pt2:autotune-v1::h1:c1") == payload
    assert outsider.get_entry(layer, "pt2:autotune-v1::h1:c1") is None
    assert outsider.stats.snapshot()[layer].error_kinds == {"untrusted_key": 1}
    # A consumer that verifies nothing unwraps signed entries (producers may sign first).
    assert unconfigured.get_entry(layer, "pt2:autotune-v1::h1:c1") == payload

    # Entries kcache 0.1 stored (write-once: they stay) keep verifying with the same secret.
    legacy_key = "pt2:autotune-v1::legacy:c1"
    legacy = LEGACY_HMAC_MAGIC + _legacy_mac(secret.encode(), layer, legacy_key, payload) + payload
    KcacheClient(ClientConfig(url=url, read_timeout_s=HANG_S)).put_entry(layer, legacy_key, legacy)
    assert consumer.get_entry(layer, legacy_key) == payload
    assert outsider.get_entry(layer, legacy_key) is None


def test_a_process_that_only_verifies_uploads_no_entries(keys: dict[str, KeyPair], live_service: LiveService, tmp_path: Path, runtimes: list[Runtime]) -> None:
    """It cannot sign; an unsigned upload would only occupy a write-once key (its consumers,
    and every other, refuse it)."""
    rt = runtime(live_service.url, tmp_path, "v", trusted_keys=str(keys["a"].public))
    runtimes.append(rt)
    rt.put_entry("fx-graph", KEYS["fx-graph"].format("verify-only"), b"graph", now=True)
    assert "fx-graph" not in rt.stats.snapshot()
    assert httpx.head(f"{live_service.url}/v1/default/entries/fx-graph/{KEYS['fx-graph'].format('verify-only')}", timeout=HANG_S).status_code == 404


# ---- the service ----------------------------------------------------------------------------------


def producer_keys(*pairs: KeyPair, namespace: str = "secure") -> str:
    return json.dumps({namespace: [p.public_line for p in pairs]})


def test_a_namespace_with_registered_keys_takes_only_their_signatures(keys: dict[str, KeyPair], tmp_path: Path) -> None:
    a = EntrySigning.from_config(ClientConfig(signing_private_key=str(keys["a"].private), run_id="ci-9"))
    b = EntrySigning.from_config(ClientConfig(signing_private_key=str(keys["b"].private)))
    assert a is not None and b is not None
    layer, key, payload = "fx-graph", "pt2:fx-graph-v1::svc:c1", pickle.dumps(["graph"])
    url = f"/v1/secure/entries/{layer}/{key}"
    with TestClient(create_app(Settings(data_dir=tmp_path / "svc", producer_keys=producer_keys(keys["a"])))) as c:
        for body, reason in ((b.seal(layer, key, payload), "untrusted_key"), (payload, "unsigned"),
                             (a.seal(layer, "pt2:fx-graph-v1::elsewhere:c1", payload), "mismatch"),
                             (a.seal(layer, key, payload)[:-1], "bad_signature")):
            r = c.put(url, content=body)
            assert r.status_code == 403, r.text
            error = r.json()["error"]
            assert error["code"] == "untrusted_signature" and error["detail"]["reason"] == reason
            assert keys["a"].key_id in error["message"] and error["detail"]["registered_key_ids"] == [keys["a"].key_id]
        assert c.head(url).status_code == 404  # nothing stored

        put = c.put(url, content=a.seal(layer, key, payload))
        assert put.status_code == 201, put.text
        info = c.get(f"{url}/info").json()
        sig = info["signature"]
        assert sig["alg"] == "ed25519" and sig["key_id"] == keys["a"].key_id and sig["verified"] is True
        assert sig["provenance"]["run_id"] == "ci-9" and sig["provenance"]["host"] == socket.gethostname()
        assert sig["provenance"]["environment"] == current().model_dump()
        # Another namespace registers nothing: opaque as ever, a signature only read and shown.
        other = c.put(f"/v1/default/entries/{layer}/{key}", content=b.seal(layer, key, payload))
        assert other.status_code == 201 and other.json()["signature"]["verified"] is False
        assert other.json()["signature"]["key_id"] == keys["b"].key_id
        assert c.put(f"/v1/default/entries/{layer}/pt2:x:c1", content=payload).json()["signature"] is None


def test_registering_keys_lets_signed_uploads_replace_what_was_stored_before(keys: dict[str, KeyPair], tmp_path: Path) -> None:
    """Entries are write-once: without this, an entry stored before the keys were registered (or
    signed by a key since retired) would hold its key forever, and every consumer recompile."""
    a = EntrySigning.from_config(ClientConfig(signing_private_key=str(keys["a"].private)))
    b = EntrySigning.from_config(ClientConfig(signing_private_key=str(keys["b"].private)))
    assert a is not None and b is not None
    layer, key = "aot-autograd", "pt2:autograd-v1::rotate:c1"
    url = f"/v1/secure/entries/{layer}/{key}"
    data = tmp_path / "svc"
    with TestClient(create_app(Settings(data_dir=data))) as c:
        assert c.put(url, content=b"unsigned, from before").status_code == 201
    with TestClient(create_app(Settings(data_dir=data, producer_keys=producer_keys(keys["b"])))) as c:
        assert c.put(url, content=b.seal(layer, key, b"B's")).status_code == 201
        assert c.get(url).content.endswith(b"B's")
        assert c.put(url, content=b.seal(layer, key, b"B's again")).status_code == 409  # a trusted entry stands
    # B retired, A registered: A's upload replaces B's entry.
    with TestClient(create_app(Settings(data_dir=data, producer_keys=producer_keys(keys["a"])))) as c:
        assert c.put(url, content=a.seal(layer, key, b"A's")).status_code == 201
        assert c.get(url).content.endswith(b"A's") and c.get(f"{url}/info").json()["signature"]["key_id"] == keys["a"].key_id


def test_producer_keys_settings_are_checked_at_start_up(keys: dict[str, KeyPair], tmp_path: Path) -> None:
    keys_file = tmp_path / "producer-keys.json"
    keys_file.write_text(json.dumps({"*": [keys["a"].public_line], "team-b": [keys["b"].public_line]}))
    settings = Settings(data_dir=tmp_path, producer_keys_file=keys_file)
    from kcache_server.producer_keys import registered_keys

    assert registered_keys(settings.registered_keys, "team-b").key_ids() == sorted([keys["a"].key_id, keys["b"].key_id])
    assert registered_keys(settings.registered_keys, "anything").key_ids() == [keys["a"].key_id]
    for bad in ({"secure": ["kcache-ed25519 nope"]}, {"Bad NS": [keys["a"].public_line]}, {"secure": []}, ["not", "an", "object"]):
        with pytest.raises(ValidationError):
            Settings(data_dir=tmp_path, producer_keys=json.dumps(bad))


def test_an_upload_the_namespace_refuses_is_counted_not_raised(keys: dict[str, KeyPair], tmp_path: Path, runtimes: list[Runtime]) -> None:
    from live import LiveService

    with LiveService(tmp_path / "svc", producer_keys=producer_keys(keys["a"])) as svc:
        signed_b = runtime(svc.url, tmp_path, "b", namespace="secure", signing_private_key=str(keys["b"].private))
        signed_a = runtime(svc.url, tmp_path, "a", namespace="secure", signing_private_key=str(keys["a"].private))
        runtimes += [signed_b, signed_a]
        signed_b.put_entry("triton-module", KEYS["triton-module"].format("svc"), b"\x7fELF...", now=True)
        signed_a.put_entry("triton-module", KEYS["triton-module"].format("svc"), b"\x7fELF...", now=True)
        assert signed_b.stats.snapshot()["triton-module"].error_kinds == {"SignatureRefused": 1}
        assert signed_a.stats.snapshot()["triton-module"].puts == 1


# ---- kcache inspect --entry -----------------------------------------------------------------------


def test_inspect_entry_shows_the_signer_and_provenance_and_whether_this_machine_accepts_it(
    keys: dict[str, KeyPair], live_service: LiveService, tmp_path: Path, runtimes: list[Runtime],
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kcache.cli.commands import main as cli

    layer, key = "fx-graph", KEYS["fx-graph"].format("inspect")
    producer = runtime(live_service.url, tmp_path, "p", signing_private_key=str(keys["a"].private), run_id="nightly-42")
    runtimes.append(producer)
    producer.put_entry(layer, key, b"graph", now=True)

    monkeypatch.setenv("KCACHE_TRUSTED_KEYS", str(keys["a"].public))
    assert cli(["inspect", "--entry", layer, key, "--url", live_service.url]) == 0
    out = capsys.readouterr().out
    assert f"ed25519 key {keys['a'].key_id}" in out and "nightly-42" in out and socket.gethostname() in out
    assert f"torch {current().torch}" in out and "accepted" in out

    monkeypatch.setenv("KCACHE_TRUSTED_KEYS", str(keys["b"].public))
    assert cli(["inspect", "--entry", layer, key, "--url", live_service.url, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["accepted"] is False and "untrusted_key" in report["verdict"]
    assert report["signature"]["provenance"]["run_id"] == "nightly-42" and report["info"]["signature"]["verified"] is False


# ---- kernel packs -------------------------------------------------------------------------------


def test_a_kernel_pack_carrying_a_host_module_is_never_emitted(real_kernel_dirs: list[Path], tmp_path: Path) -> None:
    """Packs are not signed: they carry device code only. A shared object in one would be loaded
    by Triton as a host module (a pack keyed like a host module's dir), bypassing the signed
    ``triton-module`` layer."""
    from kcache.store.emitter import emit_files, emit_pack
    from kcache_schemas import PackError
    from kcache_schemas.pack import build_pack, manifest_for_files, read_kernel_dir

    src = real_kernel_dirs[0]
    files = read_kernel_dir(src)
    module = "cuda_utils.cpython-311-x86_64-linux-gnu.so"
    files[module] = b"\x7fELF" + os.urandom(64)
    group_name = next(n for n in files if n.startswith("__grp__"))
    group = json.loads(files[group_name])
    group["child_paths"][module] = "[REPLACE]/" + module
    files[group_name] = json.dumps(group).encode()
    manifest = manifest_for_files(src.name, files)
    with pytest.raises(PackError, match="host module"):
        emit_files(tmp_path / "triton", manifest, files, check_target=False)
    with pytest.raises(PackError):
        emit_pack(tmp_path / "triton", build_pack(manifest, files), check_target=False)
    assert not (tmp_path / "triton" / src.name).exists()


# ---- end to end: real Triton host modules, real Inductor -------------------------------------------


@pytest.mark.slow
def test_triton_loads_only_host_modules_a_trusted_key_signed(keys: dict[str, KeyPair], live_service: LiveService, tmp_path: Path) -> None:
    from test_fleet import HOST_MODULE_JOB, HOST_MODULE_SRC, run_job

    src = HOST_MODULE_SRC.replace("4242", "4444")  # a module of its own: its own key

    def node(name: str, mode: str, **env: str) -> Any:
        return run_job(HOST_MODULE_JOB, mode, KCACHE_URL=live_service.url, TRITON_CACHE_DIR=str(tmp_path / name / "triton"),
                       KCACHE_LOCAL_DIR=str(tmp_path / name / "local"), PROBE_SRC=src, **env)

    producer = node("a", "", KCACHE_SIGNING_PRIVATE_KEY=str(keys["a"].private))
    assert producer["marker"] == 4444 and producer["stats"]["puts"] == 1
    # Trusting only B: A's module is refused before Triton could load it; Triton builds its own.
    distrusting = node("b", "", KCACHE_TRUSTED_KEYS=str(keys["b"].public))
    assert distrusting["marker"] == 4444 and distrusting["stats"]["hits"] == 0
    assert distrusting["stats"]["error_kinds"] == {"untrusted_key": 1}
    # Trusting A: loaded from the service, the C compiler never called (it would raise).
    trusting = node("c", "no-compiler", KCACHE_TRUSTED_KEYS=str(keys["a"].public))
    assert trusting["marker"] == 4444 and trusting["stats"]["hits"] == 1 and trusting["stats"]["errors"] == 0


class _Poison:
    """Unpickling this creates a directory: the stand-in for the code a forged graph would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (str(self.marker),)


@pytest.mark.slow
def test_inductor_recompiles_rather_than_unpickle_a_graph_no_trusted_key_signed(keys: dict[str, KeyPair], live_service: LiveService, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    import base64

    from kcache.store import fx_graph_envelope
    from test_fleet import run_node

    url = live_service.url
    a_public = str(keys["a"].public)
    lean = {"N_KERNELS": "1"}  # the job's Triton kernels are not what this test is about
    # A trusted producer compiles and uploads A-signed entries, with its provenance.
    produced = run_node(tmp_path, "producer", url, KCACHE_SIGNING_PRIVATE_KEY=str(keys["a"].private),
                        KCACHE_WORKLOAD="signed", KCACHE_RUN_ID="ci-signed-1", **lean)
    assert produced["stats"]["fx-graph"]["puts"] == 1 and produced["stats"]["aot-autograd"]["puts"] == 1
    client = KcacheClient(ClientConfig(url=url, read_timeout_s=HANG_S))
    view = client.get_json("/v1/default/workloads/signed")
    fx_key = next(e["key"] for e in view["entries"] if e["layer"] == "fx-graph")
    stored = client.get_entry("fx-graph", fx_key)[0]
    signed = envelope.parse(stored)
    assert signed.header.key_id == keys["a"].key_id and signed.header.provenance.run_id == "ci-signed-1"
    assert signed.payload().startswith(fx_graph_envelope.MAGIC)  # kcache's raw-pickle FX envelope inside

    # A consumer trusting A: remote FX-graph and AOTAutograd hits, unpickled straight from the envelope.
    trusting = run_node(tmp_path, "trusting", url, KCACHE_TRUSTED_KEYS=a_public, FORBID_FX_GRAPH_JSON="1", **lean)
    assert trusting["fx"].get("fxgraph_cache_hit") == 1 and not trusting["fx"].get("fxgraph_cache_miss")
    assert trusting["aot"].get("autograd_cache_hit") == 1
    assert trusting["stats"]["fx-graph"]["errors"] == 0 and trusting["out"] == produced["out"]

    # In another namespace B (a write token and a key of its own, not trusted) stored, under the
    # same key, a graph whose pickle runs code. A consumer trusting A must recompile, not unpickle.
    marker = tmp_path / "poison-ran"
    poison = pickle.dumps(_Poison(marker))
    pickle.loads(poison)  # the poison works: unpickling it runs its code
    assert marker.is_dir()
    marker.rmdir()
    inductor_json = json.dumps({"data": base64.b64encode(poison).decode(), "time_taken_ms": 5}).encode()
    forger = EntrySigning.from_config(ClientConfig(signing_private_key=str(keys["b"].private)))
    assert forger is not None
    poisoned = forger.seal("fx-graph", fx_key, fx_graph_envelope.encode(inductor_json) or b"")
    KcacheClient(ClientConfig(url=url, namespace="poisoned", read_timeout_s=HANG_S)).put_entry("fx-graph", fx_key, poisoned)
    victim = run_node(tmp_path, "victim", url, KCACHE_NAMESPACE="poisoned", KCACHE_TRUSTED_KEYS=a_public, **lean)
    assert not marker.exists()
    assert victim["fx"].get("fxgraph_cache_miss") == 1 and not victim["fx"].get("fxgraph_cache_hit")
    assert victim["stats"]["fx-graph"]["error_kinds"] == {"untrusted_key": 1}
    assert victim["out"] == produced["out"]

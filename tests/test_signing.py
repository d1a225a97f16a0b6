"""Artifact signing: the Ed25519 implementation, key files, the signature section, tamper detection."""
from __future__ import annotations

import hashlib
import inspect
import os
import shutil
import statistics
import struct
import zlib
import subprocess
import time

import numpy as np
import pytest

import minirt
from minirt.builder.writer import layout_sections, sign_artifact
from minirt.format import ed25519
from minirt.format import schema as S
from minirt.format.signature import fingerprint
from minirt.format import keys
from tests.format.util import fix_section_crcs, minimal_writer, section_entries, split

# --- RFC 8032 section 7.1 test vectors (public test data) -------------------------------------

_TEST_1024_MESSAGE = (
    "08b8b2b733424243760fe426a4b54908632110a66c2f6591eabd3345e3e4eb98fa6e264bf09efe12ee50f8f54e9f77b1"
    "e355f6c50544e23fb1433ddf73be84d879de7c0046dc4996d9e773f4bc9efe5738829adb26c81b37c93a1b270b20329d"
    "658675fc6ea534e0810a4432826bf58c941efb65d57a338bbd2e26640f89ffbc1a858efcb8550ee3a5e1998bd177e93a"
    "7363c344fe6b199ee5d02e82d522c4feba15452f80288a821a579116ec6dad2b3b310da903401aa62100ab5d1a36553e"
    "06203b33890cc9b832f79ef80560ccb9a39ce767967ed628c6ad573cb116dbefefd75499da96bd68a8a97b928a8bbc10"
    "3b6621fcde2beca1231d206be6cd9ec7aff6f6c94fcd7204ed3455c68c83f4a41da4af2b74ef5c53f1d8ac70bdcb7ed1"
    "85ce81bd84359d44254d95629e9855a94a7c1958d1f8ada5d0532ed8a5aa3fb2d17ba70eb6248e594e1a2297acbbb39d"
    "502f1a8c6eb6f1ce22b3de1a1f40cc24554119a831a9aad6079cad88425de6bde1a9187ebb6092cf67bf2b13fd65f270"
    "88d78b7e883c8759d2c4f5c65adb7553878ad575f9fad878e80a0c9ba63bcbcc2732e69485bbc9c90bfbd62481d9089b"
    "eccf80cfe2df16a2cf65bd92dd597b0707e0917af48bbb75fed413d238f5555a7a569d80c3414a8d0859dc65a46128ba"
    "b27af87a71314f318c782b23ebfe808b82b0ce26401d2e22f04d83d1255dc51addd3b75a2b1ae0784504df543af8969b"
    "e3ea7082ff7fc9888c144da2af58429ec96031dbcad3dad9af0dcbaaaf268cb8fcffead94f3c7ca495e056a9b47acdb7"
    "51fb73e666c6c655ade8297297d07ad1ba5e43f1bca32301651339e22904cc8c42f58c30c04aafdb038dda0847dd988d"
    "cda6f3bfd15c4b4c4525004aa06eeff8ca61783aacec57fb3d1f92b0fe2fd1a85f6724517b65e614ad6808d6f6ee34df"
    "f7310fdc82aebfd904b01e1dc54b2927094b2db68d6f903b68401adebf5a7e08d78ff4ef5d63653a65040cf9bfd4aca7"
    "984a74d37145986780fc0b16ac451649de6188a7dbdf191f64b5fc5e2ab47b57f7f7276cd419c17a3ca8e1b939ae49e4"
    "88acba6b965610b5480109c8b17b80e1b7b750dfc7598d5d5011fd2dcc5600a32ef5b52a1ecc820e308aa342721aac09"
    "43bf6686b64b2579376504ccc493d97e6aed3fb0f9cd71a43dd497f01f17c0e2cb3797aa2a2f256656168e6c496afc5f"
    "b93246f6b1116398a346f1a641f3b041e989f7914f90cc2c7fff357876e506b50d334ba77c225bc307ba537152f3f161"
    "0e4eafe595f6d9d90d11faa933a15ef1369546868a7f3a45a96768d40fd9d03412c091c6315cf4fde7cb68606937380d"
    "b2eaaa707b4c4185c32eddcdd306705e4dc1ffc872eeee475a64dfac86aba41c0618983f8741c5ef68d3a101e8a3b8ca"
    "c60c905c15fc910840b94c00a0b9d0"
)

RFC8032_VECTORS = [
    (
        "TEST 1",
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        "",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    ),
    (
        "TEST 2",
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        "72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
    (
        "TEST 3",
        "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
        "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
        "af82",
        "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
    ),
    (
        "TEST 1024",
        "f5e5767cf153319517630f226876b86c8160cc583bc013744c6bf255f5cc0ee5",
        "278117fc144c72340f67d0f2316e8386ceffbf2b2428c9c51fef7c597f1d426e",
        _TEST_1024_MESSAGE,
        "0aab4c900501b3e24d7cdf4663326a3a87df5e4843b2cbdb67cbf6e460fec350aa5371b1508f9f4528ecea23c436d94b5e8fcd4f681e30a6ac00a9704a188a03",
    ),
    (
        "TEST SHA(abc)",
        "833fe62409237b9d62ec77587520911e9a759cec1d19755b7da901b96dca3d42",
        "ec172b93ad5e563bf4932c70e1245034c35467ef2efd4d64ebf819683467e2bf",
        hashlib.sha512(b"abc").hexdigest(),
        "dc2a4459e7369633a52b1bf277839a00201009a3efbf3ecb69bea2186c26b58909351fc9ac90b3ecfdfbc7c66431e0303dca179c138ac17ad9bef1177331a704",
    ),
]


@pytest.mark.parametrize("name,seed,pub,msg,sig", RFC8032_VECTORS, ids=[v[0] for v in RFC8032_VECTORS])
def test_rfc8032_vectors(name, seed, pub, msg, sig):
    seed, pub, msg, sig = (bytes.fromhex(v) for v in (seed, pub, msg, sig))
    if name == "TEST 1024":
        assert len(msg) == 1023
    assert ed25519.public_key(seed) == pub
    assert ed25519.sign(seed, msg) == sig
    assert ed25519.verify(pub, msg, sig)
    assert not ed25519.verify(pub, msg + b"\x00", sig)
    for i in (0, 31, 32, 63):  # R and S, both ends
        bad = bytearray(sig)
        bad[i] ^= 0x01
        assert not ed25519.verify(pub, msg, bytes(bad))
    other = bytes.fromhex(RFC8032_VECTORS[0][2] if name != "TEST 1" else RFC8032_VECTORS[1][2])
    assert not ed25519.verify(other, msg, sig)


def test_verify_rejects_malformed_inputs_without_raising():
    _, seed, pub, msg, sig = (bytes.fromhex(v) if i else v for i, v in enumerate(RFC8032_VECTORS[1]))
    s = int.from_bytes(sig[32:], "little")
    assert not ed25519.verify(pub, msg, sig[:32] + (s + ed25519.L).to_bytes(32, "little"))  # non-canonical S
    assert not ed25519.verify(pub, msg, sig[:63])
    assert not ed25519.verify(pub[:31], msg, sig)
    assert not ed25519.verify(b"\xff" * 32, msg, sig)  # y >= p: not a point encoding
    assert not ed25519.verify(pub, msg, b"\xff" * 32 + sig[32:])
    # y = 2 has no x on the curve
    assert not ed25519.verify((2).to_bytes(32, "little"), msg, sig)


def test_random_round_trips():
    rng = np.random.default_rng(5)
    for n in range(20):
        seed = rng.bytes(32)
        msg = rng.bytes(int(rng.integers(0, 300)))
        pub = ed25519.public_key(seed)
        sig = ed25519.sign(seed, msg)
        assert ed25519.verify(pub, msg, sig)
        assert not ed25519.verify(pub, msg + b"x", sig)


def _openssl_sign(seed: bytes, msg: bytes, tmp_path) -> bytes | None:
    der = bytes.fromhex("302e020100300506032b657004220420") + seed  # PKCS#8 wrapping of a raw Ed25519 seed
    key, data, out = tmp_path / "k.der", tmp_path / "m.bin", tmp_path / "s.bin"
    key.write_bytes(der)
    data.write_bytes(msg)
    proc = subprocess.run(
        ["openssl", "pkeyutl", "-sign", "-rawin", "-keyform", "DER", "-inkey", str(key), "-in", str(data), "-out", str(out)],
        capture_output=True,
    )
    return out.read_bytes() if proc.returncode == 0 else None


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl not installed")
def test_cross_check_against_openssl(tmp_path):
    """Ed25519 is deterministic: an independent implementation must produce the same bytes."""
    rng = np.random.default_rng(11)
    # (openssl 3.0 refuses an empty message file, so TEST 1 is left to the RFC vector test)
    vectors = [(bytes.fromhex(v[1]), bytes.fromhex(v[3])) for v in RFC8032_VECTORS if v[3]]
    vectors += [(rng.bytes(32), rng.bytes(int(rng.integers(1, 2000)))) for _ in range(12)]
    for seed, msg in vectors:
        theirs = _openssl_sign(seed, msg, tmp_path)
        if theirs is None:
            pytest.skip("this openssl cannot sign raw Ed25519 messages")
        assert ed25519.sign(seed, msg) == theirs
        assert ed25519.verify(ed25519.public_key(seed), msg, theirs)


def test_cross_check_against_cryptography():
    crypto = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ed25519")
    from cryptography.hazmat.primitives import serialization

    rng = np.random.default_rng(12)
    for _ in range(12):
        seed, msg = rng.bytes(32), rng.bytes(int(rng.integers(0, 2000)))
        key = crypto.Ed25519PrivateKey.from_private_bytes(seed)
        pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        assert ed25519.public_key(seed) == pub
        assert ed25519.sign(seed, msg) == key.sign(msg)


def test_signing_uses_cryptography_when_installed(monkeypatch):
    """The builder signs through the maintained, constant-time implementation (the builder extra installs
    it); minirt's own pure-Python signer, the fallback, gives the same bytes (Ed25519 is deterministic)."""
    pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ed25519")
    from minirt.format import signature

    calls = []
    monkeypatch.setattr(ed25519, "sign", lambda seed, msg: calls.append(1) or b"\0" * 64)
    seed, msg = bytes(range(32)), b"MINIRT-SIG-V1" + bytes(32)
    by_cryptography = signature.sign(seed, msg)
    assert calls == [] and ed25519.verify(ed25519.public_key(seed), msg, by_cryptography)
    monkeypatch.undo()
    assert by_cryptography == ed25519.sign(seed, msg)


def test_verify_is_fast():
    seed, pub = bytes.fromhex(RFC8032_VECTORS[3][1]), bytes.fromhex(RFC8032_VECTORS[3][2])
    msg = S.SIGNATURE_TAGS[1] + bytes(32)
    sig = ed25519.sign(seed, msg)
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        assert ed25519.verify(pub, msg, sig)
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 0.050, times


# --- keys ----------------------------------------------------------------------------------------


def test_keygen_files(tmp_path):
    key_path, pub_path, pub = keys.write_keypair(tmp_path / "release")
    assert key_path.endswith("release.key") and pub_path.endswith("release.pub")
    key_text = open(key_path).read()
    pub_text = open(pub_path).read()
    assert len(key_text) == 65 and key_text.endswith("\n") and len(pub_text) == 65
    seed = keys.load_signing_key(key_path)
    assert ed25519.public_key(seed) == pub == bytes.fromhex(pub_text.strip())
    if os.name == "posix":
        assert os.stat(key_path).st_mode & 0o777 == 0o600
    with pytest.raises(minirt.InvalidArgument, match="already exists"):
        keys.write_keypair(tmp_path / "release")
    assert keys.load_signing_key(key_path) == seed  # untouched by the refused call
    keys.write_keypair(tmp_path / "release", overwrite=True)
    assert keys.load_signing_key(key_path) != seed


def test_public_key_forms(tmp_path):
    pub = ed25519.public_key(bytes(32))
    (tmp_path / "a.pub").write_text(pub.hex() + "\n")
    (tmp_path / "raw.pub").write_bytes(pub)
    for form in (pub, bytearray(pub), pub.hex(), pub.hex().upper(), pub.hex().encode(), str(tmp_path / "a.pub"),
                 tmp_path / "a.pub", tmp_path / "raw.pub"):
        assert keys.load_public_key(form) == pub, form
    for bad, match in ((b"short", "public key"), ("nothex" * 8, "no such public key file"),
                       (tmp_path / "missing.pub", "no such"), (12, "must be 32 bytes"),
                       (b"\xff" * 32, "not a valid Ed25519 public key")):
        with pytest.raises(minirt.InvalidArgument, match=match):
            keys.load_public_key(bad)
    (tmp_path / "junk.pub").write_text("hello\n")
    with pytest.raises(minirt.InvalidArgument, match="64 hex digits"):
        keys.load_public_key(tmp_path / "junk.pub")


def test_fingerprint_is_short_and_stable():
    pub = bytes.fromhex(RFC8032_VECTORS[0][2])
    assert fingerprint(pub) == "ed25519:" + hashlib.sha256(pub).hexdigest()[:16]


# --- the signature section -------------------------------------------------------------------------

SEED_A = bytes(range(32))
SEED_B = bytes(range(1, 33))
PUB_A = ed25519.public_key(SEED_A)
PUB_B = ed25519.public_key(SEED_B)
FEED = {"x": np.ones((2, 3), np.float32)}


def _signed(seed: bytes = SEED_A) -> bytes:
    return minimal_writer().to_bytes(sign_key=seed)


def _check_runs(data: bytes, **kw) -> None:
    sess = minirt.Session(data, **kw)
    np.testing.assert_array_equal(sess.run(None, FEED)[0], np.arange(6, dtype=np.float32).reshape(2, 3) + 1)


def test_signature_section_layout():
    data = _signed()
    entries = section_entries(data)
    kind, flags, off, length, _, _ = entries[-1]
    assert (kind, flags, length) == (S.SECTION_SIGNATURE, S.SECTION_FLAG_OPTIONAL, 100)
    alg, pub, sig = struct.unpack_from("<I32s64s", data, off)
    assert alg == 1 and pub == PUB_A
    # The message, computed from docs/format.md alone.
    h = hashlib.sha256()
    for k, f, o, n, _, _ in entries[:-1]:
        h.update(struct.pack("<IIQ", k, f, n) + data[o : o + n])
    assert ed25519.verify(PUB_A, b"MINIRT-SIG-V1" + h.digest(), sig)
    # Signing changes nothing else: same sections, same bytes, plus the signature.
    unsigned = minimal_writer().to_bytes()
    assert split(data)[:-1] == split(unsigned)
    assert minirt.Session(data).artifact.signer == (1, PUB_A)
    assert minirt.Session(unsigned).artifact.signer is None


def test_compressed_artifact_signs_its_stored_sections():
    """A version-2 file (its graph stored as a zlib stream): the message is tagged MINIRT-SIG-V2 and covers
    the stored (compressed) bytes and flags; re-signing keeps the compressed sections as they are."""
    w = minimal_writer()
    g = w.graphs[0]  # values declared and never used (allowed): a graphs section past 4 KiB
    for i in range(200):
        g.value(f"a_long_value_name_that_compresses_{i:04d}", 1, (2, 3))
    data = w.to_bytes(sign_key=SEED_A)
    entries = section_entries(data)
    graphs = next(e for e in entries if e[0] == S.SECTION_GRAPHS)
    assert struct.unpack_from("<I", data, 8)[0] == 2 and graphs[1] & S.SECTION_FLAG_DEFLATE
    _, _, off, _, _, _ = entries[-1]
    _, pub, sig = struct.unpack_from("<I32s64s", data, off)
    h = hashlib.sha256()
    for k, f, o, n, _, _ in entries[:-1]:
        h.update(struct.pack("<IIQ", k, f, n) + data[o : o + n])
    assert pub == PUB_A and ed25519.verify(PUB_A, b"MINIRT-SIG-V2" + h.digest(), sig)
    _check_runs(data, verify_key=PUB_A)
    resigned = sign_artifact(data, SEED_B)
    assert split(resigned)[:-1] == split(data)[:-1]
    _check_runs(resigned, verify_key=PUB_B)
    parts = split(data)  # the flags are signed: the graphs stored uncompressed break the signature
    i = [k for k, _, _ in parts].index(S.SECTION_GRAPHS)
    k, f, p = parts[i]
    parts[i] = (k, f & ~S.SECTION_FLAG_DEFLATE, zlib.decompress(p))
    with pytest.raises(minirt.SignatureError, match="signature does not match"):
        minirt.Session(layout_sections(parts), verify_key=PUB_A)


@pytest.mark.parametrize("form", ["bytes", "hex", "path", "pathlike"])
def test_signed_artifact_loads_with_its_key(form, tmp_path):
    (tmp_path / "a.pub").write_text(PUB_A.hex() + "\n")
    key = {"bytes": PUB_A, "hex": PUB_A.hex(), "path": str(tmp_path / "a.pub"), "pathlike": tmp_path / "a.pub"}[form]
    _check_runs(_signed(), verify_key=key)
    path = tmp_path / "m.mrt"
    path.write_bytes(_signed())
    _check_runs(str(path), verify_key=key)  # the mmap path


def test_without_verify_key_signatures_are_not_checked():
    _check_runs(minimal_writer().to_bytes())
    _check_runs(_signed())
    data = bytearray(_signed())
    off = section_entries(data)[-1][2]
    data[off + 40] ^= 1  # break the signature itself
    _check_runs(bytes(fix_section_crcs(data)))


def test_unsigned_artifact_is_refused():
    with pytest.raises(minirt.SignatureError, match="artifact is not signed") as exc:
        minirt.Session(minimal_writer().to_bytes(), verify_key=PUB_A)
    assert fingerprint(PUB_A) in str(exc.value)
    assert isinstance(exc.value, minirt.FormatError)


def test_removed_signature_section_is_not_signed():
    parts = [(k, f, p) for k, f, p in split(_signed()) if k != S.SECTION_SIGNATURE]
    with pytest.raises(minirt.SignatureError, match="artifact is not signed"):
        minirt.Session(layout_sections(parts), verify_key=PUB_A)


def test_signed_by_another_key_names_both():
    with pytest.raises(minirt.SignatureError, match="signed by another key") as exc:
        minirt.Session(_signed(SEED_B), verify_key=PUB_A)
    assert fingerprint(PUB_A) in str(exc.value) and fingerprint(PUB_B) in str(exc.value)


def test_resigned_with_another_key():
    resigned = sign_artifact(_signed(SEED_A), SEED_B)
    assert len(split(resigned)) == len(split(_signed()))  # the old signature was replaced, not kept
    with pytest.raises(minirt.SignatureError, match="signed by another key"):
        minirt.Session(resigned, verify_key=PUB_A)
    _check_runs(resigned, verify_key=PUB_B)


def test_swapped_public_key_does_not_match():
    """An attacker who signs with their key and writes the expected public key in the section."""
    data = bytearray(_signed(SEED_B))
    off = section_entries(data)[-1][2]
    data[off + 4 : off + 36] = PUB_A
    data = bytes(fix_section_crcs(data))
    for verify in (True, False):
        with pytest.raises(minirt.SignatureError, match="signature does not match"):
            minirt.Session(data, verify_key=PUB_A, verify_checksums=verify)


def test_unknown_algorithm_and_malformed_section():
    data = bytearray(_signed())
    off = section_entries(data)[-1][2]
    struct.pack_into("<I", data, off, 2)
    with pytest.raises(minirt.SignatureError, match="unsupported signature algorithm 2"):
        minirt.Session(bytes(fix_section_crcs(data)), verify_key=PUB_A)
    _check_runs(bytes(fix_section_crcs(data)))  # without verify_key the section is not interpreted
    parts = [(k, f, p[:99] if k == S.SECTION_SIGNATURE else p) for k, f, p in split(_signed())]
    with pytest.raises(minirt.SignatureError, match="malformed signature section"):
        minirt.Session(layout_sections(parts), verify_key=PUB_A)


def _every_section_byte_positions(data: bytes):
    for kind, _, off, length, _, _ in section_entries(data):
        for where in sorted({off, off + length // 2, off + length - 1}):
            yield S.SECTION_NAMES.get(kind, str(kind)), where


@pytest.mark.parametrize("verify_checksums", [True, False])
@pytest.mark.parametrize("crcs_fixed", [True, False])
def test_flipped_byte_in_every_section_is_refused(verify_checksums, crcs_fixed):
    good = _signed()
    positions = list(_every_section_byte_positions(good))
    assert {name for name, _ in positions} == {"metadata", "operators", "graphs", "tensors", "tensor_data", "signature"}
    for name, pos in positions:
        data = bytearray(good)
        data[pos] ^= 0x01
        if crcs_fixed:
            data = fix_section_crcs(data)  # the attacker recomputes every CRC
        with pytest.raises(minirt.SignatureError) as exc:
            minirt.Session(bytes(data), verify_key=PUB_A, verify_checksums=verify_checksums)
        msg = str(exc.value)
        assert "does not match" in msg or "another key" in msg or "algorithm" in msg, (name, msg)


def test_tampered_section_flags_and_order_are_refused():
    parts = split(_signed())
    # a required section re-flagged as optional (a reader would then be free to skip it)
    flagged = [(k, f | (S.SECTION_FLAG_OPTIONAL if k == S.SECTION_TENSORS else 0), p) for k, f, p in parts]
    # two sections swapped in the table
    swapped = [parts[1], parts[0]] + parts[2:]
    # an extra optional section of an unknown kind (ignored by readers, but not signed)
    extra = parts[:-1] + [(99, S.SECTION_FLAG_OPTIONAL, b"payload")] + parts[-1:]
    for variant in (flagged, swapped, extra):
        with pytest.raises(minirt.SignatureError, match="does not match"):
            minirt.Session(layout_sections(variant), verify_key=PUB_A)


def test_an_older_runtime_skips_the_signature_section(monkeypatch):
    """Kind 8 is written with SECTION_FLAG_OPTIONAL: a reader that does not know it still runs the file."""
    names = {k: v for k, v in S.SECTION_NAMES.items() if k != S.SECTION_SIGNATURE}
    monkeypatch.setattr(S, "SECTION_NAMES", names)
    _check_runs(_signed())


def test_sign_artifact_rejects_bad_keys():
    with pytest.raises(ValueError, match="32-byte"):
        minimal_writer().to_bytes(sign_key=b"short")


# --- CLI ----------------------------------------------------------------------------------------


def test_cli_keygen(tmp_path, capsys):
    from minirt.cli import main

    assert main(["keygen", str(tmp_path / "dev")]) == 0
    out = capsys.readouterr().out
    pub = keys.load_public_key(tmp_path / "dev.pub")
    assert fingerprint(pub) in out
    assert main(["keygen", str(tmp_path / "dev")]) == 2
    assert "already exists" in capsys.readouterr().err


def _build_supports_signing() -> bool:
    from minirt import builder

    return "sign_key" in inspect.signature(builder.build).parameters


@pytest.mark.skipif(not _build_supports_signing(), reason="builder.build has no sign_key yet (lead integrates)")
def test_cli_build_sign(tmp_path, capsys):
    from minirt.cli import main

    onnx_path = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "digits", "digits_cnn.onnx")
    if not os.path.exists(onnx_path):
        pytest.skip("digits example not present")
    assert main(["keygen", str(tmp_path / "k")]) == 0
    out = tmp_path / "m.mrt"
    assert main(["build", onnx_path, "-o", str(out), "-q", "--sign", str(tmp_path / "k.key")]) == 0
    minirt.Session(str(out), verify_key=str(tmp_path / "k.pub"))
    assert main(["build", onnx_path, "-o", str(out), "-q", "--sign", str(tmp_path / "missing.key")]) == 2

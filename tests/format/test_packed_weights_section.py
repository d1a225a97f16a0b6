"""The optional packed_weights section (kind 9; minirt/format/packed_weights.py, docs/format.md):
round trip, the signature covers it, and every malformed entry is refused with a clear FormatError."""
from __future__ import annotations

import struct

import numpy as np
import pytest

import minirt
from minirt.format import ed25519, reader
from minirt.format import packed_weights as P
from minirt.format import schema as S
from tests.format.util import minimal_writer, replace_section, section, section_entries, split


def _packed_writer():
    """The minimal artifact (y = x + w, w float32 (2, 3)) with w packed as a product's B for panels of 8,
    and as a 1x1 conv weight (2 output channels of 3 inputs: its (2, 3) viewed as (2, 3, 1, 1) is not
    its shape, so a conv entry is written for a separate (2, 3, 1, 1) tensor)."""
    w = minimal_writer()
    b = w.tensors[0]
    conv_w = w.tensor(np.arange(6, dtype=np.float32).reshape(2, 3, 1, 1))
    w.packed_weights.append((P.PACK_SGEMM_B, 0, 8, (0, 2, 3), P.pack_sgemm_b(b, 0, 8)))
    w.packed_weights.append((P.PACK_CONV_F32, conv_w, 16, (3, 1, 1, 1, 1, 1, 4, 4),
                             P.pack_conv_w(w.tensors[conv_w], 1, 16)))
    return w


def test_round_trip():
    data = _packed_writer().to_bytes()
    kind, flags = next((k, f) for k, f, *_ in section_entries(data) if k == S.SECTION_PACKED_WEIGHTS)
    assert flags == S.SECTION_FLAG_OPTIONAL  # readers that do not know kind 9 skip it
    art = reader.load(data)
    product, conv = art.packed_weights
    assert (product.kind, product.tensor, product.nr, product.kc, product.tag) == (2, 0, 8, 2, ("sgemm_b", 0, 2, 3))
    np.testing.assert_array_equal(product.data, P.pack_sgemm_b(art.tensor(0), 0, 8))
    assert (conv.kind, conv.nr, conv.kc, conv.tag) == (1, 16, 0, ("conv_f32", 1))
    np.testing.assert_array_equal(conv.data, P.pack_conv_w(art.tensor(conv.tensor), 1, 16))
    assert not product.data.flags.writeable
    # the model runs as without the section
    y = minirt.Session(data).run(None, {"x": np.ones((2, 3), np.float32)})[0]
    np.testing.assert_array_equal(y, np.arange(6, dtype=np.float32).reshape(2, 3) + 1)


def test_files_without_packs_have_no_section():
    data = minimal_writer().to_bytes()
    assert S.SECTION_PACKED_WEIGHTS not in [k for k, *_ in section_entries(data)]
    assert reader.load(data).packed_weights == ()


def _with_entry(field: str, value) -> bytes:
    """The packed artifact with one field of its first entry changed (CRCs re-sealed)."""
    data = _packed_writer().to_bytes()
    off, length = section(data, S.SECTION_PACKED_WEIGHTS)
    payload = bytearray(data[off:off + length])
    fields = list(P.ENTRY.unpack_from(payload, P.HEADER.size))
    names = ["kind", "tensor", "nr", "kc"] + [f"tag{i}" for i in range(8)] + ["offset", "nbytes"]
    fields[names.index(field)] = value
    P.ENTRY.pack_into(payload, P.HEADER.size, *fields)
    return replace_section(data, S.SECTION_PACKED_WEIGHTS, bytes(payload))


@pytest.mark.parametrize("field, value, message", [
    ("kind", 7, "unknown layout kind 7"),
    ("nr", 12, "unknown panel width 12"),
    ("tensor", 99, "tensor index 99 is out of range"),
    ("tensor", 1, "does not fit a weight of shape"),             # a product tag on the conv's 4-D tensor
    ("tag1", 5, "does not match the weight's shape"),          # K 5 for a (2, 3) B
    ("tag0", 1, "does not match the weight's shape"),          # transb: a (3, 2) B
    ("tag3", 1, "does not fit a weight of shape"),             # unused tag fields must be 0
    ("kc", 0, "K blocks of 0"),
    ("nbytes", 4, "4 bytes, but its tag needs"),
    ("offset", 8, "misaligned or outside"),
    ("offset", 1 << 20, "misaligned or outside"),
])
def test_malformed_entries_are_refused(field, value, message):
    with pytest.raises(minirt.FormatError, match=message):
        minirt.Session(_with_entry(field, value))


def test_malformed_conv_tags_are_refused():
    data = _packed_writer().to_bytes()
    off, length = section(data, S.SECTION_PACKED_WEIGHTS)
    payload = bytearray(data[off:off + length])
    pos = P.HEADER.size + P.ENTRY.size  # the second entry, the conv's
    fields = list(P.ENTRY.unpack_from(payload, pos))
    for i, bad in ((4, 6), (5, 2), (6, 3), (8, 0), (10, -1)):  # C, group, KH, SH 0, OH < 0 (0: dynamic, valid)
        changed = fields.copy()
        changed[i] = bad
        P.ENTRY.pack_into(payload, pos, *changed)
        with pytest.raises(minirt.FormatError, match="packed_weights entry 1: conv tag"):
            reader.load(replace_section(data, S.SECTION_PACKED_WEIGHTS, bytes(payload)))


@pytest.mark.parametrize("payload, message", [(b"\x01\x00", "too short"),
                                              (struct.pack("<II", 1000, 0) + bytes(56), "1000 entries cannot fit")])
def test_malformed_section_headers_are_refused(payload, message):
    data = _packed_writer().to_bytes()
    with pytest.raises(minirt.FormatError, match=message):
        reader.load(replace_section(data, S.SECTION_PACKED_WEIGHTS, payload))


def test_the_signature_covers_the_section():
    seed = bytes(range(32))
    pub = ed25519.public_key(seed)
    data = _packed_writer().to_bytes(sign_key=seed)
    assert len(reader.load(data, verify_key=pub).packed_weights) == 2
    sections = split(data)
    kind, flags, payload = next(s for s in sections if s[0] == S.SECTION_PACKED_WEIGHTS)
    tampered = bytearray(payload)
    tampered[-5] ^= 0x40  # one packed float changed
    bad = replace_section(data, S.SECTION_PACKED_WEIGHTS, bytes(tampered))
    with pytest.raises(minirt.SignatureError):
        reader.load(bad, verify_key=pub)


def _rnn_packed(transb: int, k: int, n: int) -> bytes:
    """The minimal artifact with a separate (2, 4, 3) tensor (an LSTM / GRU's W: D 2, G*H 4, I 3) packed as
    a product's B with the given tag."""
    w = _packed_writer()
    rnn_w = w.tensor(np.arange(24, dtype=np.float32).reshape(2, 4, 3))
    packed = P.pack_sgemm_b(w.tensors[rnn_w].reshape(8, 3), 1, 8)
    if (transb, k, n) != (1, 3, 8):  # (a wrong tag: data of the size that tag needs)
        packed = np.zeros(P.sgemm_packed_floats(k, n, 8), np.float32)
    w.packed_weights.append((P.PACK_SGEMM_B, rnn_w, 8, (transb, k, n), packed))
    return w.to_bytes()


def test_an_rnn_input_weight_packs_as_its_rows_transposed():
    """W (D, G*H, I) is stored as B = its D*G*H rows of I floats, transposed (transb 1, K = I, N = D*G*H)."""
    art = reader.load(_rnn_packed(1, 3, 8))
    entry = art.packed_weights[-1]
    assert entry.tag == ("sgemm_b", 1, 3, 8)
    np.testing.assert_array_equal(entry.data, P.pack_sgemm_b(art.tensor(entry.tensor).reshape(8, 3), 1, 8))


@pytest.mark.parametrize("tag", [(0, 8, 3), (1, 3, 6), (1, 4, 8)])  # not transposed; N not D*G*H; K not I
def test_a_rank_3_weight_with_another_tag_is_refused(tag):
    with pytest.raises(minirt.FormatError, match="does not (fit|match) the weight's shape|does not fit a weight"):
        minirt.Session(_rnn_packed(*tag))


def test_tensors_are_arrays_of_the_native_dtype():
    """On a little-endian host a tensor is an array of numpy's own float32 (not an equal '<f4' dtype), so
    np.asarray(w, np.float32) is w itself: the kernels' caches keyed on the weight array find it."""
    art = reader.load(minimal_writer().to_bytes())
    t = art.tensor(0)
    if np.little_endian:
        assert t.dtype is np.dtype(np.float32)
        assert np.asarray(t, np.float32) is t and np.ascontiguousarray(t, np.float32) is t
    else:
        assert t.dtype == np.dtype("<f4")

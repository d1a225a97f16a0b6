"""minirt.builder.writer.write_atomic and the schema's padding helpers."""
from __future__ import annotations

import os

import pytest

from minirt.builder.writer import write_atomic
from minirt.format import reader
from minirt.format import schema as S
from tests.format.util import minimal_bytes


class Boom(RuntimeError):
    pass


def _chunks_then_fail():
    yield b"MINIRT\x00\x1a"
    yield b"\x00" * 1000
    raise Boom("disk on fire")


def _listing(folder):
    return sorted(os.listdir(folder))


def test_write_atomic_bytes(tmp_path):
    target = tmp_path / "m.mrt"
    data = minimal_bytes()
    write_atomic(data, target)
    assert target.read_bytes() == data
    assert _listing(tmp_path) == ["m.mrt"]
    reader.load(target)


def test_write_atomic_chunks(tmp_path):
    target = tmp_path / "m.mrt"
    write_atomic([b"ab", b"", bytearray(b"cd"), memoryview(b"ef")], str(target))
    assert target.read_bytes() == b"abcdef"


def test_write_atomic_failure_leaves_nothing(tmp_path):
    target = tmp_path / "m.mrt"
    with pytest.raises(Boom):
        write_atomic(_chunks_then_fail(), target)
    assert _listing(tmp_path) == []


def test_write_atomic_failure_keeps_existing_target(tmp_path):
    target = tmp_path / "m.mrt"
    old = minimal_bytes()
    target.write_bytes(old)
    with pytest.raises(Boom):
        write_atomic(_chunks_then_fail(), target)
    assert target.read_bytes() == old
    assert _listing(tmp_path) == ["m.mrt"]
    reader.load(target)


def test_write_atomic_keyboard_interrupt(tmp_path):
    def chunks():
        yield b"x"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_atomic(chunks(), tmp_path / "m.mrt")
    assert _listing(tmp_path) == []


def test_write_atomic_replaces_existing(tmp_path):
    target = tmp_path / "m.mrt"
    target.write_bytes(b"old")
    write_atomic(b"new", target)
    assert target.read_bytes() == b"new"
    assert _listing(tmp_path) == ["m.mrt"]


def test_write_atomic_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_atomic(b"x", tmp_path / "no" / "m.mrt")
    assert _listing(tmp_path) == []


def test_write_atomic_honours_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_atomic(b"x", tmp_path / "m.mrt")
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "m.mrt").st_mode & 0o777 == 0o644


@pytest.mark.parametrize(
    "offset,expected",
    [(0, 0), (1, 63), (63, 1), (64, 0), (65, 63), (127, 1), (128, 0), (1000, 24), (2**40 + 1, 63)],
)
def test_padding_required(offset, expected):
    assert S.padding_required(offset) == expected
    assert (offset + S.padding_required(offset)) % S.ALIGNMENT == 0


@pytest.mark.parametrize("size,expected", [(0, 0), (1, 64), (64, 64), (65, 128), (4096, 4096), (4097, 4160)])
def test_aligned_size(size, expected):
    assert S.aligned_size(size) == expected


@pytest.mark.parametrize("alignment", [1, 4, 8, 16, 4096])
def test_padding_other_alignments(alignment):
    for offset in range(0, 3 * alignment + 2):
        pad = S.padding_required(offset, alignment)
        assert 0 <= pad < alignment and (offset + pad) % alignment == 0
        assert S.aligned_size(offset, alignment) == offset + pad


def test_schema_struct_sizes():
    assert S.HEADER.size == 64 and S.SECTION_ENTRY.size == 32 and S.HEADER_CRC_SPAN == 44
    assert S.ALIGNMENT == 64 and len(S.MAGIC) == 8


def test_write_atomic_to_a_pipe_writes_in_place(tmp_path):
    """A target that is not a regular file (a named pipe here; /dev/null the same) is written, never
    replaced by a rename (as root, `minirt build ... -o /dev/null` used to replace the device node)."""
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    write_atomic([b"MRT", b"1"], fifo)
    reader.join(10)
    assert got == [b"MRT1"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no temporary left behind


def test_write_atomic_to_a_directory_is_refused(tmp_path):
    with pytest.raises(IsADirectoryError, match="is a directory"):
        write_atomic(b"x", tmp_path)

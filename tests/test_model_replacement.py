"""A loaded session and the file it came from (D97): by default the session runs a private copy, which
nothing done to the file afterwards reaches (rewritten in place, truncated by a ``cp`` over it); a session
that maps its file (``map_file=True``) refuses to run once the file changed, naming it, instead of reading
other weights or dying of SIGBUS on pages past the new end; ``minirt install`` replaces a model by an
atomic rename, which neither kind of session notices."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import minirt
from minirt.format import ed25519, reader
from minirt.tools.install import install
from tests.format.util import minimal_writer

FEED = {"x": np.ones((2, 3), np.float32)}


def _artifact(offset: float, sign_key: bytes | None = None) -> bytes:
    """y = x + w with w = arange(6) + offset: two offsets, two models of the same size and layout."""
    return minimal_writer(offset).to_bytes(sign_key=sign_key)


def _expected(offset: float) -> np.ndarray:
    return np.arange(6, dtype=np.float32).reshape(2, 3) + np.float32(offset) + 1


@pytest.fixture
def live(tmp_path):
    path = tmp_path / "live.mrt"
    path.write_bytes(_artifact(0))
    return path


def test_a_private_copy_runs_on_whatever_happens_to_its_file(live):
    sess = minirt.Session(str(live))
    assert sess.artifact.mapped_file is None
    np.testing.assert_array_equal(sess.run(None, FEED)[0], _expected(0))
    with open(live, "r+b") as f:  # rewritten in place: same size, other weights (valid checksums)
        f.write(_artifact(100))
    np.testing.assert_array_equal(sess.run(None, FEED)[0], _expected(0))
    with open(live, "wb"):  # truncated, as `cp new.mrt live.mrt` does first
        pass
    np.testing.assert_array_equal(sess.run(None, FEED)[0], _expected(0))
    live.unlink()
    np.testing.assert_array_equal(sess.run(None, FEED)[0], _expected(0))
    # the copy's tensors are read-only, as the mapping's were: no kernel writes into the weights
    assert not sess.artifact.tensor(0).flags.writeable


@pytest.mark.parametrize("change", ["rewrite", "truncate", "grow"])
def test_a_mapped_session_refuses_to_run_once_its_file_changed(live, change):
    sess = minirt.Session(str(live), map_file=True)
    assert sess.artifact.mapped_file is not None
    np.testing.assert_array_equal(sess.run(None, FEED)[0], _expected(0))
    stat = live.stat()
    if change == "rewrite":
        with open(live, "r+b") as f:
            f.write(_artifact(100))
        os.utime(live, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # (a coarse clock's tick)
    elif change == "truncate":
        with open(live, "wb"):
            pass
    else:
        with open(live, "ab") as f:
            f.write(b"\0" * 100)
    with pytest.raises(minirt.FileChanged, match="live.mrt .*minirt install") as exc:
        sess.run(None, FEED)
    assert isinstance(exc.value, minirt.Fail)
    # every entry point checks, not only run's shortcut
    with pytest.raises(minirt.FileChanged):
        sess.run(["y"], FEED)
    with pytest.raises(minirt.FileChanged):
        sess.run_profiled(FEED)


def test_install_replaces_a_model_under_running_sessions(live, tmp_path):
    copied = minirt.Session(str(live))
    mapped = minirt.Session(str(live), map_file=True)
    new = tmp_path / "new.mrt"
    new.write_bytes(_artifact(100))
    done = install(new, live)
    assert done == {"path": str(live), "bytes": new.stat().st_size, "replaced": True, "signer": None}
    # both sessions keep the model they loaded; a new one loads the new model
    for sess in (copied, mapped):
        np.testing.assert_array_equal(sess.run(None, FEED)[0], _expected(0))
    np.testing.assert_array_equal(minirt.Session(str(live)).run(None, FEED)[0], _expected(100))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live.mrt", "new.mrt"]  # no temporary file left


def test_install_into_a_folder_takes_the_new_file_name(tmp_path):
    new = tmp_path / "model.mrt"
    new.write_bytes(_artifact(7))
    (tmp_path / "models").mkdir()
    done = install(new, tmp_path / "models")
    assert done["path"] == str(tmp_path / "models" / "model.mrt") and not done["replaced"]
    np.testing.assert_array_equal(minirt.Session(done["path"]).run(None, FEED)[0], _expected(7))


def test_install_checks_first_and_leaves_the_live_model_alone(live, tmp_path):
    before = live.read_bytes()
    bad = tmp_path / "bad.mrt"
    data = bytearray(_artifact(100))
    data[bytes(data).index((np.arange(6, dtype=np.float32) + 100).tobytes()) + 2] ^= 1  # a weight's bit flipped
    bad.write_bytes(bytes(data))
    with pytest.raises(minirt.FormatError, match="bad.mrt"):
        install(bad, live)
    with pytest.raises(minirt.NoSuchFile):
        install(tmp_path / "nope.mrt", live)
    with pytest.raises(minirt.InvalidArgument, match="does not exist"):
        install(live, tmp_path / "no_such_folder" / "live.mrt")
    with pytest.raises(minirt.InvalidArgument, match="same file"):
        install(live, live)
    unsigned = tmp_path / "unsigned.mrt"
    unsigned.write_bytes(_artifact(100))
    with pytest.raises(minirt.SignatureError, match="not signed"):
        install(unsigned, live, verify_key=ed25519.public_key(bytes(32)))
    assert live.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.mrt", "live.mrt", "unsigned.mrt"]


def test_install_with_a_key_names_the_signer(live, tmp_path):
    seed = bytes(range(32))
    signed = tmp_path / "signed.mrt"
    signed.write_bytes(_artifact(3, sign_key=seed))
    done = install(signed, live, verify_key=ed25519.public_key(seed))
    from minirt.format.signature import fingerprint

    assert done["signer"] == fingerprint(ed25519.public_key(seed))


def test_the_install_command(live, tmp_path):
    new = tmp_path / "new.mrt"
    new.write_bytes(_artifact(100))
    run = [sys.executable, "-m", "minirt", "install"]
    proc = subprocess.run(run + [str(new), str(live)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "atomic rename" in proc.stdout and f"{new.stat().st_size:,} bytes" in proc.stdout
    proc = subprocess.run(run + [str(tmp_path / "nope.mrt"), str(live)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "nope.mrt: no such file" in proc.stderr and "Traceback" not in proc.stderr


def test_signed_loads_always_copy_and_map_file_is_checked(live, tmp_path):
    seed = bytes(range(32))
    signed = tmp_path / "signed.mrt"
    signed.write_bytes(_artifact(0, sign_key=seed))
    sess = minirt.Session(str(signed), verify_key=ed25519.public_key(seed))
    assert sess.artifact.mapped_file is None  # what was verified is what runs
    with pytest.raises(minirt.InvalidArgument, match="always loaded as a private copy"):
        minirt.Session(str(signed), verify_key=ed25519.public_key(seed), map_file=True)
    with pytest.raises(minirt.InvalidArgument, match="map_file must be"):
        minirt.Session(str(live), map_file="yes")


def test_large_files_are_mapped_by_default(live, monkeypatch):
    monkeypatch.setattr(reader, "PRIVATE_COPY_MAX_BYTES", 100)
    assert minirt.Session(str(live)).artifact.mapped_file is not None
    assert minirt.Session(str(live), map_file=False).artifact.mapped_file is None


def test_temporary_files_of_killed_writers_are_removed_by_the_next_one(live, tmp_path):
    """A build or an install killed before its rename leaves ``.<name>.<pid>.<random>.minirt-tmp``; the next
    write of the same file removes those of processes that no longer run, and nothing else."""
    from minirt.builder.writer import write_atomic

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f".live.mrt.{dead}.0badf00d.minirt-tmp"
    mine = tmp_path / f".live.mrt.{os.getpid()}.12345678.minirt-tmp"  # a live writer's (this process)
    other = tmp_path / f".other.mrt.{dead}.0badf00d.minirt-tmp"  # another target's
    for p in (stale, mine, other):
        p.write_bytes(b"partial")
    new = tmp_path / "new.mrt"
    new.write_bytes(_artifact(5))
    install(new, live)
    assert not stale.exists() and mine.exists() and other.exists()
    stale.write_bytes(b"partial")
    write_atomic(_artifact(6), live)
    assert not stale.exists() and mine.exists() and other.exists()
    np.testing.assert_array_equal(minirt.Session(str(live)).run(None, FEED)[0], _expected(6))


def _mapping_rss_kib(path) -> int | None:
    """Resident KiB of this process's mappings of ``path`` (/proc/self/smaps), None where there is no such file."""
    try:
        lines = open("/proc/self/smaps", encoding="utf-8").read().splitlines()
    except OSError:
        return None
    total, inside, target = 0, False, os.path.realpath(path)
    for line in lines:
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:  # a mapping's header line
            inside = fields[-1] == target
        elif inside and fields[:1] == ["Rss:"]:
            total += int(fields[1])
    return total


@pytest.mark.parametrize("map_file", [True, False])
def test_a_big_artifact_loads_intact_and_mapped_pages_are_given_back(tmp_path, map_file):
    # The load checks every section's CRC; a mapped file is checked by chunks whose pages are given back
    # (D123: the weights a kernel never reads must not stay resident), and a private copy keeps its bytes
    # (the advice that drops a file page would zero an anonymous one).
    from onnx import TensorProto, helper, numpy_helper

    from minirt.builder import build

    rng = np.random.default_rng(0)
    w = rng.standard_normal((1024, 6144)).astype(np.float32)  # 24 MiB: three check chunks
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1024])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6144])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "big.mrt"
    build(model.SerializeToString(), path, quantize="none")
    sess = minirt.Session(str(path), map_file=map_file, warm_up=False)  # (a warm-up run would pack the weights)
    rss = _mapping_rss_kib(path)
    if map_file and rss is not None:
        assert rss * 1024 < path.stat().st_size / 4, f"{rss} KiB of the {path.stat().st_size} bytes stay resident"
    x = rng.standard_normal((1, 1024)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], x @ w, rtol=1e-4, atol=1e-3)

"""The device's signature policy (docs/runtime.md, "Trust policy"): trusted keys from ``verify_key`` (a key, a
folder of .pub files, a list) or ``MINIRT_TRUSTED_KEYS``; ``require_signature`` and
``MINIRT_REQUIRE_SIGNATURE``; the same options on ``minirt run / bench / verify / install / inspect``, and
``inspect`` naming the signer."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import minirt
from minirt.format import ed25519
from minirt.format.signature import fingerprint
from tests.format.util import minimal_writer

SEED_A, SEED_B = bytes(range(32)), bytes(range(1, 33))
PUB_A, PUB_B = ed25519.public_key(SEED_A), ed25519.public_key(SEED_B)
FEED = {"x": np.ones((2, 3), np.float32)}


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.delenv("MINIRT_TRUSTED_KEYS", raising=False)
    monkeypatch.delenv("MINIRT_REQUIRE_SIGNATURE", raising=False)
    (tmp_path / "a.mrt").write_bytes(minimal_writer().to_bytes(sign_key=SEED_A))
    (tmp_path / "b.mrt").write_bytes(minimal_writer().to_bytes(sign_key=SEED_B))
    (tmp_path / "unsigned.mrt").write_bytes(minimal_writer().to_bytes())
    keys = tmp_path / "trusted"
    keys.mkdir()
    (keys / "a.pub").write_text(PUB_A.hex() + "\n")
    (keys / "README").write_text("not a key\n")
    (tmp_path / "b.pub").write_text(PUB_B.hex() + "\n")
    return tmp_path


def _loads(path, **kw) -> bool:
    sess = minirt.Session(str(path), **kw)
    np.testing.assert_array_equal(sess.run(None, FEED)[0], np.arange(6, dtype=np.float32).reshape(2, 3) + 1)
    return True


def test_a_folder_or_a_list_of_trusted_keys(files):
    assert _loads(files / "a.mrt", verify_key=files / "trusted")
    with pytest.raises(minirt.SignatureError, match=f"signed by {fingerprint(PUB_B)}"):
        minirt.Session(str(files / "b.mrt"), verify_key=files / "trusted")
    both = [files / "trusted", str(files / "b.pub")]
    assert _loads(files / "a.mrt", verify_key=both) and _loads(files / "b.mrt", verify_key=both)
    with pytest.raises(minirt.SignatureError, match="not signed, but .* one of the keys") as exc:
        minirt.Session(str(files / "unsigned.mrt"), verify_key=both)
    assert fingerprint(PUB_A) in str(exc.value) and fingerprint(PUB_B) in str(exc.value)
    (files / "empty").mkdir()
    with pytest.raises(minirt.InvalidArgument, match="holds no .pub file"):
        minirt.Session(str(files / "a.mrt"), verify_key=files / "empty")


def test_the_environment_sets_the_device_policy(files, monkeypatch):
    monkeypatch.setenv("MINIRT_TRUSTED_KEYS", os.pathsep.join([str(files / "trusted"), str(files / "b.pub")]))
    assert _loads(files / "a.mrt") and _loads(files / "b.mrt")
    with pytest.raises(minirt.SignatureError, match="not signed"):
        minirt.Session(str(files / "unsigned.mrt"))
    assert _loads(files / "unsigned.mrt", require_signature=False)  # (a development setting)
    # an explicit key replaces the environment's
    with pytest.raises(minirt.SignatureError, match="signed by another key"):
        minirt.Session(str(files / "b.mrt"), verify_key=files / "trusted")


def test_a_required_signature_needs_a_trusted_key(files, monkeypatch):
    with pytest.raises(minirt.InvalidArgument, match="require_signature=True, but no key is trusted"):
        minirt.Session(str(files / "a.mrt"), require_signature=True)
    monkeypatch.setenv("MINIRT_REQUIRE_SIGNATURE", "1")
    with pytest.raises(minirt.InvalidArgument, match="MINIRT_REQUIRE_SIGNATURE is set, but no key"):
        minirt.Session(str(files / "unsigned.mrt"))
    assert _loads(files / "a.mrt", verify_key=files / "trusted")
    with pytest.raises(minirt.InvalidArgument, match="require_signature=False with verify_key"):
        minirt.Session(str(files / "a.mrt"), verify_key=files / "trusted", require_signature=False)
    with pytest.raises(minirt.InvalidArgument, match="require_signature must be"):
        minirt.Session(str(files / "a.mrt"), require_signature="yes")


def _cli(*args, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minirt", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def test_the_commands_take_the_policy(files):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIRT_")}
    trusted = str(files / "trusted")
    for cmd in (["run"], ["bench", "--runs", "2", "--warmup", "0", "--profile-runs", "1"], ["verify"]):
        ok = _cli(*cmd, str(files / "a.mrt"), "--verify-key", trusted, env=env)
        assert ok.returncode in (0, 1) and "Traceback" not in ok.stderr, ok.stderr  # (verify: 1 = mismatch)
        bad = _cli(*cmd, str(files / "b.mrt"), "--verify-key", trusted, env=env)
        assert bad.returncode == 2 and "signed by another key" in bad.stderr, (cmd, bad.stderr)
        need = _cli(*cmd, str(files / "a.mrt"), "--require-signature", env=env)
        assert need.returncode == 2 and "no key is trusted" in need.stderr, (cmd, need.stderr)
        need = _cli(*cmd, str(files / "unsigned.mrt"), "--require-signature",
                    env=dict(env, MINIRT_TRUSTED_KEYS=trusted))
        assert need.returncode == 2 and "not signed" in need.stderr, (cmd, need.stderr)
    bad = _cli("install", str(files / "b.mrt"), str(files / "live.mrt"), "--verify-key", trusted, env=env)
    assert bad.returncode == 2 and "signed by another key" in bad.stderr and not (files / "live.mrt").exists()


def test_inspect_names_the_signer_and_verifies_on_request(files):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINIRT_")}
    shown = _cli("inspect", str(files / "a.mrt"), env=env)
    assert shown.returncode == 0 and f"signature: {fingerprint(PUB_A)} (not verified" in shown.stdout
    verified = _cli("inspect", str(files / "a.mrt"), "--verify-key", str(files / "trusted"), env=env)
    assert verified.returncode == 0 and f"signature: {fingerprint(PUB_A)} (verified)" in verified.stdout
    assert "signature: none (unsigned)" in _cli("inspect", str(files / "unsigned.mrt"), env=env).stdout
    # inspecting is not running: the environment's trusted keys do not stop it from showing an unsigned file
    shown = _cli("inspect", str(files / "unsigned.mrt"), env=dict(env, MINIRT_TRUSTED_KEYS=str(files / "trusted")))
    assert shown.returncode == 0
    refused = _cli("inspect", str(files / "b.mrt"), "--verify-key", str(files / "trusted"), env=env)
    assert refused.returncode == 2 and "signed by another key" in refused.stderr

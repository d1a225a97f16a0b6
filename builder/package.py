"""`minirt package`: everything a device needs to run a model, in one folder (or a .tar.gz of it).

    minirt package model.onnx --target rpi4 -o pkg/

writes into pkg/:

* ``model.mrt``        the model built for the target (every `minirt build` option applies);
* ``wheels/minirt-*.whl``  the device runtime wheel for the target's architecture (numpy-only, no
  builder, its kernels compiled for every ISA level of that architecture: ``make wheels``), or with
  ``reduced`` a copy of it without the kernel families and providers the model does not use;
* ``run.py``           the launcher (builder/package_launcher.py: info, check, run, classify, folder, serve);
* ``install.sh``       the device's one command: a venv over the system's numpy, the wheel installed
  offline (``pip install --no-index``), then ``run.py check`` and ``run.py info``;
* ``manifest.json``    sha256 of every file, the model's source and signature, the minirt version, the
  target's requirements (architecture, CPU features, Python, numpy);
* ``README.txt``       those commands.

The wheel comes from ``wheel`` (a path), else the newest matching ``minirt-*-<platform tag>.whl`` in
``wheel_dir`` (default: ``dist/`` of the source checkout, where ``make wheels`` puts them); for the
build machine's own architecture a missing wheel is built from the source checkout (``MINIRT_WHEEL=
runtime pip wheel``, a few minutes of compiling).  Everything is written to a temporary folder beside
the output and renamed into place at the end: a failed package leaves nothing half-written.
"""
from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from minirt.builder.errors import BuildError
from minirt.format.reader import sha256_file

# the target profile's architecture -> the wheel platform tag's machine part
_WHEEL_MACHINES = {"arm64": ("aarch64",), "x86_64": ("x86_64",), "armv7": ("armv7l",), "armv6": ("armv6l",)}
_HOST_MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64", "armv7l": "armv7",
                  "armv6l": "armv6"}
LAUNCHER = Path(__file__).with_name("package_launcher.py")
MANIFEST_FORMAT = "minirt-package/1"


@dataclasses.dataclass
class PackageReport:
    output: str
    target: str
    model_bytes: int
    wheel: str
    wheel_bytes: int
    full_wheel_bytes: int
    reduced: bool
    kernel_families: list
    seconds: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        lines = [f"minirt package: wrote {self.output} for target {self.target} in {self.seconds:.1f} s",
                 f"  model.mrt {self.model_bytes:,} bytes",
                 f"  {self.wheel} {self.wheel_bytes:,} bytes"]
        if self.reduced:
            lines.append(f"  reduced runtime: {self.wheel_bytes:,} of the full wheel's {self.full_wheel_bytes:,} "
                         f"bytes (kernel families kept: {', '.join(self.kernel_families)})")
        lines.append(f"  on the device: sh install.sh, then .venv/bin/python run.py info (README.txt)")
        return "\n".join(lines)


def source_root() -> Path | None:
    """The source checkout minirt runs from (an editable install), or None for an installed wheel."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "setup.py").is_file() and (root / "minirt" / "native").is_dir() else None


def _wheel_machine(name: str) -> str:
    """The machine of a wheel file name's platform tag (minirt-0.1.0-cp39-abi3-linux_aarch64.whl -> aarch64)."""
    tag = name[:-4].split("-")[-1] if name.endswith(".whl") else ""
    return re.sub(r"^(manylinux_\d+_\d+|manylinux\d+|musllinux_\d+_\d+|linux)_", "", tag.split(".")[-1])


def find_wheel(arch: str, wheel_dir: Path) -> Path | None:
    """The newest runtime wheel for ``arch`` in ``wheel_dir``."""
    machines = _WHEEL_MACHINES.get(arch, ())
    found = [p for p in wheel_dir.glob("minirt-*.whl") if _wheel_machine(p.name) in machines] \
        if wheel_dir.is_dir() else []
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def build_host_wheel(out_dir: Path, progress=None) -> Path:
    """The device wheel of this machine's architecture, built from the source checkout into out_dir."""
    root = source_root()
    if root is None:
        raise BuildError("no runtime wheel for this machine's architecture and no source checkout to build one "
                         "from: pass --wheel PATH (a wheel made by `make wheels`)")
    out_dir.mkdir(parents=True, exist_ok=True)
    if progress:
        progress(f"building the runtime wheel for {platform.machine()} (compiles the kernels: a few minutes)")
    with tempfile.TemporaryDirectory(prefix="minirt-wheel-") as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(root), "--no-deps", "--no-build-isolation",
                               "--disable-pip-version-check", "-q", "-w", tmp],
                              capture_output=True, text=True, env=dict(os.environ, MINIRT_WHEEL="runtime"), cwd=tmp)
        wheels = list(Path(tmp).glob("minirt-*.whl"))
        if proc.returncode != 0 or len(wheels) != 1:
            raise BuildError(f"building the runtime wheel failed (pip exit {proc.returncode}): "
                             f"{proc.stderr.strip()[-1500:]}")
        target = out_dir / wheels[0].name
        shutil.move(str(wheels[0]), target)
    return target


_FAMILY_FILE = re.compile(r"minirt/kernels/([a-z]\w*)\.pyc?")  # (a module's source, or its bytecode in the archive)


def _kernel_references(source: str) -> set:
    """The kernel modules a Python source names: minirt.kernels.X anywhere (imports, lazy imports,
    strings) and ``from minirt.kernels import X, Y`` (one line or parenthesized)."""
    names = set(re.findall(r"minirt\.kernels\.(\w+)", source))
    for group in re.findall(r"from minirt\.kernels import (\([^)]*\)|[\w ,]+)", source):
        names.update(n.strip() for n in group.strip("()").replace("\n", ",").split(","))
    return {n for n in names if n}


def _families(artifact, sources: dict) -> list[str]:
    """The kernel family modules (minirt/kernels/<family>.py, ``sources``: the wheel's Python files by
    name) a runtime needs for ``artifact``: those of its operators (the kernel index), those any other
    module names, and, again, those the kept families name."""
    from minirt.kernels._index import INDEX

    families = {m.group(1) for name in sources if (m := _FAMILY_FILE.fullmatch(name))}
    wanted = set()
    for op in artifact.operators:
        domain = "" if op.domain in ("", "ai.onnx") else op.domain
        wanted.update(INDEX.get((domain, op.op_type), ()))
    for name, src in sources.items():
        if not _FAMILY_FILE.fullmatch(name):
            wanted |= _kernel_references(src)
    wanted &= families
    todo = list(wanted)
    while todo:  # (a family that names another needs it too)
        for ref in _kernel_references(sources[f"minirt/kernels/{todo.pop()}.py"]) & families:
            if ref not in wanted:
                wanted.add(ref)
                todo.append(ref)
    return sorted(wanted)


# The device wheel keeps its modules (sources and bytecode) in this archive (scripts/zip_runtime.py, D148);
# a wheel made before that has them as files of its own.
_MODULE_ARCHIVE = "minirt/_runtime.zip"
_PROVIDER_FILE = re.compile(r"minirt/providers/(coreml|nnapi|tflite)\.pyc?")


def _unused(name: str, families: set, providers: set) -> bool:
    """Whether the file ``name`` (a module's source or bytecode) is a kernel family outside ``families`` or a
    provider outside ``providers``."""
    m = _FAMILY_FILE.fullmatch(name)
    if m and m.group(1) not in families:
        return True
    m = _PROVIDER_FILE.fullmatch(name)
    return bool(m) and m.group(1) not in providers


def _copy_zip(zin: zipfile.ZipFile, names: list, zout: zipfile.ZipFile, data_of=None) -> list:
    """Copy the entries ``names`` of zin into zout with their dates and compression (``data_of``: name ->
    bytes that replace an entry's); returns the RECORD rows (name, sha256, size) of what was written."""
    rows = []
    for name in names:
        data = data_of[name] if data_of and name in data_of else zin.read(name)
        zout.writestr(zin.getinfo(name), data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append([name, f"sha256={digest}", len(data)])
    return rows


def reduce_wheel(wheel: Path, artifact, out_dir: Path) -> tuple[Path, list[str]]:
    """A copy of ``wheel`` without the kernel families (minirt/kernels/<family>.py) and the providers
    (minirt/providers/<name>.py) the artifact does not use, inside its module archive (or as files of a
    wheel without one); RECORD rewritten to match."""
    zin = zipfile.ZipFile(wheel)
    archive = zipfile.ZipFile(io.BytesIO(zin.read(_MODULE_ARCHIVE))) if _MODULE_ARCHIVE in zin.namelist() else None
    modules = archive or zin
    sources = {n: modules.read(n).decode("utf-8", "replace") for n in modules.namelist() if n.endswith(".py")}
    keep = set(_families(artifact, sources))
    used_providers = {p.provider for p in artifact.partitions} if artifact.partitions else set()
    replaced = {}
    if archive is not None:
        smaller = io.BytesIO()
        with zipfile.ZipFile(smaller, "w") as zarchive:
            _copy_zip(archive, [n for n in archive.namelist() if not _unused(n, keep, used_providers)], zarchive)
        replaced[_MODULE_ARCHIVE] = smaller.getvalue()
    kept_names = [n for n in zin.namelist() if not _unused(n, keep, used_providers)]
    out = out_dir / wheel.name
    record_name = next(n for n in kept_names if n.endswith(".dist-info/RECORD"))
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        writer.writerows(_copy_zip(zin, [n for n in kept_names if n != record_name], zout, replaced))
        writer.writerow([record_name, "", ""])
        zout.writestr(record_name, rows.getvalue())
    return out, sorted(keep)


_INSTALL_SH = """#!/bin/sh
# Install the minirt runtime of this package offline and check the model (written by `minirt package`).
# Needs python3 with venv, numpy and cffi's backend from the system:
#   sudo apt install python3-venv python3-numpy python3-cffi-backend
set -e
cd "$(dirname "$0")"
python3 -m venv --system-site-packages .venv
.venv/bin/python -m pip install --no-index --no-deps --disable-pip-version-check -q wheels/{wheel}
.venv/bin/python run.py check
.venv/bin/python run.py info
if ! .venv/bin/python -c "import sys; from minirt import native; sys.exit(0 if native.available else 1)"; then
    echo "WARNING: the native kernels are not active (see 'native kernels' above): minirt runs at numpy speed." >&2
    echo "         Install cffi's backend (sudo apt install python3-cffi-backend) and run install.sh again." >&2
fi
echo "installed: run the model with .venv/bin/python run.py run INPUT.npy (or classify / folder / serve)"
"""

_README = """minirt package: {source} for {target} ({description})

On the device (Raspberry Pi OS / Debian: sudo apt install python3-venv python3-numpy python3-cffi-backend),
offline:

    sh install.sh                                   # the runtime into .venv, then check + info
    .venv/bin/python run.py run INPUT.npy           # one run (.npy for a one-input model, .npz by name, .json)
    .venv/bin/python run.py classify INPUT.npy      # the top classes of a one-output model
    .venv/bin/python run.py folder INPUTS/ --out results.jsonl
    .venv/bin/python run.py serve --port 8080       # POST /run {{"inputs": {{name: nested list}}}}

Files: model.mrt (sha256 {model_sha}), wheels/{wheel} (minirt {version}{reduced}), run.py, install.sh,
manifest.json (every file's sha256: run.py check).
"""


def package(model: str, target: str = "generic", output: str | None = None, *, wheel: str | None = None,
            wheel_dir: str | None = None, reduced: bool = False, archive: bool = False, progress=None,
            **build_options) -> PackageReport:
    """Write the package of ``model`` for ``target`` to ``output`` (a folder; with ``archive`` a .tar.gz
    of it).  ``build_options``: the keyword arguments of :func:`minirt.builder.build`."""
    from minirt import __version__
    from minirt.builder import build
    from minirt.format import reader
    from minirt.targets.profiles import get_target

    start = time.perf_counter()
    try:
        profile = get_target(target)
    except ValueError as exc:
        raise BuildError(str(exc)) from None
    model_path = Path(model)
    if not model_path.is_file():
        raise BuildError(f"{model}: no such model file")
    out = Path(output) if output else model_path.with_suffix("").with_name(model_path.stem + f"-{target}")
    if archive and not out.name.endswith(".tar.gz"):
        out = out.with_name(out.name + ".tar.gz")
    arch = profile.arch if profile.arch != "any" else _HOST_MACHINES.get(platform.machine().lower(), "any")
    if arch not in _WHEEL_MACHINES:
        raise BuildError(f"target {target!r} names no CPU architecture (arch {profile.arch!r}): package for a device "
                         f"target ({', '.join(n for n in ('rpi3', 'rpi4', 'rpi5', 'x86-64-v3', 'host'))}, ...)")

    # the runtime wheel first: a missing one fails before the (slow) build
    if wheel:
        wheel_path = Path(wheel)
        if not wheel_path.is_file():
            raise BuildError(f"--wheel {wheel}: no such file")
        if _wheel_machine(wheel_path.name) not in _WHEEL_MACHINES[arch]:
            made_for = _wheel_machine(wheel_path.name) or "an unknown platform"
            raise BuildError(f"--wheel {wheel_path.name} is for {made_for}, target {target!r} needs "
                             f"{' or '.join(_WHEEL_MACHINES[arch])}")
    else:
        root = source_root()
        wdir = Path(wheel_dir) if wheel_dir else (root / "dist" if root else Path("dist"))
        wheel_path = find_wheel(arch, wdir)
        if wheel_path is None:
            if _HOST_MACHINES.get(platform.machine().lower()) != arch:
                raise BuildError(f"no runtime wheel for {' / '.join(_WHEEL_MACHINES[arch])} (target {target!r}) in "
                                 f"{wdir}: build it with `make wheels` (or pass --wheel PATH)")
            wheel_path = build_host_wheel(wdir, progress)

    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        folder = work / "package"
        (folder / "wheels").mkdir(parents=True)
        if progress:
            progress(f"building {model_path.name} for {target}")
        build(str(model_path), str(folder / "model.mrt"), target=target, progress=progress, **build_options)
        artifact = reader.load(str(folder / "model.mrt"))
        full_size = wheel_path.stat().st_size
        families: list = []
        if reduced:
            packed_wheel, families = reduce_wheel(wheel_path, artifact, folder / "wheels")
        else:
            packed_wheel = folder / "wheels" / wheel_path.name
            shutil.copy2(wheel_path, packed_wheel)
        shutil.copy2(LAUNCHER, folder / "run.py")
        (folder / "install.sh").write_text(_INSTALL_SH.format(wheel=packed_wheel.name))
        os.chmod(folder / "install.sh", 0o755)
        model_sha = sha256_file(folder / "model.mrt")
        (folder / "README.txt").write_text(_README.format(
            source=model_path.name, target=target, description=profile.description, model_sha=model_sha,
            wheel=packed_wheel.name, version=__version__,
            reduced=f", reduced to the kernel families {', '.join(families)}" if reduced else ""))
        files = {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}
        signer = artifact.signer
        manifest = {
            "format": MANIFEST_FORMAT,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "minirt_version": __version__,
            "model": {"file": "model.mrt", "sha256": model_sha, "bytes": (folder / "model.mrt").stat().st_size,
                      "source": model_path.name, "source_sha256": sha256_file(model_path),
                      "signed": signer is not None,
                      **({"signature": {"algorithm": signer[0], "public_key": bytes(signer[1]).hex()}}
                         if signer is not None else {})},
            "target": {"name": target, "description": profile.description, "arch": arch,
                       "wheel_platforms": list(_WHEEL_MACHINES[arch]), "os": profile.os,
                       "cpu_features": list(profile.cpu_features), "python": ">=3.9", "numpy": ">=1.21",
                       "providers": list(profile.providers)},
            "runtime_wheel": {"file": f"wheels/{packed_wheel.name}", "bytes": packed_wheel.stat().st_size,
                              "full_bytes": full_size, "reduced": reduced, "kernel_families": families},
            "files": files,
        }
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if archive:
            tmp_archive = work / out.name
            with tarfile.open(tmp_archive, "w:gz") as tar:
                tar.add(folder, arcname=out.name[: -len(".tar.gz")])
            os.replace(tmp_archive, out)
        else:
            if out.exists():
                if not (out / "manifest.json").is_file():
                    raise BuildError(f"{out} exists and is not a minirt package: choose another -o")
                shutil.rmtree(out)
            os.replace(folder, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return PackageReport(str(out), target, manifest["model"]["bytes"], packed_wheel.name,
                         manifest["runtime_wheel"]["bytes"], full_size, reduced, families,
                         time.perf_counter() - start)

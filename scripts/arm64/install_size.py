"""Print the size of what the device wheel (MINIRT_WHEEL=runtime, setup.py) would install on this
machine, measured on the full install made here: the minirt package with its compiled module and
bytecode, without what that wheel leaves out (the builder, the targets, the demo data, C sources and
headers, the modules that compile the kernels and minirt verify's off-device Core ML reference:
setup.py's _DESKTOP_ONLY_MODULES).  The device wheel's compiled module also has no symbol table: the
module is counted as a stripped copy of this one (`strip`; it keeps the unwind tables the device
build also drops, so the figure is a slight overestimate).  Run inside the emulated Pi after
`pip install` (scripts/arm64/run-tests.sh)."""
import os
import pathlib
import shutil
import subprocess
import tempfile

import minirt

root = pathlib.Path(minirt.__file__).resolve().parent
left_out_dirs = {"builder", "targets", "demo"}
left_out_modules = {("native", "build_native"), ("native", "build_progress"), ("tools", "mil_eval"),
                    ("tools", "coreml_spec_eval")}


def left_out(rel: pathlib.PurePath) -> bool:
    if rel.parts[0] in left_out_dirs or rel.suffix in (".c", ".h"):
        return True
    folder = rel.parts[0] if len(rel.parts) > 1 else ""
    stem = rel.name.split(".")[0]  # (x.py and __pycache__/x.cpython-311.pyc)
    return (folder, stem) in left_out_modules


def stripped_size(path: pathlib.Path) -> int:
    strip = shutil.which("strip")
    if strip is None:
        return path.stat().st_size
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, path.name)
        shutil.copyfile(path, copy)
        if subprocess.run([strip, "-s", copy], capture_output=True).returncode != 0:
            return path.stat().st_size
        return os.path.getsize(copy)


total = module = 0
for path in root.rglob("*"):
    if not path.is_file():
        continue
    rel = path.relative_to(root)
    if left_out(rel):
        continue
    size = path.stat().st_size
    if path.name.startswith("_kernels") and path.suffix in (".so", ".pyd"):
        size = stripped_size(path)
        module += size
    total += size
print(f"device install (runtime wheel contents, bytecode included): {total / 1e6:.2f} MB, "
      f"of which the compiled module {module / 1e6:.2f} MB (stripped)")

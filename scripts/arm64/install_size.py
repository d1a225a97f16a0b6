"""Print the size of what the device wheel (MINIRT_WHEEL=runtime, setup.py) would install on this
machine, measured on the full install made here: the minirt package with its compiled module and
bytecode, without the builder, the targets, the demo data and the C sources (what that wheel leaves
out).  Run inside the emulated Pi after `pip install` (scripts/arm64/run-tests.sh)."""
import pathlib

import minirt

root = pathlib.Path(minirt.__file__).resolve().parent
left_out_dirs = {"builder", "targets", "demo"}
total = module = 0
for path in root.rglob("*"):
    if not path.is_file():
        continue
    rel = path.relative_to(root)
    if rel.parts[0] in left_out_dirs or path.suffix == ".c" or (path.suffix == ".h" and path.name != "kernels.h"):
        continue
    total += path.stat().st_size
    if path.name.startswith("_kernels") and path.suffix in (".so", ".pyd"):
        module += path.stat().st_size
print(f"device install (runtime wheel contents, bytecode included): {total / 1e6:.2f} MB, "
      f"of which the compiled module {module / 1e6:.2f} MB")

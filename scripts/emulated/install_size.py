"""Print the size of the installed minirt runtime (the device wheel, MINIRT_WHEEL=runtime, as pip installed
it): the package folder with the bytecode pip compiled, and without it, and its compiled module.  Run
inside the emulated Pi after `pip install minirt-*.whl` (scripts/emulated/run-tests.sh)."""
import pathlib

import minirt

root = pathlib.Path(minirt.__file__).resolve().parent
total = bytecode = module = 0
for path in root.rglob("*"):
    if not path.is_file():
        continue
    size = path.stat().st_size
    total += size
    if "__pycache__" in path.parts:
        bytecode += size
    if path.name.startswith("_kernels") and path.suffix in (".so", ".pyd"):
        module += size
print(f"installed runtime ({root}): {total / 1e6:.2f} MB with bytecode, {(total - bytecode) / 1e6:.2f} MB without, "
      f"of which the compiled module {module / 1e6:.2f} MB")

"""Pack the device wheel's Python modules into one archive (setup.py runs this on the build folder of a
``MINIRT_WHEEL=runtime`` build; D148, docs/packaging.md).

    python -X no_debug_ranges scripts/zip_runtime.py BUILD_LIB/minirt

Every ``*.py`` under the folder goes into ``_runtime.zip`` beside it, as ``minirt/<path>.py`` (the source,
for tracebacks) and ``minirt/<path>.pyc`` (its bytecode, which zipimport loads), both deflated; the
``.py`` files and bytecode caches leave the folder (its subfolders stay) and ``scripts/device_wheel_init.py``
becomes its ``__init__.py``.  What is not Python (the compiled module, py.typed) stays where it is.

Invariants:
- the bytecode is compiled by the interpreter that builds the wheel, i.e. the Python version of the
  wheel's tag; a different version finds a foreign magic number and zipimport compiles the source
  instead (slower imports, same behaviour);
- each ``.pyc`` is an unchecked hash-based one (no timestamp to compare, nothing read twice at import);
  its file name in tracebacks is ``minirt/<path>.py``, whose lines zipimport serves from the archive;
- ``-X no_debug_ranges`` leaves out the column ranges of every instruction (tracebacks keep their line
  numbers but lose the ^^^ markers): a third smaller archive;
- entries are sorted and dated 1980-01-01, so the same tree gives the same bytes.
"""
from __future__ import annotations

import os
import py_compile
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

ARCHIVE = "_runtime.zip"
STUB = Path(__file__).resolve().parent / "device_wheel_init.py"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _entry(name: str, data: bytes, archive: zipfile.ZipFile) -> None:
    info = zipfile.ZipInfo(name, _EPOCH)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    archive.writestr(info, data, compresslevel=9)


def pack(package: Path) -> Path:
    """Pack the modules of ``package`` (a folder named minirt) into ``package/_runtime.zip``; returns it."""
    if package.name != "minirt" or not (package / "__init__.py").is_file():
        raise SystemExit(f"zip_runtime: {package} is not the minirt package folder (expected minirt/__init__.py)")
    sources = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    target = package / ARCHIVE
    with tempfile.TemporaryDirectory() as scratch, zipfile.ZipFile(target, "w") as archive:
        compiled = Path(scratch) / "module.pyc"
        for source in sources:
            name = "minirt/" + source.relative_to(package).as_posix()
            py_compile.compile(str(source), cfile=str(compiled), dfile=name, doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
            _entry(name, source.read_bytes(), archive)
            _entry(name + "c", compiled.read_bytes(), archive)
    for source in sources:
        source.unlink()
    # (the folders stay, even empty: build_ext may write the compiled module into native/ after this)
    for cache in [p for p in package.rglob("__pycache__") if p.is_dir()]:
        shutil.rmtree(cache)
    (package / "__init__.py").write_bytes(STUB.read_bytes())
    return target


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    target = pack(Path(argv[0]).resolve())
    print(f"zip_runtime: {target} ({os.path.getsize(target):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

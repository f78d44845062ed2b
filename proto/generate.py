"""Generate the Python code of rlcore's wire schema from proto/rlcore/v1/*.proto.

    python proto/generate.py          # (re)write proto/rlcore/v1/*_pb2*.py and *.pyi
    python proto/generate.py --check  # exit 1 if the committed files differ from a fresh build

The output is importable as `rlcore.proto.v1.<name>_pb2` (pyproject maps `rlcore.proto` to
proto/rlcore). protoc writes absolute imports (`from rlcore.v1 import common_pb2`) that follow the
proto package; they are rewritten to relative imports so the modules live inside `rlcore.proto`.
Pinned grpcio-tools (see pyproject's test extra) makes the output byte-for-byte reproducible.
"""

from __future__ import annotations

import argparse
import filecmp
import glob
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(HERE, "rlcore", "v1")
_ABSOLUTE_IMPORT = re.compile(r"^from rlcore\.v1 import (\w+_pb2)", re.MULTILINE)


def generate(out_dir: str) -> list[str]:
    """Compile every .proto into `out_dir`/rlcore/v1; return the generated file names."""
    from grpc_tools import protoc

    protos = sorted(glob.glob(os.path.join(PACKAGE_DIR, "*.proto")))
    assert protos, f"no .proto files in {PACKAGE_DIR}"
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    args = ["protoc", f"-I{HERE}", f"-I{include}", f"--python_out={out_dir}", f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}"] + [os.path.relpath(p, HERE) for p in protos]  # fmt: skip
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed (see the messages above)")
    gen_dir = os.path.join(out_dir, "rlcore", "v1")
    names = sorted(n for n in os.listdir(gen_dir) if n.endswith((".py", ".pyi")))
    for name in names:
        path = os.path.join(gen_dir, name)
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(_ABSOLUTE_IMPORT.sub(r"from . import \1", text))
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the committed files instead")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        names = generate(tmp)
        fresh = os.path.join(tmp, "rlcore", "v1")
        if args.check:
            stale = [
                n
                for n in names
                if not os.path.isfile(os.path.join(PACKAGE_DIR, n))
                or not filecmp.cmp(os.path.join(fresh, n), os.path.join(PACKAGE_DIR, n), shallow=False)
            ]
            if stale:
                print(
                    f"generated code is stale: {', '.join(stale)}; run `python proto/generate.py` and commit",
                    file=sys.stderr,
                )
                return 1
            print(f"generated code is up to date ({len(names)} files)")
            return 0
        for n in names:
            os.replace(os.path.join(fresh, n), os.path.join(PACKAGE_DIR, n))
        print(f"wrote {len(names)} files to {PACKAGE_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Checks that every library folder includes only from the folders below it.

The layers (docs/architecture.md):

    shim/         may include everything below
    observe/      base, cuda, cupti_trace, trace, policy
    cupti_trace/  base, cuda
    cuda/         base
    policy/       nothing (the standard library)
    trace/        nothing (the standard library)
    base/         nothing of the repository

An include is resolved as the compiler would find it: next to the file, then
in each folder's own include directory. Exits 1 and names every forbidden
include; `--root DIR` checks another tree (the tests do, to see it fail).
"""
import argparse
import pathlib
import re
import sys

ALLOWED = {
    "base": set(),
    "cuda": {"base"},
    "policy": set(),
    "trace": set(),
    "cupti_trace": {"base", "cuda"},
    "observe": {"base", "cuda", "cupti_trace", "trace", "policy"},
    "shim": {"base", "cuda", "cupti_trace", "observe", "trace", "policy"},
}
# Where each folder's headers are found by the compiler (its include dirs).
INCLUDE_DIRS = {
    "base": ["base"],
    "cuda": ["cuda"],
    "policy": ["policy"],
    "trace": ["trace/include", "trace/src"],
    "cupti_trace": ["cupti_trace"],
    "observe": ["observe"],
    "shim": ["shim/src", "shim/include"],
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCES = (".h", ".hpp", ".cpp", ".c", ".def")


def folder_of(root, path):
    rel = path.relative_to(root).parts
    return rel[0] if rel and rel[0] in ALLOWED else None


def resolve(root, source, name):
    """The folder whose file `name` names, or None if not the repository's."""
    local = source.parent / name
    if local.exists():
        return folder_of(root, local.resolve())
    for folder, dirs in INCLUDE_DIRS.items():
        for d in dirs:
            if (root / d / name).exists():
                return folder
    return None


def check(root):
    root = root.resolve()
    problems, seen = [], 0
    for folder in ALLOWED:
        base = root / folder
        if not base.is_dir():
            problems.append(f"{folder}/: missing")
            continue
        if not (base / "README.md").exists():
            problems.append(f"{folder}/README.md: missing (say what is here and what it may include)")
        for path in sorted(base.rglob("*")):
            if path.suffix not in SOURCES or not path.is_file():
                continue
            for name in INCLUDE.findall(path.read_text(errors="replace")):
                seen += 1
                target = resolve(root, path, name)
                if target and target != folder and target not in ALLOWED[folder]:
                    problems.append(
                        f"{path.relative_to(root)}: includes \"{name}\" from {target}/, "
                        f"but {folder}/ may include only from "
                        f"{', '.join(sorted(ALLOWED[folder])) or 'nothing of the repository'}")
    return problems, seen


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=pathlib.Path(__file__).resolve().parent.parent, type=pathlib.Path)
    args = ap.parse_args()
    problems, seen = check(args.root)
    for p in problems:
        print(p)
    print(f"layering: {seen} includes checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

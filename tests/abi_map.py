#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Description: lib/moepager.map, the library's exports and the public headers agree.

  abi_map.py MAP LIBMOEPAGER.SO HEADER...

Every exported symbol is named in the map (no wildcard) and declared MP_API in
a header; every name in the map is exported; every MP_API declaration is.
"""
import re
import subprocess
import sys


def main():
    map_path, lib, headers = sys.argv[1], sys.argv[2], sys.argv[3:]
    text = open(map_path).read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    if re.search(r"^\s*mp_\w*\*", text, re.M):
        print(f"{map_path}: a wildcard export")
        return 1
    in_map = set(re.findall(r"^\s*(mp_\w+)\s*;", text, re.M))
    nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True,
                        check=True).stdout
    exported = {line.split()[-1].split("@")[0] for line in nm.splitlines() if line.strip()}
    exported = {s for s in exported if not s.startswith("MOEPAGER_")}
    declared = set()
    for h in headers:
        src = re.sub(r"/\*.*?\*/", "", open(h).read(), flags=re.S)
        for decl in re.findall(r"\bMP_API\b[^;{]*;", src):
            m = re.findall(r"\b(mp_\w+)\s*(?:\(|;|\[)", decl)
            if m:
                declared.add(m[0])
    bad = 0
    for name, missing_from in (("exported but not in the map", exported - in_map),
                               ("in the map but not exported", in_map - exported),
                               ("exported but declared in no header", exported - declared),
                               ("declared MP_API but not exported", declared - exported)):
        for s in sorted(missing_from):
            print(f"{s}: {name}")
            bad += 1
    print(f"{len(in_map)} symbols in the map, {len(exported)} exported, {len(declared)} declared")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/bin/sh
# SPDX-License-Identifier: MIT
# Makes ROOT an include root holding only the given links: layer_root.sh ROOT TARGET LINK ...
# (meson.build runs it at configure time for every layer; see docs/architecture.md).
set -eu
root=$1
shift
rm -rf "$root"
mkdir -p "$root"
while [ $# -ge 2 ]; do
	ln -s "$1" "$2"
	shift 2
done

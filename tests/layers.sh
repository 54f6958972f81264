#!/bin/sh
# SPDX-License-Identifier: MIT
# Description: the build's layering holds: from each layer's include setup, a
# header of every layer it may use compiles and a header of every other layer
# does not (docs/architecture.md).
#
#   layers.sh CC LAYER ROOT INCDIRS -- USED... -- OTHER...
#
# INCDIRS is a colon-separated list of the public include directories the
# layer compiles with; USED and OTHER are LAYER=HEADER pairs, HEADER quoted
# as in an #include ("pager/hooks.h" or <moepager/pager.h>).
set -u
cc=$1 layer=$2 root=$3 incdirs=$4
shift 4
[ "$1" = "--" ] && shift
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
set -f
flags="-std=c17 -D_GNU_SOURCE -fsyntax-only -I$root"
IFS=:
for d in $incdirs; do flags="$flags -I$d"; done
unset IFS
fail=0
want=ok
for pair in "$@"; do
	if [ "$pair" = "--" ]; then
		want=refused
		continue
	fi
	other=${pair%%=*}
	hdr=${pair#*=}
	printf '#include %s\nint layers_probe;\n' "$hdr" > "$tmp/probe.c"
	# shellcheck disable=SC2086
	if $cc $flags -c "$tmp/probe.c" -o /dev/null 2> "$tmp/err"; then
		got=ok
	else
		got=refused
	fi
	if [ "$got" = "$want" ]; then
		printf 'layer %-8s including %-9s %-28s %s, as it must\n' "$layer" "$other" "$hdr" "$got"
	else
		printf 'layer %-8s including %-9s %-28s %s: WRONG (want %s)\n' "$layer" "$other" "$hdr" \
			"$got" "$want"
		sed 's/^/    /' "$tmp/err" | head -5
		fail=1
	fi
done
exit $fail

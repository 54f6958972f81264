#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs a libFuzzer target for SECONDS on a scratch copy of its seed corpus.
# usage: run.sh FUZZER SECONDS SEED_DIR [libFuzzer flags...]
# Exit status: 0 when nothing was found, 1 when something was. Crash inputs land in the
# current directory as crash-*/leak-*/timeout-* files.
set -eu
fuzzer=$1 seconds=$2 seeds=$3
shift 3
work=$(mktemp -d "${TMPDIR:-/tmp}/mpfuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -R "$seeds"/. "$work"/
# A finding must fail the test: libFuzzer's default error exit code, 77, is meson's "skipped".
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	-error_exitcode=1 -timeout_exitcode=1 \
	"$@" "$work"

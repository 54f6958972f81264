#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs a libFuzzer target for SECONDS on a scratch copy of its seed corpus.
# usage: run.sh FUZZER SECONDS SEED_DIR [libFuzzer flags...]
# Exit status: the fuzzer's (0: nothing found). Crash inputs land in the
# current directory as crash-*/leak-*/timeout-* files.
set -eu
fuzzer=$1 seconds=$2 seeds=$3
shift 3
work=$(mktemp -d "${TMPDIR:-/tmp}/mpfuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
cp -R "$seeds"/. "$work"/
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
	"$@" "$work"

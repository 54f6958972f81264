# SPDX-License-Identifier: MIT
# Sourced by the CLI test scripts: ok/bad/check count failures in $fails.
fails=0

ok() { printf 'ok: %s\n' "$*"; }
bad() {
	printf 'FAIL: %s\n' "$*"
	fails=$((fails + 1))
}
check() {	# check DESCRIPTION COMMAND...
	local what=$1
	shift
	if "$@"; then ok "$what"; else bad "$what"; fi
}

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
refused_by() {	# refused_by MESSAGE COMMAND...: COMMAND fails, saying MESSAGE ($T/err keeps it)
	local msg=$1
	shift
	"$@" >/dev/null 2>"$T/err" && return 1
	grep -q -- "$msg" "$T/err" || { cat "$T/err"; return 1; }
}

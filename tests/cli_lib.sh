# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# Sourced by the CLI test scripts (tests/cli_*.sh, serve_lib.sh): a scratch directory $T,
# removed at exit after the children listed in $KILL (servers, daemons) are killed;
# ok/bad/check count failures in $fails; refused_by; wait_port.
T=$(mktemp -d)
KILL=()

cli_exit() {
	local p
	for p in "${KILL[@]}"; do kill -9 "$p" 2>/dev/null; done
	rm -rf "$T"
}
trap cli_exit EXIT

forget() {	# forget PID: a child that was reaped, no longer killed at exit
	local p keep=()
	for p in "${KILL[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
	KILL=("${keep[@]}")
}

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

# wait_port FILE PID: prints the port a server writes to FILE once it listens, waiting up
# to 20 s; fails if PID exits first or the time runs out.
wait_port() {
	for _ in $(seq 400); do
		[[ -s $1 ]] && { cat "$1"; return 0; }
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.05
	done
	return 1
}

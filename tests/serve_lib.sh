# SPDX-License-Identifier: MIT
# Sourced by the `moepager serve` test scripts (after MOEPAGER is set): a scratch
# directory $T removed at exit with the server, ok/bad/check, and starting and stopping it.
T=$(mktemp -d)
SERVER=

cleanup() {
	[[ -n $SERVER ]] && kill -9 "$SERVER" 2>/dev/null
	rm -rf "$T"
}
trap cleanup EXIT

. "$(dirname "${BASH_SOURCE[0]}")/check_lib.sh"

# serve_start ARGS...: runs the server, waits for its port file, sets PORT, URL and SERVER.
serve_start() {
	rm -f "$T/port"
	"$MOEPAGER" serve --listen 127.0.0.1:0 --port-file "$T/port" "$@" \
		>"$T/server.out" 2>"$T/server.err" &
	SERVER=$!
	for _ in $(seq 400); do
		[[ -s $T/port ]] && break
		kill -0 "$SERVER" 2>/dev/null || { cat "$T/server.err"; return 1; }
		sleep 0.05
	done
	PORT=$(cat "$T/port")
	URL=http://127.0.0.1:$PORT
}

# stop: SIGTERM, and the server's exit status.
stop() {
	kill -TERM "$SERVER"
	wait "$SERVER"
	local st=$?
	SERVER=
	return $st
}

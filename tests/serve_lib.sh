# SPDX-License-Identifier: MIT
# Sourced by the `moepager serve` test scripts (after MOEPAGER is set): cli_lib.sh, and
# starting and stopping the server.
. "$(dirname "${BASH_SOURCE[0]}")/cli_lib.sh"
SERVER=

# serve_start ARGS...: runs the server, waits for its port file, sets PORT, URL and SERVER.
serve_start() {
	rm -f "$T/port"
	"$MOEPAGER" serve --listen 127.0.0.1:0 --port-file "$T/port" "$@" \
		>"$T/server.out" 2>"$T/server.err" &
	SERVER=$!
	KILL+=("$SERVER")
	PORT=$(wait_port "$T/port" "$SERVER") || { cat "$T/server.err"; return 1; }
	URL=http://127.0.0.1:$PORT
}

# stop: SIGTERM, and the server's exit status.
stop() {
	kill -TERM "$SERVER"
	wait "$SERVER"
	local st=$?
	forget "$SERVER"
	SERVER=
	return $st
}

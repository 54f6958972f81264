/* SPDX-License-Identifier: MIT */
/*
 * The HTTP front end of `moepager serve` (libmicrohttpd): OpenAI-style
 * POST /v1/completions (JSON or server-sent events), GET /v1/models,
 * /health and /metrics, over a backend. One epoll thread answers; requests
 * waiting for tokens are suspended, and resumed by it when the backend's
 * callbacks hand them back, so no thread is held per connection.
 */
#ifndef MP_SERVE_HTTP_H
#define MP_SERVE_HTTP_H

#include <stdint.h>

#include "serve/backend.h"

struct http_config {
	const char *host;		/* address to listen on: "127.0.0.1" */
	uint16_t port;			/* 0: any free port (see http_port()) */
	uint32_t max_connections;	/* 0: 256 */
	uint32_t max_body;		/* request body bytes; 0: 1 MiB */
	uint32_t idle_timeout_s;	/* a connection with nothing happening; 0: 15 */
	uint32_t header_timeout_s;	/* to send the headers of a request; 0: 10 */
	uint32_t body_timeout_s;	/* to send its body; 0: 30 */
	/*
	 * A stream's bytes wait until this long after its last write (its
	 * first token and its end go at once): the tokens of the steps
	 * between leave in one write, one wake-up. 0: after every step.
	 */
	uint32_t stream_interval_us;
	/*
	 * NULL: anyone who reaches the address is served. Else every endpoint
	 * but GET /health answers 401 without "Authorization: Bearer api_key".
	 */
	const char *api_key;
	uint64_t epoch;			/* the pool epoch the server joined at (--epoch) */
	double ready_s;			/* start to ready: backend open and warmed */
	double warm_s;			/* of which warming (--warm) */
};

struct http_server;

/* Starts listening. Returns 0, or a negative errno after printing why. */
int http_start(const struct http_config *cfg, struct serve_backend *b, struct http_server **out);
uint16_t http_port(const struct http_server *h);
/* Appends the HTTP counters and the backend's metrics (GET /metrics). */
void http_metrics(struct http_server *h, struct strbuf *o);

/*
 * Housekeeping, every few hundred ms from the main thread: closes
 * connections too slow to send their requests, and notices clients that
 * left while their request waited.
 */
void http_tick(struct http_server *h);

/*
 * Shutting down: stop accepting, let running requests finish for grace_ms
 * (new ones get 503), then end the rest with an error, and stop. The backend
 * is closed here. Returns the number of requests that had to be cut short.
 */
uint32_t http_stop(struct http_server *h, uint32_t grace_ms);

#endif /* MP_SERVE_HTTP_H */

/* SPDX-License-Identifier: MIT */
/* A growing text buffer with printf-style appends (metrics, SSE events). */
#ifndef MP_SERVE_STRBUF_H
#define MP_SERVE_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

struct strbuf {
	char *s;
	size_t len, cap;
	bool oom;		/* an append failed: the text is incomplete */
};

void sb_init(struct strbuf *b);
void sb_free(struct strbuf *b);
void sb_add(struct strbuf *b, const char *data, size_t len);
void sb_printf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drops the first n bytes. */
void sb_consume(struct strbuf *b, size_t n);

#endif /* MP_SERVE_STRBUF_H */

// SPDX-License-Identifier: MIT
/* A growing text buffer with printf-style appends (see strbuf.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/strbuf.h"

void sb_init(struct strbuf *b)
{
	memset(b, 0, sizeof(*b));
}

void sb_free(struct strbuf *b)
{
	free(b->s);
	sb_init(b);
}

static bool reserve(struct strbuf *b, size_t more)
{
	size_t cap = b->cap ? b->cap : 256;
	char *s;

	if (b->oom)
		return false;
	if (b->len + more + 1 <= b->cap)
		return true;
	while (cap < b->len + more + 1)
		cap *= 2;
	s = realloc(b->s, cap);
	if (!s) {
		b->oom = true;
		return false;
	}
	b->s = s;
	b->cap = cap;
	return true;
}

void sb_add(struct strbuf *b, const char *data, size_t len)
{
	if (!reserve(b, len))
		return;
	memcpy(b->s + b->len, data, len);
	b->len += len;
	b->s[b->len] = '\0';
}

void sb_printf(struct strbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0 || !reserve(b, (size_t)n))
		return;
	va_start(ap, fmt);
	vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

void sb_consume(struct strbuf *b, size_t n)
{
	if (n >= b->len) {
		b->len = 0;
	} else {
		memmove(b->s, b->s + n, b->len - n);
		b->len -= n;
	}
	if (b->s)
		b->s[b->len] = '\0';
}

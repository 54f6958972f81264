// SPDX-License-Identifier: MIT
/*
 * How an engine builds against an installed moepager: compiled only with
 * `cc example.c $(pkg-config --cflags --libs moepager)`; opens the model on
 * argv[1] and prints its geometry and the library version.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <moepager.h>

static void log_line(enum mp_log_level level, const char *msg, void *arg)
{
	(void)arg;
	if (level <= MP_LOG_WARN)
		fprintf(stderr, "moepager: %s\n", msg);
}

int main(int argc, char **argv)
{
	const struct mp_geometry *g;
	struct mp_store *s;
	int err;

	if (argc != 2) {
		fprintf(stderr, "usage: %s MODEL.mpk\n", argv[0]);
		return 2;
	}
	printf("moepager headers %s, library %s\n", MP_VERSION_STRING, mp_version_string());
	/* A library older than the headers may lack what they declare. */
	if (mp_version_major() != MP_VERSION_MAJOR || mp_version_minor() < MP_VERSION_MINOR) {
		fprintf(stderr, "example: built against %s but loaded %s\n", MP_VERSION_STRING,
			mp_version_string());
		return 1;
	}
	mp_set_log_handler(log_line, NULL);
	err = mp_store_open(argv[1], &s);
	if (err) {
		fprintf(stderr, "example: %s: %s\n", argv[1], strerror(-err));
		return 1;
	}
	g = mp_store_geometry(s);
	printf("model %s: %u layers x %u experts (top-%u), hidden %u, ffn %u, heads %u/%u, "
	       "vocab %u, %s\n", argv[1], g->layers, g->experts, g->topk, g->hidden, g->ffn,
	       g->heads, g->kv_heads, g->vocab, mp_dtype_name(g->dtype));
	printf("expert bytes %llu, all experts %llu\n",
	       (unsigned long long)mp_store_expert_bytes(s),
	       (unsigned long long)mp_store_total_expert_bytes(s));
	mp_store_close(s);
	return 0;
}

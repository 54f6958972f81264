// SPDX-License-Identifier: MIT
/*
 * libFuzzer target: the GGUF reader on any bytes, then the import of what
 * it accepts. A file that opens is walked (every key through the typed
 * getters, every tensor found by name and read) and its promises checked;
 * a small enough model (at most 64 experts) is imported, which runs the
 * architecture, hyperparameter and tensor checks and the conversions; and
 * every file that opens is laid out as a file image (lib/pager/image.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <moepager.h>

#include "pager/image_priv.h"
#include "store/gguf.h"

/* Bytes of tensor data read per input (the rest is skipped). */
#define READ_BUDGET	(1u << 20)
#define MAX_EXPERTS	64u

static int fd = -1;
static char path[64], dir[64], out[96];

#define CHECK(c) do {							\
	if (!(c)) {							\
		fprintf(stderr, "fuzz_gguf: broken promise: %s\n", #c);	\
		__builtin_trap();					\
	}								\
} while (0)

static void walk(struct gguf_file *g)
{
	uint64_t budget = READ_BUDGET;
	const char *str;
	uint32_t u;
	float f;

	CHECK(g->alignment && !(g->alignment & (g->alignment - 1)));
	for (uint64_t i = 0; i < g->n_kv; i++) {
		const struct gguf_kv *kv = &g->kv[i];

		CHECK(kv->key && gguf_find_kv(g, kv->key) == kv && kv->type < GGUF_TYPE_COUNT);
		CHECK(kv->off <= g->size);
		(void)gguf_get_u32(g, kv->key, &u);
		(void)gguf_get_f32(g, kv->key, &f);
		if (!gguf_get_str(g, kv->key, &str))
			CHECK(str && kv->type == GGUF_STRING);
	}
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct gguf_tensor *t = &g->t[i];
		void *buf;

		CHECK(gguf_find_tensor(g, t->name) == t && strlen(t->name) < GGUF_NAME_MAX);
		CHECK(t->off >= g->data_off && t->off <= g->size && t->bytes <= g->size - t->off);
		CHECK((t->off - g->data_off) % g->alignment == 0);
		if (t->bytes > budget)
			continue;
		budget -= t->bytes;
		buf = malloc(t->bytes ? t->bytes : 1);
		if (buf)
			CHECK(gguf_read(g, t, 0, buf, t->bytes) == 0);
		free(buf);
	}
}

/* Experts the import would write: the file's own claim, checked before trusting it. */
static uint64_t claimed_experts(struct gguf_file *g)
{
	const char *arch;
	char key[128];
	uint32_t layers = 0, experts = 0;

	if (gguf_get_str(g, "general.architecture", &arch))
		return 0;
	snprintf(key, sizeof(key), "%s.block_count", arch);
	(void)gguf_get_u32(g, key, &layers);
	snprintf(key, sizeof(key), "%s.expert_count", arch);
	(void)gguf_get_u32(g, key, &experts);
	return (uint64_t)layers * experts;
}

/* The image's layout: every page fixed or expert, no expert bigger than all of them. */
static void image_layout(void)
{
	struct mp_image_stats st;
	int ret = mp_image_layout(path, &st);

	CHECK(ret <= 0);
	if (ret)
		return;
	CHECK(st.fixed_bytes + st.expert_bytes == (st.file_bytes + 4095) / 4096 * 4096);
	CHECK(st.expert_max_bytes <= st.expert_bytes && st.layers && st.experts);
}

static void run(const uint8_t *d, size_t n)
{
	struct gguf_file *g = NULL;
	uint64_t experts;
	int ret;

	if (ftruncate(fd, 0) || pwrite(fd, d, n, 0) != (ssize_t)n)
		return;
	ret = gguf_open(path, &g);
	CHECK(ret <= 0);
	if (ret) {
		CHECK(g == NULL);
		return;
	}
	walk(g);
	experts = claimed_experts(g);
	gguf_close(g);
	image_layout();
	if (experts && experts <= MAX_EXPERTS) {
		struct mp_import_config cfg = { .dtype = -1, .max_seq = 64 };

		ret = mp_gguf_import(path, out, &cfg);
		CHECK(ret <= 0);
		if (!ret) {
			struct mp_store *s;

			CHECK(mp_store_open(out, &s) == 0);
			CHECK(mp_store_verify(s, NULL, 0, NULL, NULL) == 0);
			mp_store_close(s);
		}
		unlink(out);
	}
}

static void remove_dir(void)
{
	unlink(out);
	rmdir(dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (fd < 0) {
		fd = memfd_create("fuzz.gguf", MFD_CLOEXEC);
		/* tmpfs where there is one: each accepted input writes and syncs an .mpk */
		snprintf(dir, sizeof(dir), "%s/fuzz_gguf.XXXXXX",
			 access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm");
		if (fd < 0 || !mkdtemp(dir)) {
			perror("fuzz_gguf setup");
			abort();
		}
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		snprintf(out, sizeof(out), "%s/out.mpk", dir);
		atexit(remove_dir);
	}
	run(data, size);
	return 0;
}

// SPDX-License-Identifier: MIT
/*
 * Writes the .mpk fuzz seeds into DIR: small models whose experts are all
 * zeros, cut after their last tensor. fuzz_mpk extends an input with zeros
 * up to the header's file_bytes, so each seed reads as a complete, valid
 * file while being a few pages long instead of megabytes. With a second
 * directory, also the .mpa seeds of fuzz_mpa: small adapters of one model;
 * with a third, the .mpc seeds of fuzz_mpc: maps of one, two and three models.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <moepager.h>

static int write_seed(const char *dir, const char *name, const struct mp_geometry *g)
{
	char path[4096];
	struct mp_store_writer *w;
	struct mp_store *s;
	uint64_t end = 0, xb = mp_geometry_expert_bytes(g);
	uint8_t *zero = calloc(1, xb);
	int err;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (!zero)
		return -ENOMEM;
	err = mp_store_writer_create(path, g, name, &w);
	if (err)
		goto out;
	for (uint32_t i = 0; !err && i < mp_store_writer_tensor_count(w); i++) {
		const struct mp_tensor_info *t = mp_store_writer_tensor_at(w, i);
		uint8_t *b = malloc(t->bytes);

		if (!b) {
			err = -ENOMEM;
			break;
		}
		/* Small values of any type: the reader does not look at them, only hashes them. */
		for (uint64_t j = 0; j < t->bytes; j++)
			b[j] = (uint8_t)(j * 7 + i);
		err = mp_store_writer_put_tensor(w, t->name, b);
		free(b);
	}
	for (uint32_t l = 0; !err && l < g->layers; l++)
		for (uint32_t e = 0; !err && e < g->experts; e++)
			err = mp_store_writer_put_expert(w, l, e, zero);
	if (err) {
		mp_store_writer_abort(w);
		goto out;
	}
	err = mp_store_writer_finish(w);
	if (err)
		goto out;
	/* Cut after the last tensor: what follows (zero experts, holes) comes back as zeros. */
	err = mp_store_open(path, &s);
	if (err)
		goto out;
	for (uint32_t i = 0; i < mp_store_tensor_count(s); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(s, i);

		if (t->offset + t->bytes > end)
			end = t->offset + t->bytes;
	}
	mp_store_close(s);
	if (truncate(path, (off_t)end))
		err = -errno;
out:
	free(zero);
	if (err)
		fprintf(stderr, "mkseed_mpk: %s: %s (%s)\n", path, strerror(-err), mp_last_error());
	return err;
}

/* Adapters of a generated model of geometry g replacing 1, 2 and every expert. */
static int write_adapter_seeds(const char *dir, const struct mp_geometry *g)
{
	char base_path[4096], path[4096];
	uint64_t xb = mp_geometry_expert_bytes(g);
	uint8_t *buf = malloc(xb);
	struct mp_store *base = NULL;
	int err;

	snprintf(base_path, sizeof(base_path), "%s/base.mpk.tmp", dir);
	if (!buf)
		return -ENOMEM;
	err = mp_gen_model(base_path, g, 7, "seed", NULL, NULL);
	if (!err)
		err = mp_store_open(base_path, &base);
	for (uint32_t k = 0, sizes[3] = { 1, 2, g->layers * g->experts }; !err && k < 3; k++) {
		struct mp_adapter_writer *w = NULL;
		uint32_t n = sizes[k];

		snprintf(path, sizeof(path), "%s/n%u.mpa", dir, n);
		err = mp_adapter_writer_create(path, base, "seed", &w);
		for (uint32_t i = 0; !err && i < n; i++) {
			memset(buf, (int)i + 1, xb);
			err = mp_adapter_writer_put(w, i % g->layers, i / g->layers, buf);
		}
		if (!err)
			err = mp_adapter_writer_finish(w);
		else if (w)
			mp_adapter_writer_abort(w);
	}
	mp_store_close(base);
	unlink(base_path);
	free(buf);
	if (err)
		fprintf(stderr, "mkseed_mpk: %s: %s (%s)\n", dir, strerror(-err), mp_last_error());
	return err;
}

/* Maps of the first 1, 2 and 3 of three generated models of geometry g, capacities all, 3, 0. */
static int write_map_seeds(const char *dir, const struct mp_geometry *g)
{
	struct mp_store *m[3] = { NULL, NULL, NULL };
	char path[4096];
	int err = 0;

	for (uint32_t i = 0; !err && i < 3; i++) {
		snprintf(path, sizeof(path), "%s/m%u.mpk.tmp", dir, i);
		err = mp_gen_model(path, g, i + 1, "seed", NULL, NULL);
		if (!err)
			err = mp_store_open(path, &m[i]);
		unlink(path);
	}
	for (uint32_t n = 1; !err && n <= 3; n++) {
		static const uint32_t capacity[] = { 0, ~0u, 3, 0 };
		struct mp_consolidation *c = NULL;
		uint32_t cap = capacity[n] == ~0u ? g->layers * g->experts : capacity[n];

		snprintf(path, sizeof(path), "%s/n%u.mpc", dir, n);
		err = mp_consolidation_build(m, n, cap, NULL, NULL, &c);
		if (!err)
			err = mp_consolidation_write(c, path);
		mp_consolidation_close(c);
	}
	for (uint32_t i = 0; i < 3; i++)
		mp_store_close(m[i]);
	if (err)
		fprintf(stderr, "mkseed_mpk: %s: %s (%s)\n", dir, strerror(-err), mp_last_error());
	return err;
}

int main(int argc, char **argv)
{
	struct mp_geometry a = {
		.layers = 1, .experts = 2, .topk = 1, .hidden = 8, .ffn = 8, .heads = 2,
		.kv_heads = 1, .head_dim = 4, .vocab = 16, .max_seq = 16, .dtype = MP_DTYPE_F32,
		.rope_theta = 10000.0f, .norm_eps = 1e-5f,
	};
	struct mp_geometry b = a, c = a;

	if (argc < 2 || argc > 4) {
		fprintf(stderr, "usage: mkseed_mpk DIR [MPA_DIR [MPC_DIR]]\n");
		return 2;
	}
	b.layers = 2;
	b.experts = 4;
	b.topk = 2;
	b.hidden = 16;
	b.heads = 2;
	b.kv_heads = 2;
	b.head_dim = 8;
	b.vocab = 32;
	b.dtype = MP_DTYPE_BF16;
	c.experts = 3;
	c.dtype = MP_DTYPE_F16;
	if (mkdir(argv[1], 0755) && errno != EEXIST) {
		perror(argv[1]);
		return 1;
	}
	if (write_seed(argv[1], "l1e2-f32.mpk", &a) || write_seed(argv[1], "l2e4-bf16.mpk", &b) ||
	    write_seed(argv[1], "l1e3-f16.mpk", &c))
		return 1;
	if (argc >= 3 && ((mkdir(argv[2], 0755) && errno != EEXIST) ||
			  write_adapter_seeds(argv[2], &b)))
		return 1;
	if (argc == 4 && ((mkdir(argv[3], 0755) && errno != EEXIST) ||
			  write_map_seeds(argv[3], &b)))
		return 1;
	return 0;
}

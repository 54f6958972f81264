// SPDX-License-Identifier: MIT
/*
 * Writes the GGUF fuzz seeds into DIR: small generated models exported as
 * llama.cpp reads them (f32 with placeholder tokens at alignment 32, q8_0
 * experts at alignment 4096, q4_0), each a few KB to a few tens of KB.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <moepager.h>

static int write_seed(const char *dir, const char *name, const struct mp_geometry *g,
		      int dtype, uint32_t alignment)
{
	struct mp_export_config cfg = { .dtype = dtype, .dense_dtype = -1, .alignment = alignment };
	char mpk[4096], gguf[4096];
	struct mp_store *s;
	int err;

	snprintf(mpk, sizeof(mpk), "%s/%s.mpk", dir, name);
	snprintf(gguf, sizeof(gguf), "%s/%s.gguf", dir, name);
	err = mp_gen_model(mpk, g, 1, name, NULL, NULL);
	if (!err)
		err = mp_store_open(mpk, &s);
	if (!err) {
		err = mp_gguf_export(s, gguf, &cfg);
		mp_store_close(s);
	}
	unlink(mpk);
	if (err)
		fprintf(stderr, "mkseed_gguf: %s: %s (%s)\n", gguf, strerror(-err), mp_last_error());
	return err;
}

int main(int argc, char **argv)
{
	struct mp_geometry a = {
		.layers = 1, .experts = 2, .topk = 1, .hidden = 32, .ffn = 32, .heads = 2,
		.kv_heads = 1, .head_dim = 16, .vocab = 16, .max_seq = 16, .dtype = MP_DTYPE_F32,
		.rope_theta = 10000.0f, .norm_eps = 1e-5f,
	};
	struct mp_geometry b = a;

	if (argc != 2) {
		fprintf(stderr, "usage: mkseed_gguf DIR\n");
		return 2;
	}
	b.layers = 2;
	b.experts = 4;
	b.topk = 2;
	b.kv_heads = 2;
	if (mkdir(argv[1], 0755) && errno != EEXIST) {
		perror(argv[1]);
		return 1;
	}
	if (write_seed(argv[1], "l1e2-f32", &a, -1, 32) ||
	    write_seed(argv[1], "l2e4-q8_0", &b, MP_DTYPE_Q8_0, 4096) ||
	    write_seed(argv[1], "l1e2-q4_0", &a, MP_DTYPE_Q4_0, 64))
		return 1;
	return 0;
}

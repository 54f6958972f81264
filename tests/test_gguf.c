// SPDX-License-Identifier: MIT
/* GGUF: export and import round trips, the layout llama.cpp needs, damaged files, refused models. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "base/base.h"
#include "store/gguf.h"

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))

static const enum mp_dtype all_types[] = {
	MP_DTYPE_F32, MP_DTYPE_F16, MP_DTYPE_BF16, MP_DTYPE_Q8_0, MP_DTYPE_Q4_0,
};

/* The path of a file in the test's directory: one buffer per name, for the whole run. */
static const char *path_of(const char *name)
{
	static char names[32][32], paths[32][512];
	static size_t n;

	for (size_t i = 0; i < n; i++)
		if (!strcmp(names[i], name))
			return paths[i];
	assert_true(n < N_ELEMS(names) && strlen(name) < sizeof(names[0]));
	snprintf(names[n], sizeof(names[n]), "%s", name);
	snprintf(paths[n], sizeof(paths[n]), "%s", t_path(name));
	return paths[n++];
}

/* The small model of the helpers, which every test exports. */
static void gen_small(const char *path, enum mp_dtype dtype, uint64_t seed)
{
	assert_int_equal(t_gen_small(path, dtype, seed), 0);
}

static void export_to(const char *mpk, const char *gguf, const struct mp_export_config *cfg)
{
	struct mp_store *s;

	assert_int_equal(mp_store_open(mpk, &s), 0);
	if (mp_gguf_export(s, gguf, cfg))
		fail_msg("export of %s: %s", mpk, mp_last_error());
	mp_store_close(s);
}

static void import_ok(const char *gguf, const char *mpk, const struct mp_import_config *cfg)
{
	if (mp_gguf_import(gguf, mpk, cfg))
		fail_msg("import of %s: %s", gguf, mp_last_error());
}

static void export_then_import_gives_back_every_byte(void **state)
{
	const char *mpk = path_of("a.mpk"), *gguf = path_of("a.gguf"), *back = path_of("b.mpk");

	(void)state;
	for (size_t i = 0; i < N_ELEMS(all_types); i++) {
		for (uint32_t align = 32; align <= 4096; align *= 128) {
			struct mp_export_config cfg = { .dtype = -1, .dense_dtype = -1,
							.alignment = align };

			gen_small(mpk, all_types[i], 5);
			export_to(mpk, gguf, &cfg);
			import_ok(gguf, back, NULL);
			t_assert_same_model(mpk, back);
		}
	}
}

/* An f32 model exported as T, imported back, is the model gen writes in T: the same quantizer. */
static void export_converts_as_gen_does(void **state)
{
	const char *f32 = path_of("f.mpk"), *gguf = path_of("t.gguf");
	const char *back = path_of("back.mpk"), *want = path_of("want.mpk");

	(void)state;
	gen_small(f32, MP_DTYPE_F32, 9);
	for (size_t i = 1; i < N_ELEMS(all_types); i++) {
		struct mp_export_config cfg = { .dtype = (int)all_types[i], .dense_dtype = -1 };

		export_to(f32, gguf, &cfg);
		import_ok(gguf, back, NULL);
		gen_small(want, all_types[i], 9);
		t_assert_same_model(want, back);
	}
	/* and back: import converts to the type asked for */
	{
		struct mp_export_config cfg = { .dtype = -1, .dense_dtype = -1 };
		struct mp_import_config icfg = { .dtype = MP_DTYPE_BF16 };

		export_to(f32, gguf, &cfg);
		import_ok(gguf, back, &icfg);
		gen_small(want, MP_DTYPE_BF16, 9);
		t_assert_same_model(want, back);
	}
}

static void read_tensor(struct gguf_file *g, const char *name, void *buf, uint64_t len)
{
	const struct gguf_tensor *t = gguf_find_tensor(g, name);

	assert_non_null(t);
	assert_int_equal(t->bytes, len);
	assert_int_equal(gguf_read(g, t, 0, buf, len), 0);
}

/* llama.cpp's "llama" ropes adjacent pairs: half-layout row j goes to 2j, row hd/2 + j to 2j + 1. */
static void exported_q_and_k_rows_are_in_adjacent_pair_order(void **state)
{
	const char *mpk = path_of("a.mpk"), *gguf = path_of("a.gguf");
	const char *names[][2] = { { "blk.1.attn_q", "blk.1.attn_q.weight" },
				   { "blk.1.attn_k", "blk.1.attn_k.weight" },
				   { "blk.1.attn_v", "blk.1.attn_v.weight" } };
	struct mp_export_config cfg = { .dtype = -1, .dense_dtype = -1 };
	struct mp_store *s;
	struct gguf_file *g;

	(void)state;
	gen_small(mpk, MP_DTYPE_F32, 3);
	export_to(mpk, gguf, &cfg);
	assert_int_equal(mp_store_open(mpk, &s), 0);
	assert_int_equal(gguf_open(gguf, &g), 0);
	for (size_t i = 0; i < N_ELEMS(names); i++) {
		const struct mp_tensor_info *t = mp_store_tensor(s, names[i][0]);
		const uint32_t hd = 16, cols = 64, rows = (uint32_t)t->dims[0];
		float *a = malloc(t->bytes), *b = malloc(t->bytes);

		assert_int_equal(mp_store_read_tensor(s, t, a), 0);
		read_tensor(g, names[i][1], b, t->bytes);
		for (uint32_t r = 0; r < rows; r++) {
			uint32_t h = r / hd, j = r % hd;
			/* V keeps its rows; Q and K move them */
			uint32_t to = i == 2 ? r : h * hd + (j < hd / 2 ? 2 * j : 2 * (j - hd / 2) + 1);

			assert_memory_equal(a + (size_t)r * cols, b + (size_t)to * cols,
					    cols * sizeof(float));
		}
		free(a);
		free(b);
	}
	gguf_close(g);
	mp_store_close(s);
}

static uint32_t kv_u32(struct gguf_file *g, const char *key)
{
	uint32_t v = 0;

	if (gguf_get_u32(g, key, &v))
		fail_msg("no u32 key %s", key);
	return v;
}

/* First string of an array key. */
static void kv_first_string(struct gguf_file *g, const char *key, char *out, size_t len)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);
	uint64_t n;

	assert_non_null(kv);
	assert_int_equal(kv->type, GGUF_ARRAY);
	assert_int_equal(kv->elem, GGUF_STRING);
	assert_int_equal(pread(g->fd, &n, 8, (off_t)kv->off), 8);
	assert_true(n < len);
	assert_int_equal(pread(g->fd, out, n, (off_t)kv->off + 8), (ssize_t)n);
	out[n] = 0;
}

/*
 * What llama.cpp's loader needs: its mandatory keys, tensors one after the
 * other padded to general.alignment, experts as [experts, ffn, hidden]
 * tensors, the vocabulary (byte pieces typed as bytes), page-aligned
 * tensors at alignment 4096.
 */
static void exported_file_is_laid_out_as_llama_cpp_requires(void **state)
{
	const char *mpk = path_of("a.mpk"), *gguf = path_of("a.gguf");
	struct mp_gguf_token vocab[300];
	struct mp_export_config cfg = {
		.dtype = MP_DTYPE_Q8_0, .dense_dtype = MP_DTYPE_F32, .alignment = 4096,
		.vocab = vocab, .vocab_n = 300, .bos = 1, .eos = 2, .unk = 0,
	};
	const char *arch = NULL;
	const struct gguf_tensor *t;
	struct gguf_file *g;
	char first[32];
	uint64_t next;

	(void)state;
	for (uint32_t i = 0; i < 300; i++)
		vocab[i] = (struct mp_gguf_token){ i == 0 ? "<unk>" : "x", -1.0f, i ? 1 : 2 };
	gen_small(mpk, MP_DTYPE_F32, 3);
	export_to(mpk, gguf, &cfg);
	assert_int_equal(gguf_open(gguf, &g), 0);
	assert_int_equal(g->alignment, 4096);
	assert_int_equal(gguf_get_str(g, "general.architecture", &arch), 0);
	assert_string_equal(arch, "llama");
	assert_int_equal(kv_u32(g, "llama.block_count"), 2);
	assert_int_equal(kv_u32(g, "llama.embedding_length"), 64);
	assert_int_equal(kv_u32(g, "llama.feed_forward_length"), 96);
	assert_int_equal(kv_u32(g, "llama.expert_count"), 4);
	assert_int_equal(kv_u32(g, "llama.expert_used_count"), 2);
	assert_int_equal(kv_u32(g, "llama.attention.head_count_kv"), 2);
	assert_int_equal(kv_u32(g, "llama.rope.dimension_count"), 16);
	assert_int_equal(kv_u32(g, "tokenizer.ggml.eos_token_id"), 2);
	assert_int_equal(gguf_find_kv(g, "tokenizer.ggml.tokens")->n, 300);
	kv_first_string(g, "tokenizer.ggml.tokens", first, sizeof(first));
	assert_string_equal(first, "<unk>");
	next = g->data_off;
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		/* in declaration order, each right after the previous one, padded */
		assert_int_equal(g->t[i].off, next);
		assert_int_equal(g->t[i].off % 4096, 0);
		next = MP_ALIGN_UP(g->t[i].off + g->t[i].bytes, 4096);
	}
	t = gguf_find_tensor(g, "blk.1.ffn_down_exps.weight");
	assert_non_null(t);
	assert_true(t->ne[0] == 96 && t->ne[1] == 64 && t->ne[2] == 4 && t->type == GGML_Q8_0);
	t = gguf_find_tensor(g, "blk.1.ffn_gate_inp.weight");
	assert_true(t->ne[0] == 64 && t->ne[1] == 4 && t->type == GGML_F32);
	assert_int_equal(gguf_find_tensor(g, "output.weight")->type, GGML_F32);
	assert_int_equal(g->n_tensors, 3 + 2 * 10);
	gguf_close(g);

	/* without a vocabulary, placeholders: <unk> <s> </s>, the byte tokens, "t<id>" */
	cfg.vocab = NULL;
	export_to(mpk, gguf, &cfg);
	assert_int_equal(gguf_open(gguf, &g), 0);
	kv_first_string(g, "tokenizer.ggml.tokens", first, sizeof(first));
	assert_string_equal(first, "<unk>");
	assert_int_equal(gguf_find_kv(g, "tokenizer.ggml.token_type")->n, 300);
	gguf_close(g);
}

static void export_refuses_bad_options(void **state)
{
	const char *mpk = path_of("a.mpk"), *gguf = path_of("a.gguf");
	struct mp_gguf_token one = { "x", 0, 1 };
	struct mp_export_config cfg = { .dtype = -1, .dense_dtype = -1, .vocab = &one,
					.vocab_n = 1 };
	struct mp_store *s;
	struct mp_geometry g;

	(void)state;
	gen_small(mpk, MP_DTYPE_F32, 3);
	unlink(gguf);
	assert_int_equal(mp_store_open(mpk, &s), 0);
	t_log_reset();
	assert_int_equal(mp_gguf_export(s, gguf, &cfg), -EINVAL);
	assert_true(t_log_contains("the vocabulary has 1 tokens, the model 300"));
	cfg.vocab = NULL;
	cfg.alignment = 48;
	t_log_reset();
	assert_int_equal(mp_gguf_export(s, gguf, &cfg), -EINVAL);
	assert_true(t_log_contains("alignment 48 is not a power of two"));
	mp_store_close(s);
	assert_int_equal(access(gguf, F_OK), -1);

	/* rows of 40 are no whole q8_0 blocks */
	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	g.hidden = 40;
	g.heads = 2;
	g.kv_heads = 1;
	g.head_dim = 20;
	unlink(mpk);
	assert_int_equal(mp_gen_model(mpk, &g, 1, NULL, NULL, NULL), 0);
	assert_int_equal(mp_store_open(mpk, &s), 0);
	cfg = (struct mp_export_config){ .dtype = MP_DTYPE_Q8_0, .dense_dtype = -1 };
	t_log_reset();
	assert_int_equal(mp_gguf_export(s, gguf, &cfg), -EINVAL);
	assert_true(t_log_contains("cannot be written as q8_0"));
	mp_store_close(s);
}

/*
 * Rewriting a GGUF: the same tensors and scalar keys (arrays dropped), the
 * architecture renamed, and optionally a key or tensor added, or a
 * tensor's type changed.
 */
struct rewrite {
	const char *arch;
	const char *add_tensor;		/* a 1-D f32 tensor of 64 values */
	const char *add_key;		/* a u32 key ("ARCH." is prefixed) */
	uint32_t add_key_value;
	const char *add_str_key;	/* a string key */
	const char *add_str_value;
	const char *drop_key;		/* a key (without "ARCH.") left out */
	const char *retype;		/* a tensor given ggml type `type` (zeros) */
	uint32_t type;
};

static void copy_keys(struct gguf_file *g, struct gguf_writer *w, const struct rewrite *rw)
{
	char key[160];

	for (uint64_t i = 0; i < g->n_kv; i++) {
		const struct gguf_kv *kv = &g->kv[i];
		const char *k = kv->key;

		if (!strncmp(k, "llama.", 6)) {
			if (rw->drop_key && !strcmp(k + 6, rw->drop_key))
				continue;
			snprintf(key, sizeof(key), "%s.%s", rw->arch, k + 6);
			k = key;
		}
		if (!strcmp(kv->key, "general.architecture"))
			assert_int_equal(gguf_writer_str(w, k, rw->arch), 0);
		else if (kv->type == GGUF_U32)
			assert_int_equal(gguf_writer_u32(w, k, (uint32_t)kv->v.u), 0);
		else if (kv->type == GGUF_F32)
			assert_int_equal(gguf_writer_f32(w, k, (float)kv->v.f), 0);
		else if (kv->type == GGUF_STRING)
			assert_int_equal(gguf_writer_str(w, k, kv->str), 0);
	}
	if (rw->add_key) {
		snprintf(key, sizeof(key), "%s.%s", rw->arch, rw->add_key);
		assert_int_equal(gguf_writer_u32(w, key, rw->add_key_value), 0);
	}
	if (rw->add_str_key) {
		snprintf(key, sizeof(key), "%s.%s", rw->arch, rw->add_str_key);
		assert_int_equal(gguf_writer_str(w, key, rw->add_str_value), 0);
	}
}

static void rewrite_gguf(const char *src, const char *dst, const struct rewrite *rw)
{
	struct gguf_file *g;
	struct gguf_writer *w;
	int idx[64];
	float extra[64] = { 0 };
	uint64_t one = 64;

	assert_int_equal(gguf_open(src, &g), 0);
	assert_true(g->n_tensors < N_ELEMS(idx));
	assert_int_equal(gguf_writer_create(dst, (uint32_t)g->alignment, &w), 0);
	copy_keys(g, w, rw);
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		const struct gguf_tensor *t = &g->t[i];
		bool re = rw->retype && !strcmp(t->name, rw->retype);

		idx[i] = gguf_writer_tensor(w, t->name, re ? rw->type : t->type, t->n_dims, t->ne);
		assert_true(idx[i] >= 0);
	}
	if (rw->add_tensor)
		assert_true(gguf_writer_tensor(w, rw->add_tensor, GGML_F32, 1, &one) >= 0);
	assert_int_equal(gguf_writer_begin_data(w), 0);
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		uint64_t n = gguf_writer_tensor_bytes(w, idx[i]);
		void *buf = calloc(1, n);

		if (!rw->retype || strcmp(g->t[i].name, rw->retype))
			assert_int_equal(gguf_read(g, &g->t[i], 0, buf, n), 0);
		assert_int_equal(gguf_writer_data(w, idx[i], 0, buf, n), 0);
		free(buf);
	}
	if (rw->add_tensor)
		assert_int_equal(gguf_writer_data(w, (int)g->n_tensors, 0, extra, sizeof(extra)), 0);
	assert_int_equal(gguf_writer_finish(w), 0);
	gguf_close(g);
}

/* A llama GGUF of the small model, rewritten as rw says. */
static void make_variant(const char *path, const struct rewrite *rw)
{
	const char *mpk = path_of("v.mpk"), *base = path_of("v.gguf");
	struct mp_export_config cfg = { .dtype = -1, .dense_dtype = -1, .alignment = 32 };

	gen_small(mpk, MP_DTYPE_F32, 4);
	export_to(mpk, base, &cfg);
	rewrite_gguf(base, path, rw);
}

static void import_refuses_models_the_runner_cannot_run(void **state)
{
	static const struct {
		struct rewrite rw;
		const char *msg;
	} cases[] = {
		{ { .arch = "gpt2" }, "architecture 'gpt2' is not one moepager imports" },
		{ { .arch = "qwen2moe" }, "top-k router weights left unnormalised" },
		{ { .arch = "olmoe" }, "an RMSNorm on queries and keys" },
		{ { .arch = "deepseek2" }, "multi-head latent attention" },
		{ { .arch = "qwen3moe", .add_tensor = "blk.0.attn_q_norm.weight" },
		  "tensor 'blk.0.attn_q_norm.weight' (info at offset" },
		{ { .arch = "llama", .add_tensor = "blk.1.ffn_gate_inp_shexp.weight" },
		  "a shared expert" },
		{ { .arch = "llama", .add_tensor = "blk.0.attn_q.bias" }, "a bias" },
		{ { .arch = "llama", .add_tensor = "rope_freqs.weight" }, "RoPE frequency factors" },
		{ { .arch = "llama", .add_tensor = "blk.0.ffn_gate.3.weight" }, "a dense FFN" },
		{ { .arch = "llama", .add_tensor = "blk.0.mystery.weight" },
		  "no tensor of the runner's architecture has this name" },
		{ { .arch = "llama", .add_key = "expert_shared_count", .add_key_value = 2 },
		  "key 'llama.expert_shared_count' at offset" },
		{ { .arch = "llama", .add_str_key = "rope.scaling.type", .add_str_value = "yarn" },
		  "scaled RoPE" },
		{ { .arch = "llama", .drop_key = "rope.dimension_count",
		    .add_key = "rope.dimension_count", .add_key_value = 8 },
		  "RoPE over part of a head" },
		{ { .arch = "llama", .drop_key = "expert_count" }, "not a mixture of experts" },
		{ { .arch = "llama", .retype = "blk.1.ffn_up_exps.weight", .type = 6 },
		  "tensor 'blk.1.ffn_up_exps.weight' (info at offset" },
	};
	const char *gguf = path_of("bad.gguf"), *out = path_of("out.mpk");

	(void)state;
	unlink(out);
	for (size_t i = 0; i < N_ELEMS(cases); i++) {
		int err;

		make_variant(gguf, &cases[i].rw);
		t_log_reset();
		err = mp_gguf_import(gguf, out, NULL);
		if (err != -EOPNOTSUPP || !t_log_contains(cases[i].msg))
			fail_msg("case %zu: %d, log lacks '%s': %s", i, err, cases[i].msg,
				 mp_last_error());
		assert_int_equal(access(out, F_OK), -1);
	}
	/* q5_0 is named */
	assert_true(t_log_contains("is q5_0; moepager reads f32, f16, bf16, q8_0 and q4_0"));
}

/* qwen3moe ropes halves (NEOX): its Q and K rows come in as they are, unpermuted. */
static void qwen3moe_imports_without_permuting_rope(void **state)
{
	const char *gguf = path_of("q3.gguf"), *mpk = path_of("q3.mpk");
	struct rewrite rw = { .arch = "qwen3moe" };
	struct mp_store *a, *b;

	(void)state;
	make_variant(gguf, &rw);
	import_ok(gguf, mpk, NULL);
	assert_int_equal(mp_store_open(path_of("v.mpk"), &a), 0);
	assert_int_equal(mp_store_open(mpk, &b), 0);
	/* the llama export permuted Q and K; read back as qwen3moe they stay permuted */
	assert_int_not_equal(mp_store_tensor(a, "blk.0.attn_q")->checksum,
			     mp_store_tensor(b, "blk.0.attn_q")->checksum);
	assert_int_equal(mp_store_tensor(a, "blk.0.attn_v")->checksum,
			 mp_store_tensor(b, "blk.0.attn_v")->checksum);
	assert_int_equal(mp_store_expert(a, 1, 3)->checksum, mp_store_expert(b, 1, 3)->checksum);
	mp_store_close(a);
	mp_store_close(b);
}

/* Byte offsets of the fields of tensor info i (name first). */
struct info_at {
	uint64_t n_dims, ne0, type, offset;
};

static struct info_at info_fields(const struct gguf_tensor *t)
{
	uint64_t name = t->info_off + 8 + strlen(t->name);

	return (struct info_at){ name, name + 4, name + 4 + 8 * t->n_dims,
				 name + 4 + 8 * t->n_dims + 4 };
}

static void patch(const char *path, uint64_t off, const void *v, size_t len)
{
	int fd = open(path, O_WRONLY);

	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, v, len, (off_t)off), (ssize_t)len);
	close(fd);
}

static void patch_u32(const char *path, uint64_t off, uint32_t v)
{
	patch(path, off, &v, sizeof(v));
}

static void patch_u64(const char *path, uint64_t off, uint64_t v)
{
	patch(path, off, &v, sizeof(v));
}

static void copy_file(const char *from, const char *to)
{
	size_t len;
	char *buf;
	FILE *f;

	assert_int_equal(mp_read_file("test", from, &buf, &len), 0);
	f = fopen(to, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(buf, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
	free(buf);
}

/*
 * A damaged file is refused with a message naming the key or tensor and
 * the file offset: each case breaks one field of a good file.
 */
static void corrupt_gguf_is_refused_naming_the_key_or_tensor(void **state)
{
	const char *mpk = path_of("c.mpk"), *good = path_of("good.gguf"), *bad = path_of("bad.gguf");
	struct mp_export_config cfg = { .dtype = -1, .dense_dtype = -1, .alignment = 32 };
	const struct gguf_kv *kv, *align, *arch;
	const struct gguf_tensor *t, *t2;
	struct gguf_file *g;
	struct info_at f, f2;
	struct stat st;
	char msg[160];
	struct {
		int what;
		int err;
	} cases[] = {
		{ 0, -EPROTO }, { 1, -EPROTONOSUPPORT }, { 2, -EINVAL }, { 3, -EINVAL },
		{ 4, -ENODATA }, { 5, -EINVAL }, { 6, -EINVAL }, { 7, -EINVAL }, { 8, -ENODATA },
		{ 9, -ENODATA }, { 10, -EINVAL }, { 11, -EINVAL }, { 12, -EINVAL },
	};

	(void)state;
	gen_small(mpk, MP_DTYPE_F32, 2);
	export_to(mpk, good, &cfg);
	assert_int_equal(gguf_open(good, &g), 0);
	assert_int_equal(stat(good, &st), 0);
	kv = gguf_find_kv(g, "llama.block_count");
	align = gguf_find_kv(g, "general.alignment");
	arch = gguf_find_kv(g, "general.architecture");
	assert_null(align);	/* 32 is the default: not written */
	t = gguf_find_tensor(g, "blk.1.attn_k.weight");
	t2 = gguf_find_tensor(g, "blk.1.attn_v.weight");
	f = info_fields(t);
	f2 = info_fields(t2);
	for (size_t i = 0; i < N_ELEMS(cases); i++) {
		int err;

		copy_file(good, bad);
		switch (cases[i].what) {
		case 0:	/* magic */
			patch_u32(bad, 0, 0x46554746);
			snprintf(msg, sizeof(msg), "bad magic at offset 0");
			break;
		case 1:	/* version */
			patch_u32(bad, 4, 2);
			snprintf(msg, sizeof(msg), "GGUF version 2 at offset 4");
			break;
		case 2:	/* a count the file cannot hold */
			patch_u64(bad, 8, 1ull << 40);
			snprintf(msg, sizeof(msg), "counts %llu tensors", 1ull << 40);
			break;
		case 3:	/* a value type that does not exist */
			patch_u32(bad, kv->off - 4, 99);
			snprintf(msg, sizeof(msg), "key 'llama.block_count' at offset %llu: "
				 "unknown value type 99", (unsigned long long)kv->at);
			break;
		case 4:	/* a string running past the end */
			patch_u64(bad, arch->off, 1ull << 50);
			snprintf(msg, sizeof(msg), "key 'general.architecture': value at offset %llu",
				 (unsigned long long)arch->off);
			break;
		case 5:	/* too many dimensions */
			patch_u32(bad, f.n_dims, 5);
			snprintf(msg, sizeof(msg), "tensor 'blk.1.attn_k.weight' (info at offset %llu) "
				 "has 5 dimensions", (unsigned long long)t->info_off);
			break;
		case 6:	/* no such ggml type */
			patch_u32(bad, f.type, 4);
			snprintf(msg, sizeof(msg), "tensor 'blk.1.attn_k.weight' (info at offset %llu): "
				 "unknown ggml type 4", (unsigned long long)t->info_off);
			break;
		case 7:	/* misaligned data */
			patch_u64(bad, f.offset, t->off - g->data_off + 4);
			snprintf(msg, sizeof(msg), "tensor 'blk.1.attn_k.weight' (info at offset %llu): "
				 "data offset", (unsigned long long)t->info_off);
			break;
		case 8:	/* data past the end */
			patch_u64(bad, f.offset, (uint64_t)st.st_size);
			snprintf(msg, sizeof(msg), "tensor 'blk.1.attn_k.weight' (info at offset %llu): "
				 "data [", (unsigned long long)t->info_off);
			break;
		case 9:	/* truncated inside the last tensor */
			assert_int_equal(truncate(bad, st.st_size - 100), 0);
			snprintf(msg, sizeof(msg), "runs past the end of the file (%llu bytes)",
				 (unsigned long long)st.st_size - 100);
			break;
		case 10: /* two tensors on the same bytes */
			patch_u64(bad, f2.offset, t->off - g->data_off);
			snprintf(msg, sizeof(msg), "overlaps tensor");
			break;
		case 11: /* rows that are not whole blocks (q8_0 rows of 64 values are) */
			patch_u32(bad, f.type, GGML_Q8_0);
			patch_u64(bad, f.ne0, 48);
			snprintf(msg, sizeof(msg), "tensor 'blk.1.attn_k.weight' (info at offset %llu): "
				 "rows of 48 q8_0 values", (unsigned long long)t->info_off);
			break;
		case 12: /* a repeated tensor name: blk.1.attn_k -> blk.1.attn_v */
			patch(bad, t->info_off + 8 + strlen("blk.1.attn_"), "v", 1);
			snprintf(msg, sizeof(msg), "tensor 'blk.1.attn_v.weight' (info at offset %llu) "
				 "appears twice", (unsigned long long)t2->info_off);
			break;
		}
		t_log_reset();
		err = mp_gguf_import(bad, path_of("out.mpk"), NULL);
		if (err != cases[i].err || !t_log_contains(msg))
			fail_msg("case %d: %d (want %d), log lacks '%s': %s", cases[i].what, err,
				 cases[i].err, msg, mp_last_error());
	}
	gguf_close(g);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(export_then_import_gives_back_every_byte),
		cmocka_unit_test(export_converts_as_gen_does),
		cmocka_unit_test(exported_q_and_k_rows_are_in_adjacent_pair_order),
		cmocka_unit_test(exported_file_is_laid_out_as_llama_cpp_requires),
		cmocka_unit_test(export_refuses_bad_options),
		cmocka_unit_test(import_refuses_models_the_runner_cannot_run),
		cmocka_unit_test(qwen3moe_imports_without_permuting_rope),
		cmocka_unit_test(corrupt_gguf_is_refused_naming_the_key_or_tensor),
	};

	return cmocka_run_group_tests(tests, t_group_log_capture, t_group_tmpdir_cleanup);
}

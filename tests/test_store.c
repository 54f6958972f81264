// SPDX-License-Identifier: MIT
/* The .mpk reader and writer: round trips, every kind of bad input, writer refusals. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "helpers.h"
#include "base/base.h"
#include "store/format.h"
#include "store/layout.h"

/*
 * File editing: tests corrupt one field and recompute the checksums that
 * cover it, so each test reaches the check it is about instead of stopping
 * at a checksum.
 */

struct mpk_image {
	struct mpk_header h;
	struct mpk_tensor_entry *tt;
	struct mpk_expert_entry *et;
};

static void pread_exact(int fd, void *buf, size_t len, uint64_t off)
{
	assert_int_equal(pread(fd, buf, len, (off_t)off), (ssize_t)len);
}

static void pwrite_exact(int fd, const void *buf, size_t len, uint64_t off)
{
	assert_int_equal(pwrite(fd, buf, len, (off_t)off), (ssize_t)len);
}

static void image_load(const char *path, struct mpk_image *m)
{
	int fd = open(path, O_RDONLY);

	assert_true(fd >= 0);
	pread_exact(fd, &m->h, sizeof(m->h), 0);
	m->tt = calloc(m->h.n_tensors, sizeof(*m->tt));
	m->et = calloc(m->h.n_experts, sizeof(*m->et));
	assert_non_null(m->tt);
	assert_non_null(m->et);
	pread_exact(fd, m->tt, m->h.n_tensors * sizeof(*m->tt), m->h.tensor_table_off);
	pread_exact(fd, m->et, m->h.n_experts * sizeof(*m->et), m->h.expert_table_off);
	close(fd);
}

static void seal_header(struct mpk_header *h)
{
	h->header_checksum = XXH3_64bits(h, offsetof(struct mpk_header, header_checksum));
}

/* Writes the image back with both checksums recomputed; frees the tables. */
static void image_store(const char *path, struct mpk_image *m)
{
	size_t tlen = m->h.n_tensors * sizeof(*m->tt), elen = m->h.n_experts * sizeof(*m->et);
	XXH3_state_t *st = XXH3_createState();
	int fd = open(path, O_RDWR);

	assert_true(fd >= 0);
	XXH3_64bits_reset(st);
	XXH3_64bits_update(st, m->tt, tlen);
	XXH3_64bits_update(st, m->et, elen);
	m->h.tables_checksum = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	seal_header(&m->h);
	pwrite_exact(fd, m->tt, tlen, m->h.tensor_table_off);
	pwrite_exact(fd, m->et, elen, m->h.expert_table_off);
	pwrite_exact(fd, &m->h, sizeof(m->h), 0);
	close(fd);
	free(m->tt);
	free(m->et);
}

static const char *fresh_tiny(void)
{
	const char *path = t_path("model.mpk");

	unlink(path);
	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 1), 0);
	t_log_reset();
	return path;
}

static int open_fails(const char *path)
{
	struct mp_store *s = (struct mp_store *)1;
	int err;

	t_log_reset();
	err = mp_store_open(path, &s);
	assert_null(s);
	assert_true(err < 0);
	return err;
}

static void truncate_to(const char *path, uint64_t size)
{
	assert_int_equal(truncate(path, (off_t)size), 0);
}

static uint64_t file_size(const char *path)
{
	struct stat st;

	assert_int_equal(stat(path, &st), 0);
	return (uint64_t)st.st_size;
}

/* Entries in the test directory: the writer must leave no temporary file behind. */
static int dir_entries(void)
{
	DIR *d = opendir(t_tmpdir());
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

static void clear_dir(void)
{
	t_tmpdir_cleanup();
	t_tmpdir();
}

/*
 * Round trip
 */

/* A piece's bytes: a pattern that differs per piece and per byte. */
static void pattern(void *buf, uint64_t len, uint64_t id)
{
	uint64_t x = id * 0x9e3779b97f4a7c15ull + 1;
	unsigned char *p = buf;

	for (uint64_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = (unsigned char)x;
	}
}

static void round_trip(enum mp_dtype dtype)
{
	const char *path = t_path("rt.mpk");
	struct mp_store_writer *w;
	struct mp_store *s;
	struct mp_geometry g;
	uint64_t eb;
	uint32_t nt;
	void *buf, *got;

	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	g.dtype = dtype;
	g.layers = 3;
	g.experts = 5;
	eb = mp_geometry_expert_bytes(&g);
	assert_int_equal(mp_store_writer_create(path, &g, "round-trip", &w), 0);
	nt = mp_store_writer_tensor_count(w);
	assert_int_equal(nt, 3 + 7 * g.layers);
	buf = malloc(1 << 20);
	got = malloc(1 << 20);
	assert_true(eb <= (1 << 20));
	/* put in reverse order: the layout must not depend on it */
	for (uint32_t i = nt; i-- > 0;) {
		const struct mp_tensor_info *t = mp_store_writer_tensor_at(w, i);

		assert_true(t->bytes <= (1 << 20));
		pattern(buf, t->bytes, i);
		assert_int_equal(mp_store_writer_put_tensor(w, t->name, buf), 0);
	}
	for (uint32_t l = g.layers; l-- > 0;) {
		for (uint32_t e = g.experts; e-- > 0;) {
			pattern(buf, eb, 1000 + l * 100 + e);
			assert_int_equal(mp_store_writer_put_expert(w, l, e, buf), 0);
		}
	}
	assert_int_equal(mp_store_writer_finish(w), 0);

	assert_int_equal(mp_store_open(path, &s), 0);
	assert_memory_equal(mp_store_geometry(s), &g, sizeof(g));
	assert_string_equal(mp_store_name(s), "round-trip");
	assert_string_equal(mp_store_path(s), path);
	assert_int_equal(mp_store_file_bytes(s), file_size(path));
	assert_int_equal(mp_store_file_bytes(s) % 4096, 0);
	assert_int_equal(mp_store_expert_bytes(s), eb);
	assert_int_equal(mp_store_total_expert_bytes(s), eb * g.layers * g.experts);
	assert_true(mp_store_fd(s) >= 0);
	assert_int_equal(mp_store_tensor_count(s), nt);
	assert_null(mp_store_tensor_at(s, nt));
	assert_null(mp_store_tensor(s, "blk.99.attn_q"));
	for (uint32_t i = 0; i < nt; i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(s, i);

		assert_ptr_equal(mp_store_tensor(s, t->name), t);
		assert_int_equal(t->offset % 4096, 0);
		pattern(buf, t->bytes, i);
		memset(got, 0, t->bytes);
		assert_int_equal(mp_store_read_tensor(s, t, got), 0);
		assert_memory_equal(buf, got, t->bytes);
		assert_int_equal(t->checksum, mp_checksum(buf, t->bytes));
	}
	assert_int_equal(mp_store_tensor(s, "blk.1.attn_o")->dtype, dtype);
	assert_int_equal(mp_store_tensor(s, "blk.1.router")->dtype, MP_DTYPE_F32);
	for (uint32_t l = 0; l < g.layers; l++) {
		for (uint32_t e = 0; e < g.experts; e++) {
			const struct mp_expert_info *x = mp_store_expert(s, l, e);

			assert_non_null(x);
			assert_int_equal(x->layer, l);
			assert_int_equal(x->expert, e);
			assert_int_equal(x->offset % MP_EXPERT_ALIGN, 0);
			assert_int_equal(x->bytes, eb);
			pattern(buf, eb, 1000 + l * 100 + e);
			memset(got, 0, eb);
			assert_int_equal(mp_store_read_expert(s, l, e, got), 0);
			assert_memory_equal(buf, got, eb);
		}
	}
	assert_null(mp_store_expert(s, g.layers, 0));
	assert_null(mp_store_expert(s, 0, g.experts));
	assert_int_equal(mp_store_read_expert(s, 0, g.experts, got), -ERANGE);
	assert_int_equal(mp_store_verify(s, NULL, 0, NULL, NULL), 0);
	mp_store_close(s);
	free(buf);
	free(got);
	unlink(path);
}

static void round_trip_f32(void **state)
{
	(void)state;
	round_trip(MP_DTYPE_F32);
}

static void round_trip_f16(void **state)
{
	(void)state;
	round_trip(MP_DTYPE_F16);
}

static void round_trip_bf16(void **state)
{
	(void)state;
	round_trip(MP_DTYPE_BF16);
}

static void round_trip_q8_0(void **state)
{
	(void)state;
	round_trip(MP_DTYPE_Q8_0);
}

static void round_trip_q4_0(void **state)
{
	(void)state;
	round_trip(MP_DTYPE_Q4_0);
}

static void expert_padding_is_a_hole(void **state)
{
	const char *path = fresh_tiny();
	struct stat st;

	(void)state;
	assert_int_equal(stat(path, &st), 0);
	/* 32 experts of 384 KiB in 2 MiB slots: well under half the blocks are allocated */
	assert_true((uint64_t)st.st_blocks * 512 < (uint64_t)st.st_size / 2);
}

static void close_accepts_null(void **state)
{
	(void)state;
	mp_store_close(NULL);
	mp_store_writer_abort(NULL);
}

/*
 * Bad input
 */

static void missing_file_is_enoent(void **state)
{
	(void)state;
	assert_int_equal(open_fails(t_path("does-not-exist.mpk")), -ENOENT);
	assert_true(t_log_contains("does-not-exist.mpk: cannot open"));
}

static void empty_file_is_truncated(void **state)
{
	const char *path = fresh_tiny();

	(void)state;
	truncate_to(path, 0);
	assert_int_equal(open_fails(path), -ENODATA);
	assert_true(t_log_contains("truncated: file is 0 bytes, the header needs 4096"));
	truncate_to(path, 5);
	assert_int_equal(open_fails(path), -ENODATA);
	assert_true(t_log_contains("truncated: file is 5 bytes"));
}

static void truncated_mid_header_is_enodata(void **state)
{
	const char *path = fresh_tiny();

	(void)state;
	truncate_to(path, 2000);
	assert_int_equal(open_fails(path), -ENODATA);
	assert_true(t_log_contains("truncated: file is 2000 bytes, the header needs 4096"));
}

static void truncated_mid_table_is_enodata(void **state)
{
	const char *path = fresh_tiny();
	uint64_t size = file_size(path);
	char msg[128];

	(void)state;
	truncate_to(path, 4096 + 300);
	assert_int_equal(open_fails(path), -ENODATA);
	snprintf(msg, sizeof(msg), "truncated: file is 4396 bytes, header says %llu",
		 (unsigned long long)size);
	assert_true(t_log_contains(msg));
}

static void truncated_mid_expert_is_enodata(void **state)
{
	const char *path = fresh_tiny();
	struct mp_store *s;
	uint64_t size = file_size(path), cut;
	char msg[128];

	(void)state;
	assert_int_equal(mp_store_open(path, &s), 0);
	cut = mp_store_expert(s, 3, 7)->offset + 1000;
	mp_store_close(s);
	truncate_to(path, cut);
	assert_int_equal(open_fails(path), -ENODATA);
	snprintf(msg, sizeof(msg), "truncated: file is %llu bytes, header says %llu",
		 (unsigned long long)cut, (unsigned long long)size);
	assert_true(t_log_contains(msg));
	/* one byte short is still truncated */
	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 1), 0);
	truncate_to(path, size - 1);
	assert_int_equal(open_fails(path), -ENODATA);
}

static void file_shrinking_after_open_is_enodata(void **state)
{
	const char *path = fresh_tiny();
	struct mp_store *s;
	void *buf;

	(void)state;
	assert_int_equal(mp_store_open(path, &s), 0);
	buf = malloc(mp_store_expert_bytes(s));
	truncate_to(path, mp_store_expert(s, 3, 7)->offset + 100);
	t_log_reset();
	assert_int_equal(mp_store_read_expert(s, 3, 7, buf), -ENODATA);
	assert_true(t_log_contains("layer 3 expert 7: short read"));
	assert_int_equal(mp_store_read_expert(s, 0, 0, buf), 0);
	mp_store_close(s);
	free(buf);
}

static void bad_magic_is_eproto(void **state)
{
	const char *path = fresh_tiny();

	(void)state;
	assert_int_equal(t_flip_byte(path, 3), 0);
	assert_int_equal(open_fails(path), -EPROTO);
	assert_true(t_log_contains("bad magic at offset 0"));
}

static void unknown_version_is_eprotonosupport(void **state)
{
	const char *path = fresh_tiny();
	struct mpk_image m;

	(void)state;
	image_load(path, &m);
	m.h.version = 2;
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EPROTONOSUPPORT);
	assert_true(t_log_contains("unknown format version 2 at offset 8"));
}

static void header_checksum_mismatch_is_ebadmsg(void **state)
{
	const char *path = fresh_tiny();

	(void)state;
	/* a byte of the reserved area: only the checksum can catch it */
	assert_int_equal(t_flip_byte(path, 1000), 0);
	assert_int_equal(open_fails(path), -EBADMSG);
	assert_true(t_log_contains("header checksum mismatch"));
}

static void table_checksum_mismatch_is_ebadmsg(void **state)
{
	const char *path = fresh_tiny();
	struct mpk_image m;

	(void)state;
	image_load(path, &m);
	free(m.tt);
	free(m.et);
	/* a stored expert checksum: the table checksum no longer matches */
	assert_int_equal(t_flip_byte(path, m.h.expert_table_off + 5 * 64 + 24), 0);
	assert_int_equal(open_fails(path), -EBADMSG);
	assert_true(t_log_contains("table checksum mismatch"));
}

static void absurd_geometry_is_einval(void **state)
{
	static const struct {
		size_t field;
		uint32_t value;
		const char *msg;
	} cases[] = {
		{ offsetof(struct mpk_header, layers), 1000000, "layers = 1000000" },
		{ offsetof(struct mpk_header, layers), 0, "layers = 0" },
		{ offsetof(struct mpk_header, experts), 0xffffffffu, "experts = 4294967295" },
		{ offsetof(struct mpk_header, topk), 9, "topk = 9" },
		{ offsetof(struct mpk_header, hidden), 0, "hidden = 0" },
		{ offsetof(struct mpk_header, kv_heads), 3,
		  "heads (4) is not a multiple of kv_heads" },
		{ offsetof(struct mpk_header, vocab), 1u << 30, "vocab" },
		{ offsetof(struct mpk_header, dtype), 7, "unknown weight type 7" },
	};
	const char *path = t_path("model.mpk");

	(void)state;
	for (size_t i = 0; i < MP_ARRAY_SIZE(cases); i++) {
		struct mpk_image m;

		unlink(path);
		assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 1), 0);
		image_load(path, &m);
		memcpy((char *)&m.h + cases[i].field, &cases[i].value, sizeof(uint32_t));
		image_store(path, &m);
		assert_int_equal(open_fails(path), -EINVAL);
		if (!t_log_contains(cases[i].msg))
			fail_msg("case %zu: no '%s' in the log", i, cases[i].msg);
	}
}

static void expert_extents_overlapping_is_einval(void **state)
{
	const char *path = fresh_tiny();
	struct mpk_image m;

	(void)state;
	image_load(path, &m);
	m.et[1].offset = m.et[0].offset;	/* layer 0 expert 1 on top of expert 0 */
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("overlaps"));
	assert_true(t_log_contains("layer 0 expert 0"));
	assert_true(t_log_contains("layer 0 expert 1"));
}

static void tensor_overlapping_expert_is_einval(void **state)
{
	const char *path = fresh_tiny();
	struct mpk_image m;
	char msg[128];

	(void)state;
	image_load(path, &m);
	m.tt[2].offset = m.et[9].offset + 8192;	/* blk.0.attn_q inside layer 1 expert 1 */
	snprintf(msg, sizeof(msg), "tensor blk.0.attn_q at offset %llu overlaps layer 1 expert 1",
		 (unsigned long long)m.tt[2].offset);
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains(msg));
}

static void tensor_overlapping_tables_is_einval(void **state)
{
	const char *path = fresh_tiny();
	struct mpk_image m;

	(void)state;
	image_load(path, &m);
	m.tt[0].offset = 4096;		/* tok_embd over the tensor table */
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("tensor tok_embd at offset 4096 overlaps the tensor table"));
}

static void extent_outside_file_is_einval(void **state)
{
	const char *path = fresh_tiny();
	struct mpk_image m;
	uint64_t past;
	char msg[160];

	(void)state;
	image_load(path, &m);
	past = MP_ALIGN_UP(m.h.file_bytes, MP_EXPERT_ALIGN);
	m.et[13].offset = past;
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	snprintf(msg, sizeof(msg), "layer 1 expert 5: extent [%llu, +393216) is outside the file",
		 (unsigned long long)past);
	assert_true(t_log_contains(msg));

	/* an offset whose end wraps around 2^64 must not pass the bounds check */
	image_load(path, &m);
	m.et[13].offset = 0xffffffffffe00000ull;
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("layer 1 expert 5: extent [18446744073707454464"));

	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 1), 0);
	image_load(path, &m);
	m.tt[30].offset = 0xfffffffffffff000ull;	/* output */
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("tensor output: extent [18446744073709547520"));
}

static void table_outside_file_is_einval(void **state)
{
	const char *path = fresh_tiny();
	struct mpk_image m;

	(void)state;
	image_load(path, &m);
	free(m.tt);
	free(m.et);
	/* only the header changes: its checksum is resealed, the tables' stays valid */
	m.h.expert_table_off = m.h.file_bytes - 100;
	seal_header(&m.h);
	{
		int fd = open(path, O_RDWR);

		assert_true(fd >= 0);
		pwrite_exact(fd, &m.h, sizeof(m.h), 0);
		close(fd);
	}
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("expert table at offset"));
	assert_true(t_log_contains("is outside the file"));
}

static void misaligned_expert_is_einval(void **state)
{
	const char *path = fresh_tiny();
	struct mpk_image m;
	char msg[128];

	(void)state;
	image_load(path, &m);
	m.et[30].offset += 4096;		/* layer 3 expert 6 */
	snprintf(msg, sizeof(msg), "layer 3 expert 6: offset %llu is not aligned to 2097152",
		 (unsigned long long)m.et[30].offset);
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains(msg));
}

static void misaligned_tensor_is_einval(void **state)
{
	const char *path = fresh_tiny();
	struct mpk_image m;

	(void)state;
	image_load(path, &m);
	m.tt[5].offset += 64;			/* blk.0.attn_o */
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("tensor blk.0.attn_o: offset"));
	assert_true(t_log_contains("is not 4096-aligned"));
}

static void tensor_shape_mismatch_is_einval(void **state)
{
	const char *path = fresh_tiny();
	struct mpk_image m;

	(void)state;
	image_load(path, &m);
	assert_string_equal(m.tt[9].name, "blk.1.attn_q");
	m.tt[9].dims[0] = 64;
	m.tt[9].bytes = 64 * 128 * 4;
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("tensor blk.1.attn_q: shape [64, 128]"));
	assert_true(t_log_contains("does not match the geometry's [128, 128]"));
}

static void tensor_table_wrong_set_is_einval(void **state)
{
	const char *path = fresh_tiny();
	struct mpk_image m;

	(void)state;
	/* two entries swapped: the set is right but the order is not */
	image_load(path, &m);
	{
		struct mpk_tensor_entry tmp = m.tt[2];

		m.tt[2] = m.tt[3];
		m.tt[3] = tmp;
	}
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("tensor entry 2 at offset"));
	assert_true(t_log_contains("is 'blk.0.attn_k', the geometry expects 'blk.0.attn_q'"));

	/* a wrong type */
	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 1), 0);
	image_load(path, &m);
	m.tt[1].dtype = MP_DTYPE_BF16;		/* blk.0.attn_norm must be f32 */
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("tensor blk.0.attn_norm: type 2, expected f32"));

	/* a name without its NUL */
	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 1), 0);
	image_load(path, &m);
	memset(m.tt[4].name, 'x', sizeof(m.tt[4].name));
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("tensor entry 4 at offset"));
	assert_true(t_log_contains("name is not NUL-terminated"));

	/* a tensor count the geometry does not define */
	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 1), 0);
	image_load(path, &m);
	m.h.n_tensors--;
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("tensor table has 30 entries, the geometry defines 31"));
}

static void expert_table_wrong_entry_is_einval(void **state)
{
	const char *path = fresh_tiny();
	struct mpk_image m;

	(void)state;
	image_load(path, &m);
	m.et[10].expert = 3;			/* entry 10 is layer 1 expert 2 */
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("is layer 1 expert 3, expected layer 1 expert 2"));

	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 1), 0);
	image_load(path, &m);
	m.et[10].bytes -= 4;
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("layer 1 expert 2: 393212 bytes, the geometry gives 393216"));

	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 1), 0);
	image_load(path, &m);
	m.et[10].flags = 4;
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EPROTONOSUPPORT);
	assert_true(t_log_contains("layer 1 expert 2: unknown flags 0x4"));
}

static void header_fields_are_checked(void **state)
{
	const char *path = fresh_tiny();
	struct mpk_image m;

	(void)state;
	image_load(path, &m);
	m.h.flags = 0x10;
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EPROTONOSUPPORT);
	assert_true(t_log_contains("unknown header flags 0x10"));

	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 1), 0);
	image_load(path, &m);
	m.h.expert_align = 4096;
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("expert_align is 4096, expected 2097152"));

	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 1), 0);
	image_load(path, &m);
	m.h.expert_bytes = 1;
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("expert_bytes is 1, the geometry gives 393216"));

	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 1), 0);
	image_load(path, &m);
	memset(m.h.name, 'n', sizeof(m.h.name));
	image_store(path, &m);
	assert_int_equal(open_fails(path), -EINVAL);
	assert_true(t_log_contains("model name at offset 136 is not NUL-terminated"));

	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 1), 0);
	image_load(path, &m);
	m.h.file_bytes = 1ull << 62;
	image_store(path, &m);
	assert_int_equal(open_fails(path), -ENODATA);
	assert_true(t_log_contains("header says 4611686018427387904"));
}

static void expert_checksum_mismatch_names_layer_and_expert(void **state)
{
	const char *path = fresh_tiny();
	struct mp_verify_result bad[4];
	struct mp_store *s;
	uint64_t eb;
	void *buf;

	(void)state;
	assert_int_equal(mp_store_open(path, &s), 0);
	eb = mp_store_expert_bytes(s);
	assert_int_equal(t_flip_byte(path, mp_store_expert(s, 2, 5)->offset + eb - 1), 0);
	buf = malloc(eb);
	t_log_reset();
	assert_int_equal(mp_store_read_expert(s, 2, 5, buf), -EBADMSG);
	assert_true(t_log_contains("layer 2 expert 5: checksum mismatch at offset"));
	assert_int_equal(mp_store_read_expert(s, 2, 4, buf), 0);
	assert_int_equal(mp_store_read_expert(s, 2, 6, buf), 0);

	memset(bad, 0, sizeof(bad));
	assert_int_equal(mp_store_verify(s, bad, 4, NULL, NULL), 1);
	assert_int_equal(bad[0].layer, 2);
	assert_int_equal(bad[0].expert, 5);
	assert_int_equal(bad[0].err, -EBADMSG);
	assert_int_equal(bad[1].err, 0);
	mp_store_close(s);
	free(buf);
}

static void count_progress(uint64_t done, uint64_t total, void *arg)
{
	uint64_t *n = arg;

	assert_int_equal(done, ++*n);
	assert_int_equal(total, 32);
}

static void verify_reports_every_bad_piece(void **state)
{
	const char *path = fresh_tiny();
	struct mp_verify_result bad[2];
	struct mp_store *s;
	const struct mp_tensor_info *t;
	uint64_t calls = 0;
	void *buf;

	(void)state;
	assert_int_equal(mp_store_open(path, &s), 0);
	assert_int_equal(t_flip_byte(path, mp_store_expert(s, 0, 1)->offset), 0);
	assert_int_equal(t_flip_byte(path, mp_store_expert(s, 1, 0)->offset + 77), 0);
	assert_int_equal(t_flip_byte(path, mp_store_expert(s, 3, 7)->offset + 4096), 0);
	t = mp_store_tensor(s, "blk.2.router");
	assert_int_equal(t_flip_byte(path, t->offset + 3), 0);

	t_log_reset();
	/* only 2 slots: the count still covers all four */
	assert_int_equal(mp_store_verify(s, bad, 2, NULL, NULL), 4);
	assert_int_equal(bad[0].layer, 0);
	assert_int_equal(bad[0].expert, 1);
	assert_int_equal(bad[1].layer, 1);
	assert_int_equal(bad[1].expert, 0);
	assert_true(t_log_contains("tensor blk.2.router: checksum mismatch"));

	buf = malloc(1 << 20);		/* room for blk.2.attn_q too */
	assert_int_equal(mp_store_read_tensor(s, t, buf), -EBADMSG);
	assert_true(t_log_contains("tensor blk.2.router: checksum mismatch at offset"));
	assert_int_equal(mp_store_read_tensor(s, mp_store_tensor(s, "blk.2.attn_q"), buf), 0);
	free(buf);

	assert_int_equal(mp_store_verify(s, NULL, 0, count_progress, &calls), 4);
	assert_int_equal(calls, 32);
	mp_store_close(s);
}

static void read_tensor_rejects_foreign_entry(void **state)
{
	const char *path = fresh_tiny();
	struct mp_tensor_info fake;
	struct mp_store *s;
	char buf[16];

	(void)state;
	assert_int_equal(mp_store_open(path, &s), 0);
	fake = *mp_store_tensor_at(s, 0);
	assert_int_equal(mp_store_read_tensor(s, &fake, buf), -EINVAL);
	mp_store_close(s);
}

/*
 * Random damage to the header and tables, with the checksums recomputed so
 * every later check is reached: open either succeeds with a usable store or
 * fails with an errno and a message. Run under ASan this shows no read out
 * of bounds and no crash.
 */
static void mutated_tables_never_crash(void **state)
{
	const char *path = fresh_tiny();
	size_t tlen, elen, total;
	unsigned char *img;
	struct mpk_image m;
	uint64_t x = 42;
	int fd, accepted = 0;

	(void)state;
	image_load(path, &m);
	tlen = m.h.n_tensors * sizeof(*m.tt);
	elen = m.h.n_experts * sizeof(*m.et);
	total = sizeof(m.h) + tlen + elen;
	img = malloc(total);
	memcpy(img, &m.h, sizeof(m.h));
	memcpy(img + sizeof(m.h), m.tt, tlen);
	memcpy(img + sizeof(m.h) + tlen, m.et, elen);
	free(m.tt);
	free(m.et);
	fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	for (int iter = 0; iter < 400; iter++) {
		struct mpk_header h;
		unsigned char *copy = malloc(total);
		XXH3_state_t *st = XXH3_createState();
		struct mp_store *s;
		int err, flips = 1 + iter % 4;

		memcpy(copy, img, total);
		for (int f = 0; f < flips; f++) {
			size_t at;

			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			/* the interesting fields: first 200 header bytes and the tables */
			at = (x >> 8) % (200 + tlen + elen);
			at = at < 200 ? at : sizeof(h) + (at - 200);
			copy[at] ^= (unsigned char)(1u << (x % 8)) | (unsigned char)(x >> 56);
		}
		memcpy(&h, copy, sizeof(h));
		XXH3_64bits_reset(st);
		XXH3_64bits_update(st, copy + sizeof(h), tlen + elen);
		h.tables_checksum = XXH3_64bits_digest(st);
		XXH3_freeState(st);
		seal_header(&h);
		memcpy(copy, &h, sizeof(h));
		pwrite_exact(fd, copy, total, 0);
		free(copy);

		t_log_reset();
		err = mp_store_open(path, &s);
		if (err) {
			assert_true(err == -EINVAL || err == -ENODATA || err == -EPROTO ||
				    err == -EPROTONOSUPPORT || err == -EBADMSG);
			assert_true(mp_last_error()[0] != 0);
			continue;
		}
		accepted++;
		for (uint32_t i = 0; i < mp_store_tensor_count(s); i++) {
			const struct mp_tensor_info *t = mp_store_tensor_at(s, i);

			assert_true(t->offset + t->bytes <= mp_store_file_bytes(s));
		}
		for (uint32_t l = 0; l < mp_store_geometry(s)->layers; l++) {
			for (uint32_t e = 0; e < mp_store_geometry(s)->experts; e++) {
				const struct mp_expert_info *xi = mp_store_expert(s, l, e);

				assert_true(xi->offset + xi->bytes <= mp_store_file_bytes(s));
			}
		}
		assert_true(mp_store_verify(s, NULL, 0, NULL, NULL) >= 0);
		mp_store_close(s);
	}
	close(fd);
	free(img);
	/* most flips land on checked fields; some (checksums, name) are harmless */
	assert_true(accepted < 400);
}

/*
 * Writer
 */

static void writer_refuses_missing_pieces(void **state)
{
	const char *path;
	struct mp_store_writer *w;
	struct mp_geometry g;
	void *buf = calloc(1, 1 << 20);

	(void)state;
	clear_dir();
	path = t_path("partial.mpk");
	assert_int_equal(mp_gen_preset("tiny", &g), 0);

	/* every tensor, all experts but one */
	assert_int_equal(mp_store_writer_create(path, &g, NULL, &w), 0);
	for (uint32_t i = 0; i < mp_store_writer_tensor_count(w); i++)
		assert_int_equal(mp_store_writer_put_tensor(w,
				 mp_store_writer_tensor_at(w, i)->name, buf), 0);
	for (uint32_t l = 0; l < g.layers; l++)
		for (uint32_t e = 0; e < g.experts; e++)
			if (l != 3 || e != 6)
				assert_int_equal(mp_store_writer_put_expert(w, l, e, buf), 0);
	t_log_reset();
	assert_int_equal(mp_store_writer_finish(w), -ENODATA);
	assert_true(t_log_contains("layer 3 expert 6 was never written"));
	assert_int_equal(access(path, F_OK), -1);
	assert_int_equal(dir_entries(), 0);

	/* a missing tensor is named too */
	assert_int_equal(mp_store_writer_create(path, &g, NULL, &w), 0);
	for (uint32_t i = 0; i < mp_store_writer_tensor_count(w); i++)
		if (strcmp(mp_store_writer_tensor_at(w, i)->name, "blk.2.ffn_norm"))
			assert_int_equal(mp_store_writer_put_tensor(w,
					 mp_store_writer_tensor_at(w, i)->name, buf), 0);
	t_log_reset();
	assert_int_equal(mp_store_writer_finish(w), -ENODATA);
	assert_true(t_log_contains("tensor blk.2.ffn_norm was never written"));
	assert_int_equal(dir_entries(), 0);
	free(buf);
}

static void writer_abort_leaves_no_file(void **state)
{
	const char *path;
	struct mp_store_writer *w;
	struct mp_geometry g;
	void *buf = calloc(1, 1 << 20);

	(void)state;
	clear_dir();
	path = t_path("aborted.mpk");
	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	assert_int_equal(mp_store_writer_create(path, &g, "x", &w), 0);
	assert_int_equal(dir_entries(), 1);	/* the temporary file */
	assert_int_equal(mp_store_writer_put_expert(w, 0, 0, buf), 0);
	mp_store_writer_abort(w);
	assert_int_equal(dir_entries(), 0);
	free(buf);
}

static void writer_abort_keeps_existing_model(void **state)
{
	const char *path;
	struct mp_store_writer *w;
	struct mp_geometry g;
	struct mp_store *s;

	(void)state;
	clear_dir();
	path = t_path("keep.mpk");
	assert_int_equal(t_gen_tiny(path, MP_DTYPE_F32, 5), 0);
	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	assert_int_equal(mp_store_writer_create(path, &g, "x", &w), 0);
	mp_store_writer_abort(w);
	assert_int_equal(mp_store_open(path, &s), 0);
	assert_int_equal(mp_store_verify(s, NULL, 0, NULL, NULL), 0);
	mp_store_close(s);
	assert_int_equal(dir_entries(), 1);
}

static void writer_rejects_bad_puts(void **state)
{
	const char *path;
	struct mp_store_writer *w = (struct mp_store_writer *)1;
	struct mp_geometry g;
	void *buf = calloc(1, 1 << 20);

	(void)state;
	clear_dir();
	path = t_path("puts.mpk");
	assert_int_equal(mp_gen_preset("tiny", &g), 0);

	g.topk = 9;
	t_log_reset();
	assert_int_equal(mp_store_writer_create(path, &g, NULL, &w), -EINVAL);
	assert_null(w);
	assert_true(t_log_contains("topk = 9"));
	assert_int_equal(dir_entries(), 0);
	g.topk = 2;

	{
		char long_name[80];

		memset(long_name, 'a', sizeof(long_name) - 1);
		long_name[sizeof(long_name) - 1] = 0;
		assert_int_equal(mp_store_writer_create(path, &g, long_name, &w), -EINVAL);
	}
	assert_int_equal(mp_store_writer_create(t_path("no/such/dir.mpk"), &g, NULL, &w),
			 -ENOENT);

	assert_int_equal(mp_store_writer_create(path, &g, NULL, &w), 0);
	assert_int_equal(mp_store_writer_put_tensor(w, "blk.9.attn_q", buf), -ENOENT);
	assert_true(t_log_contains("no tensor 'blk.9.attn_q'"));
	assert_int_equal(mp_store_writer_put_tensor(w, "blk.0.attn_q", buf), 0);
	assert_int_equal(mp_store_writer_put_tensor(w, "blk.0.attn_q", buf), -EEXIST);
	assert_int_equal(mp_store_writer_put_expert(w, 1, 1, buf), 0);
	assert_int_equal(mp_store_writer_put_expert(w, 1, 1, buf), -EEXIST);
	assert_true(t_log_contains("layer 1 expert 1 was already written"));
	assert_int_equal(mp_store_writer_put_expert(w, 4, 0, buf), -ERANGE);
	assert_int_equal(mp_store_writer_put_expert(w, 0, 8, buf), -ERANGE);
	assert_null(mp_store_writer_tensor_at(w, mp_store_writer_tensor_count(w)));
	mp_store_writer_abort(w);
	assert_int_equal(dir_entries(), 0);
	free(buf);
}

/* Unaligned caller buffers take the writer's bounce path; bytes must be the same. */
static void writer_accepts_unaligned_expert_buffers(void **state)
{
	const char *path = t_path("unaligned.mpk");
	struct mp_store_writer *w;
	struct mp_geometry g;
	struct mp_store *s;
	uint64_t eb;
	char *raw, *got;

	(void)state;
	assert_int_equal(mp_gen_preset("tiny", &g), 0);
	g.layers = 1;
	g.experts = 2;
	g.ffn = 100;		/* 3 * 128 * 100 * 2 bytes: not a multiple of 4096 */
	g.dtype = MP_DTYPE_F16;
	eb = mp_geometry_expert_bytes(&g);
	assert_true(eb % 4096);
	raw = malloc(eb + 1 + (1 << 20));
	got = malloc(eb);
	assert_int_equal(mp_store_writer_create(path, &g, NULL, &w), 0);
	for (uint32_t i = 0; i < mp_store_writer_tensor_count(w); i++)
		assert_int_equal(mp_store_writer_put_tensor(w,
				 mp_store_writer_tensor_at(w, i)->name, raw), 0);
	for (uint32_t e = 0; e < 2; e++) {
		pattern(raw + 1, eb, 77 + e);
		assert_int_equal(mp_store_writer_put_expert(w, 0, e, raw + 1), 0);
	}
	assert_int_equal(mp_store_writer_finish(w), 0);
	assert_int_equal(mp_store_open(path, &s), 0);
	for (uint32_t e = 0; e < 2; e++) {
		pattern(raw, eb, 77 + e);
		assert_int_equal(mp_store_read_expert(s, 0, e, got), 0);
		assert_memory_equal(raw, got, eb);
	}
	assert_int_equal(mp_store_file_bytes(s) % 4096, 0);
	mp_store_close(s);
	free(raw);
	free(got);
}

static int setup(void **state)
{
	(void)state;
	t_log_capture();
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	t_tmpdir_cleanup();
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(round_trip_f32),
		cmocka_unit_test(round_trip_f16),
		cmocka_unit_test(round_trip_bf16),
		cmocka_unit_test(round_trip_q8_0),
		cmocka_unit_test(round_trip_q4_0),
		cmocka_unit_test(expert_padding_is_a_hole),
		cmocka_unit_test(close_accepts_null),
		cmocka_unit_test(missing_file_is_enoent),
		cmocka_unit_test(empty_file_is_truncated),
		cmocka_unit_test(truncated_mid_header_is_enodata),
		cmocka_unit_test(truncated_mid_table_is_enodata),
		cmocka_unit_test(truncated_mid_expert_is_enodata),
		cmocka_unit_test(file_shrinking_after_open_is_enodata),
		cmocka_unit_test(bad_magic_is_eproto),
		cmocka_unit_test(unknown_version_is_eprotonosupport),
		cmocka_unit_test(header_checksum_mismatch_is_ebadmsg),
		cmocka_unit_test(table_checksum_mismatch_is_ebadmsg),
		cmocka_unit_test(absurd_geometry_is_einval),
		cmocka_unit_test(expert_extents_overlapping_is_einval),
		cmocka_unit_test(tensor_overlapping_expert_is_einval),
		cmocka_unit_test(tensor_overlapping_tables_is_einval),
		cmocka_unit_test(extent_outside_file_is_einval),
		cmocka_unit_test(table_outside_file_is_einval),
		cmocka_unit_test(misaligned_expert_is_einval),
		cmocka_unit_test(misaligned_tensor_is_einval),
		cmocka_unit_test(tensor_shape_mismatch_is_einval),
		cmocka_unit_test(tensor_table_wrong_set_is_einval),
		cmocka_unit_test(expert_table_wrong_entry_is_einval),
		cmocka_unit_test(header_fields_are_checked),
		cmocka_unit_test(expert_checksum_mismatch_names_layer_and_expert),
		cmocka_unit_test(verify_reports_every_bad_piece),
		cmocka_unit_test(read_tensor_rejects_foreign_entry),
		cmocka_unit_test(mutated_tables_never_crash),
		cmocka_unit_test(writer_refuses_missing_pieces),
		cmocka_unit_test(writer_abort_leaves_no_file),
		cmocka_unit_test(writer_abort_keeps_existing_model),
		cmocka_unit_test(writer_rejects_bad_puts),
		cmocka_unit_test(writer_accepts_unaligned_expert_buffers),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}

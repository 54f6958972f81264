// SPDX-License-Identifier: MIT
/* GGUF v3 reader: header, metadata, tensor infos, every offset and size checked against the file. */
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "store/fileio.h"
#include "store/gguf.h"

/* Reads go through a window of this many bytes (metadata is many small fields). */
#define WINDOW		(64u << 10)
/* Longest key we accept: keys are dotted names. */
#define KEY_MAX		4096u

/* ggml's tensor types: elements per block and bytes per block (0: no such type). */
static const struct {
	const char *name;
	uint32_t block;
	uint32_t bytes;
} ggml_types[GGML_TYPE_COUNT] = {
	[0] = { "f32", 1, 4 }, [1] = { "f16", 1, 2 }, [2] = { "q4_0", 32, 18 },
	[3] = { "q4_1", 32, 20 }, [6] = { "q5_0", 32, 22 }, [7] = { "q5_1", 32, 24 },
	[8] = { "q8_0", 32, 34 }, [9] = { "q8_1", 32, 36 }, [10] = { "q2_K", 256, 84 },
	[11] = { "q3_K", 256, 110 }, [12] = { "q4_K", 256, 144 }, [13] = { "q5_K", 256, 176 },
	[14] = { "q6_K", 256, 210 }, [15] = { "q8_K", 256, 292 },
	[16] = { "iq2_xxs", 256, 66 }, [17] = { "iq2_xs", 256, 74 },
	[18] = { "iq3_xxs", 256, 98 }, [19] = { "iq1_s", 256, 50 }, [20] = { "iq4_nl", 32, 18 },
	[21] = { "iq3_s", 256, 110 }, [22] = { "iq2_s", 256, 82 }, [23] = { "iq4_xs", 256, 136 },
	[24] = { "i8", 1, 1 }, [25] = { "i16", 1, 2 }, [26] = { "i32", 1, 4 },
	[27] = { "i64", 1, 8 }, [28] = { "f64", 1, 8 }, [29] = { "iq1_m", 256, 56 },
	[30] = { "bf16", 1, 2 }, [34] = { "tq1_0", 256, 54 }, [35] = { "tq2_0", 256, 66 },
	[39] = { "mxfp4", 32, 17 }, [40] = { "nvfp4", 64, 36 }, [41] = { "q1_0", 128, 18 },
	[42] = { "q2_0", 64, 18 },
};

/* Bytes of one value of each fixed-size metadata type (0: strings, arrays). */
static const uint8_t kv_size[GGUF_TYPE_COUNT] = {
	[GGUF_U8] = 1, [GGUF_I8] = 1, [GGUF_U16] = 2, [GGUF_I16] = 2, [GGUF_U32] = 4,
	[GGUF_I32] = 4, [GGUF_F32] = 4, [GGUF_BOOL] = 1, [GGUF_U64] = 8, [GGUF_I64] = 8,
	[GGUF_F64] = 8,
};

const char *ggml_type_name(uint32_t type)
{
	return type < GGML_TYPE_COUNT && ggml_types[type].name ? ggml_types[type].name : "unknown";
}

uint64_t ggml_type_bytes(uint32_t type, uint64_t n)
{
	uint64_t bytes;

	if (type >= GGML_TYPE_COUNT || !ggml_types[type].block || n % ggml_types[type].block ||
	    __builtin_mul_overflow(n / ggml_types[type].block, (uint64_t)ggml_types[type].bytes,
				   &bytes))
		return 0;
	return bytes;
}

int ggml_to_dtype(uint32_t type, enum mp_dtype *out)
{
	switch (type) {
	case GGML_F32: *out = MP_DTYPE_F32; return 0;
	case GGML_F16: *out = MP_DTYPE_F16; return 0;
	case GGML_BF16: *out = MP_DTYPE_BF16; return 0;
	case GGML_Q8_0: *out = MP_DTYPE_Q8_0; return 0;
	case GGML_Q4_0: *out = MP_DTYPE_Q4_0; return 0;
	default: return -EOPNOTSUPP;
	}
}

uint32_t ggml_from_dtype(enum mp_dtype t)
{
	static const uint32_t map[MP_DTYPE_COUNT] = {
		[MP_DTYPE_F32] = GGML_F32, [MP_DTYPE_F16] = GGML_F16, [MP_DTYPE_BF16] = GGML_BF16,
		[MP_DTYPE_Q8_0] = GGML_Q8_0, [MP_DTYPE_Q4_0] = GGML_Q4_0,
	};

	return map[t];
}

/* A cursor over the file with a read window; errors are the caller's to name. */
struct cur {
	int fd;
	uint64_t size;
	uint64_t pos;
	uint8_t *win;
	uint64_t win_off;
	uint64_t win_len;
};

static int cur_read(struct cur *c, void *dst, uint64_t n)
{
	uint8_t *d = dst;

	if (n > c->size - c->pos)
		return -ENODATA;
	while (n) {
		uint64_t in, take;

		if (c->pos < c->win_off || c->pos >= c->win_off + c->win_len) {
			ssize_t r = mpk_pread_full(c->fd, c->win,
						   (size_t)MP_MIN((uint64_t)WINDOW, c->size - c->pos),
						   c->pos);

			if (r < 0)
				return (int)r;
			if (r == 0)
				return -ENODATA;
			c->win_off = c->pos;
			c->win_len = (uint64_t)r;
		}
		in = c->pos - c->win_off;
		take = MP_MIN(n, c->win_len - in);
		memcpy(d, c->win + in, take);
		d += take;
		c->pos += take;
		n -= take;
	}
	return 0;
}

static int cur_skip(struct cur *c, uint64_t n)
{
	if (n > c->size - c->pos)
		return -ENODATA;
	c->pos += n;
	return 0;
}

/* A string: u64 length, bytes. *out (may be NULL: skipped) is a NUL-terminated copy. */
static int cur_str(struct cur *c, uint64_t max, char **out)
{
	uint64_t len;
	int err = cur_read(c, &len, sizeof(len));

	if (err)
		return err;
	if (len > max || len > c->size - c->pos)
		return len > c->size - c->pos ? -ENODATA : -E2BIG;
	if (!out)
		return cur_skip(c, len);
	*out = malloc(len + 1);
	if (!*out)
		return -ENOMEM;
	err = cur_read(c, *out, len);
	if (err) {
		free(*out);
		*out = NULL;
		return err;
	}
	(*out)[len] = 0;
	if (strlen(*out) != len) {	/* an embedded NUL: no key or name may hold one */
		free(*out);
		*out = NULL;
		return -EILSEQ;
	}
	return 0;
}

static const char *read_error(int err)
{
	switch (err) {
	case -ENODATA: return "truncated: the file ends inside it";
	case -E2BIG: return "a string longer than allowed";
	case -EILSEQ: return "a string with a NUL byte inside";
	case -ENOMEM: return "out of memory";
	default: return strerror(-err);
	}
}

/* Reports a failed read of a part of the file (what, at offset off). */
static int bad_read(const struct gguf_file *g, int err, const char *what, uint64_t off)
{
	return mp_err(err == -E2BIG || err == -EILSEQ ? -EINVAL : err,
		      "%s: %s at offset %llu: %s", g->path, what, (unsigned long long)off,
		      read_error(err));
}

/* A scalar value into kv->v (sign- or zero-extended, floats widened). */
static int read_scalar(struct cur *c, struct gguf_kv *kv)
{
	uint8_t raw[8] = { 0 };
	int err = cur_read(c, raw, kv_size[kv->type]);
	float f;

	if (err)
		return err;
	switch (kv->type) {
	case GGUF_I8: kv->v.i = (int8_t)raw[0]; break;
	case GGUF_I16: { int16_t x; memcpy(&x, raw, 2); kv->v.i = x; break; }
	case GGUF_I32: { int32_t x; memcpy(&x, raw, 4); kv->v.i = x; break; }
	case GGUF_I64: memcpy(&kv->v.i, raw, 8); break;
	case GGUF_F32: memcpy(&f, raw, 4); kv->v.f = f; break;
	case GGUF_F64: memcpy(&kv->v.f, raw, 8); break;
	default: memcpy(&kv->v.u, raw, 8); break;	/* little-endian: the low bytes */
	}
	return 0;
}

/* An array: element type, count, then the elements (strings walked one by one). */
static int read_array(struct gguf_file *g, struct cur *c, struct gguf_kv *kv)
{
	uint64_t bytes;
	int err;

	if ((err = cur_read(c, &kv->elem, sizeof(kv->elem))) ||
	    (err = cur_read(c, &kv->n, sizeof(kv->n))))
		return bad_read(g, err, "array header of key", c->pos);
	kv->off = c->pos;
	if (kv->elem >= GGUF_TYPE_COUNT || kv->elem == GGUF_ARRAY)
		return mp_err(-EINVAL, "%s: key '%s' at offset %llu: array of %s %u", g->path,
			      kv->key, (unsigned long long)kv->off,
			      kv->elem == GGUF_ARRAY ? "arrays (nested), type" : "unknown type",
			      kv->elem);
	if (kv->elem != GGUF_STRING) {
		if (__builtin_mul_overflow(kv->n, (uint64_t)kv_size[kv->elem], &bytes) ||
		    (err = cur_skip(c, bytes)))
			return mp_err(-ENODATA, "%s: key '%s': array of %llu values at offset %llu "
				      "runs past the end of the file (%llu bytes)", g->path,
				      kv->key, (unsigned long long)kv->n,
				      (unsigned long long)kv->off, (unsigned long long)g->size);
		return 0;
	}
	/* each string takes at least its 8-byte length: bound the count before walking */
	if (kv->n > (c->size - c->pos) / 8)
		return mp_err(-ENODATA, "%s: key '%s': %llu strings at offset %llu cannot fit the "
			      "file (%llu bytes)", g->path, kv->key, (unsigned long long)kv->n,
			      (unsigned long long)kv->off, (unsigned long long)g->size);
	for (uint64_t i = 0; i < kv->n; i++) {
		uint64_t at = c->pos;

		err = cur_str(c, UINT64_MAX, NULL);
		if (err)
			return mp_err(err, "%s: key '%s': string %llu at offset %llu: %s", g->path,
				      kv->key, (unsigned long long)i, (unsigned long long)at,
				      read_error(err));
	}
	return 0;
}

static int read_kv(struct gguf_file *g, struct cur *c, uint64_t i)
{
	struct gguf_kv *kv = &g->kv[i];
	uint64_t at = c->pos;
	int err;

	err = cur_str(c, KEY_MAX, &kv->key);
	if (err)
		return bad_read(g, err, "the key of metadata entry", at);
	kv->at = at;
	err = cur_read(c, &kv->type, sizeof(kv->type));
	if (err)
		return bad_read(g, err, "the type of key", at);
	kv->off = c->pos;
	if (kv->type >= GGUF_TYPE_COUNT)
		return mp_err(-EINVAL, "%s: key '%s' at offset %llu: unknown value type %u",
			      g->path, kv->key, (unsigned long long)at, kv->type);
	if (kv->type == GGUF_ARRAY)
		return read_array(g, c, kv);
	err = kv->type == GGUF_STRING ? cur_str(c, UINT64_MAX, &kv->str) : read_scalar(c, kv);
	if (err)
		return mp_err(err == -EILSEQ ? -EINVAL : err, "%s: key '%s': value at offset %llu: %s",
			      g->path, kv->key, (unsigned long long)kv->off, read_error(err));
	return 0;
}

/* Name, dims, type and offset of tensor i; its size is checked here, its place later. */
static int read_tensor_info(struct gguf_file *g, struct cur *c, uint64_t i)
{
	struct gguf_tensor *t = &g->t[i];
	uint64_t n = 1, rel;
	char *name = NULL;
	int err;

	t->info_off = c->pos;
	err = cur_str(c, GGUF_NAME_MAX - 1, &name);
	if (err)
		return bad_read(g, err, "the name of tensor info", t->info_off);
	memcpy(t->name, name, strlen(name) + 1);
	free(name);
	if ((err = cur_read(c, &t->n_dims, sizeof(t->n_dims))))
		return bad_read(g, err, "tensor info", t->info_off);
	if (t->n_dims > GGUF_MAX_DIMS)
		return mp_err(-EINVAL, "%s: tensor '%s' (info at offset %llu) has %u dimensions, "
			      "at most %u", g->path, t->name, (unsigned long long)t->info_off,
			      t->n_dims, GGUF_MAX_DIMS);
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
		t->ne[d] = 1;
		if (d < t->n_dims && (err = cur_read(c, &t->ne[d], sizeof(t->ne[d]))))
			return bad_read(g, err, "tensor info", t->info_off);
		if (t->ne[d] > INT64_MAX || __builtin_mul_overflow(n, t->ne[d], &n))
			return mp_err(-EINVAL, "%s: tensor '%s' (info at offset %llu): dimension "
				      "%u = %llu makes it too large", g->path, t->name,
				      (unsigned long long)t->info_off, d,
				      (unsigned long long)t->ne[d]);
	}
	if ((err = cur_read(c, &t->type, sizeof(t->type))) ||
	    (err = cur_read(c, &rel, sizeof(rel))))
		return bad_read(g, err, "tensor info", t->info_off);
	if (t->type >= GGML_TYPE_COUNT || !ggml_types[t->type].block)
		return mp_err(-EINVAL, "%s: tensor '%s' (info at offset %llu): unknown ggml type %u",
			      g->path, t->name, (unsigned long long)t->info_off, t->type);
	if (t->ne[0] % ggml_types[t->type].block)
		return mp_err(-EINVAL, "%s: tensor '%s' (info at offset %llu): rows of %llu %s "
			      "values are not whole blocks of %u", g->path, t->name,
			      (unsigned long long)t->info_off, (unsigned long long)t->ne[0],
			      ggml_type_name(t->type), ggml_types[t->type].block);
	t->bytes = ggml_type_bytes(t->type, n);
	if (!t->bytes && n)
		return mp_err(-EINVAL, "%s: tensor '%s' (info at offset %llu): %llu values of %s "
			      "overflow 64 bits", g->path, t->name, (unsigned long long)t->info_off,
			      (unsigned long long)n, ggml_type_name(t->type));
	t->off = rel;	/* relative to the data section until check_data() */
	return 0;
}

/* Names in a sorted array: the first that repeats, or -1. */
static int cmp_name(const void *a, const void *b)
{
	return strcmp(**(const char *const *const *)a, **(const char *const *const *)b);
}

/*
 * Keys and tensor names must be unique (llama.cpp refuses repeats). n names,
 * each the first member (at stride bytes) of an entry; sorting keeps this
 * O(n log n) for files that declare many of them. Returns the index of an
 * entry whose name repeats, or -1 (-2 when out of memory).
 */
static int64_t find_repeat(const void *base, uint64_t n, size_t stride, size_t name_off,
			   bool inline_name)
{
	const char **names = malloc((n ? n : 1) * sizeof(*names));
	const char ***order = malloc((n ? n : 1) * sizeof(*order));
	int64_t repeat = -1;

	if (!names || !order) {
		free(names);
		free(order);
		return -2;
	}
	for (uint64_t i = 0; i < n; i++) {
		const char *p = (const char *)base + i * stride + name_off;

		names[i] = inline_name ? p : *(const char *const *)p;
		order[i] = &names[i];
	}
	qsort(order, n, sizeof(*order), cmp_name);
	for (uint64_t i = 1; i < n && repeat < 0; i++)
		if (!strcmp(*order[i], *order[i - 1]))
			repeat = MP_MAX(order[i], order[i - 1]) - names;
	free(names);
	free(order);
	return repeat;
}

static int check_unique(struct gguf_file *g)
{
	int64_t k = find_repeat(g->kv, g->n_kv, sizeof(*g->kv), offsetof(struct gguf_kv, key),
				false);
	int64_t t = k == -1 ? find_repeat(g->t, g->n_tensors, sizeof(*g->t),
					  offsetof(struct gguf_tensor, name), true) : -1;

	if (k == -2 || t == -2)
		return mp_err(-ENOMEM, "%s: out of memory", g->path);
	if (k >= 0)
		return mp_err(-EINVAL, "%s: key '%s' at offset %llu appears twice", g->path,
			      g->kv[k].key, (unsigned long long)g->kv[k].at);
	if (t >= 0)
		return mp_err(-EINVAL, "%s: tensor '%s' (info at offset %llu) appears twice",
			      g->path, g->t[t].name, (unsigned long long)g->t[t].info_off);
	return 0;
}

static int find_alignment(struct gguf_file *g)
{
	const struct gguf_kv *kv = gguf_find_kv(g, GGUF_KEY_ALIGNMENT);

	g->alignment = GGUF_DEFAULT_ALIGN;
	if (!kv)
		return 0;
	if (kv->type != GGUF_U32 || !kv->v.u || (kv->v.u & (kv->v.u - 1)))
		return mp_err(-EINVAL, "%s: key '%s' at offset %llu must be a u32 power of two",
			      g->path, GGUF_KEY_ALIGNMENT, (unsigned long long)kv->off);
	g->alignment = kv->v.u;
	return 0;
}

static int cmp_tensor_off(const void *a, const void *b)
{
	const struct gguf_tensor *x = *(const struct gguf_tensor *const *)a;
	const struct gguf_tensor *y = *(const struct gguf_tensor *const *)b;

	return x->off < y->off ? -1 : x->off > y->off;
}

/* Every tensor's data aligned, inside the file and apart from every other's. */
static int check_data(struct gguf_file *g, uint64_t infos_end)
{
	struct gguf_tensor **by_off;
	int err = 0;

	if (!g->n_tensors)
		return 0;
	g->data_off = MP_ALIGN_UP(infos_end, g->alignment);
	if (g->data_off > g->size || g->data_off < infos_end)
		return mp_err(-ENODATA, "%s: truncated: the data section would start at offset %llu, "
			      "the file is %llu bytes", g->path, (unsigned long long)g->data_off,
			      (unsigned long long)g->size);
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		struct gguf_tensor *t = &g->t[i];
		uint64_t rel = t->off;

		if (rel % g->alignment)
			return mp_err(-EINVAL, "%s: tensor '%s' (info at offset %llu): data offset "
				      "%llu is not a multiple of the alignment %llu", g->path,
				      t->name, (unsigned long long)t->info_off,
				      (unsigned long long)rel, (unsigned long long)g->alignment);
		if (rel > g->size - g->data_off || t->bytes > g->size - g->data_off - rel)
			return mp_err(-ENODATA, "%s: tensor '%s' (info at offset %llu): data [%llu, "
				      "+%llu) runs past the end of the file (%llu bytes)", g->path,
				      t->name, (unsigned long long)t->info_off,
				      (unsigned long long)(g->data_off + rel),
				      (unsigned long long)t->bytes, (unsigned long long)g->size);
		t->off = g->data_off + rel;
	}
	by_off = malloc(g->n_tensors * sizeof(*by_off));
	if (!by_off)
		return mp_err(-ENOMEM, "%s: out of memory", g->path);
	for (uint64_t i = 0; i < g->n_tensors; i++)
		by_off[i] = &g->t[i];
	qsort(by_off, g->n_tensors, sizeof(*by_off), cmp_tensor_off);
	for (uint64_t i = 1; i < g->n_tensors && !err; i++)
		if (by_off[i]->off < by_off[i - 1]->off + by_off[i - 1]->bytes)
			err = mp_err(-EINVAL, "%s: tensor '%s' at offset %llu overlaps tensor '%s' "
				     "[%llu, +%llu)", g->path, by_off[i]->name,
				     (unsigned long long)by_off[i]->off, by_off[i - 1]->name,
				     (unsigned long long)by_off[i - 1]->off,
				     (unsigned long long)by_off[i - 1]->bytes);
	free(by_off);
	return err;
}

/* Header: magic, version and the two counts, each bounded by what the file can hold. */
static int read_header(struct gguf_file *g, struct cur *c)
{
	uint32_t magic = 0, version = 0;
	int err;

	if ((err = cur_read(c, &magic, sizeof(magic))) || magic != GGUF_MAGIC)
		return err && g->size < 4 ? mp_err(-ENODATA, "%s: truncated: %llu bytes, no magic",
						   g->path, (unsigned long long)g->size)
					  : mp_err(-EPROTO, "%s: bad magic at offset 0 (not a GGUF "
						   "file)", g->path);
	if ((err = cur_read(c, &version, sizeof(version))))
		return bad_read(g, err, "the version", 4);
	if (version != GGUF_VERSION)
		return mp_err(-EPROTONOSUPPORT, "%s: GGUF version %u at offset 4 (this reader knows "
			      "%u)", g->path, version, GGUF_VERSION);
	if ((err = cur_read(c, &g->n_tensors, sizeof(g->n_tensors))) ||
	    (err = cur_read(c, &g->n_kv, sizeof(g->n_kv))))
		return bad_read(g, err, "the header", 8);
	/* a key-value takes at least 13 bytes, a tensor info at least 24 */
	if (g->n_kv > g->size / 13 || g->n_tensors > g->size / 24)
		return mp_err(-EINVAL, "%s: header at offset 8 counts %llu tensors and %llu keys, "
			      "more than %llu bytes can hold", g->path,
			      (unsigned long long)g->n_tensors, (unsigned long long)g->n_kv,
			      (unsigned long long)g->size);
	g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
	g->t = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->t));
	if (!g->kv || !g->t)
		return mp_err(-ENOMEM, "%s: out of memory for %llu keys and %llu tensors", g->path,
			      (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors);
	return 0;
}

static int parse(struct gguf_file *g)
{
	struct cur c = { .fd = g->fd, .size = g->size };
	int err;

	c.win = malloc(WINDOW);
	if (!c.win)
		return mp_err(-ENOMEM, "%s: out of memory", g->path);
	err = read_header(g, &c);
	for (uint64_t i = 0; !err && i < g->n_kv; i++)
		err = read_kv(g, &c, i);
	if (!err)
		err = find_alignment(g);
	for (uint64_t i = 0; !err && i < g->n_tensors; i++)
		err = read_tensor_info(g, &c, i);
	if (!err)
		err = check_unique(g);
	if (!err)
		err = check_data(g, c.pos);
	free(c.win);
	return err;
}

int gguf_open(const char *path, struct gguf_file **out)
{
	struct gguf_file *g;
	struct stat st;
	int err;

	*out = NULL;
	g = calloc(1, sizeof(*g));
	if (!g || !(g->path = strdup(path))) {
		free(g);
		return mp_err(-ENOMEM, "%s: out of memory", path);
	}
	g->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (g->fd < 0) {
		err = mp_err(-errno, "%s: cannot open: %s", path, strerror(errno));
		goto close_file;
	}
	if (fstat(g->fd, &st) || !S_ISREG(st.st_mode)) {
		err = mp_err(-EINVAL, "%s: not a regular file", path);
		goto close_file;
	}
	g->size = (uint64_t)st.st_size;
	err = parse(g);
	if (err)
		goto close_file;
	*out = g;
	return 0;
close_file:
	gguf_close(g);
	return err;
}

void gguf_close(struct gguf_file *g)
{
	if (!g)
		return;
	if (g->fd >= 0)
		close(g->fd);
	for (uint64_t i = 0; g->kv && i < g->n_kv; i++) {
		free(g->kv[i].key);
		free(g->kv[i].str);
	}
	free(g->kv);
	free(g->t);
	free(g->path);
	free(g);
}

const struct gguf_kv *gguf_find_kv(const struct gguf_file *g, const char *key)
{
	for (uint64_t i = 0; i < g->n_kv; i++)
		if (g->kv[i].key && !strcmp(g->kv[i].key, key))
			return &g->kv[i];
	return NULL;
}

const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name)
{
	for (uint64_t i = 0; i < g->n_tensors; i++)
		if (!strcmp(g->t[i].name, name))
			return &g->t[i];
	return NULL;
}

static bool is_int(uint32_t type)
{
	return type <= GGUF_I32 || type == GGUF_U64 || type == GGUF_I64;
}

static bool is_signed(uint32_t type)
{
	return type == GGUF_I8 || type == GGUF_I16 || type == GGUF_I32 || type == GGUF_I64;
}

int gguf_get_u32(const struct gguf_file *g, const char *key, uint32_t *out)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);

	if (!kv)
		return -ENOENT;
	if (!is_int(kv->type) || (is_signed(kv->type) ? kv->v.i < 0 || kv->v.i > UINT32_MAX
						      : kv->v.u > UINT32_MAX))
		return mp_err(-EINVAL, "%s: key '%s' at offset %llu is not an integer in [0, 2^32)",
			      g->path, key, (unsigned long long)kv->off);
	*out = (uint32_t)kv->v.u;
	return 0;
}

int gguf_get_f32(const struct gguf_file *g, const char *key, float *out)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_F32 && kv->type != GGUF_F64)
		return mp_err(-EINVAL, "%s: key '%s' at offset %llu is not a float", g->path, key,
			      (unsigned long long)kv->off);
	*out = (float)kv->v.f;
	return 0;
}

int gguf_get_str(const struct gguf_file *g, const char *key, const char **out)
{
	const struct gguf_kv *kv = gguf_find_kv(g, key);

	if (!kv)
		return -ENOENT;
	if (kv->type != GGUF_STRING)
		return mp_err(-EINVAL, "%s: key '%s' at offset %llu is not a string", g->path, key,
			      (unsigned long long)kv->off);
	*out = kv->str;
	return 0;
}

int gguf_read(struct gguf_file *g, const struct gguf_tensor *t, uint64_t off, void *buf,
	      uint64_t len)
{
	ssize_t n;

	if (off > t->bytes || len > t->bytes - off)
		return mp_err(-EINVAL, "%s: tensor '%s': read of [%llu, +%llu) outside its %llu bytes",
			      g->path, t->name, (unsigned long long)off, (unsigned long long)len,
			      (unsigned long long)t->bytes);
	n = mpk_pread_full(g->fd, buf, len, t->off + off);
	if (n < 0 || (uint64_t)n != len)
		return mp_err(n < 0 ? (int)n : -ENODATA, "%s: tensor '%s': read at offset %llu: %s",
			      g->path, t->name, (unsigned long long)(t->off + off),
			      n < 0 ? strerror((int)-n) : "the file shrank");
	return 0;
}

// SPDX-License-Identifier: MIT
/* GGUF v3 writer: metadata and tensor infos declared, then data at their offsets, renamed into place. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "store/fileio.h"
#include "store/gguf.h"

struct wtensor {
	char name[GGUF_NAME_MAX];
	uint32_t type;
	uint32_t n_dims;
	uint64_t ne[GGUF_MAX_DIMS];
	uint64_t rel;			/* offset in the data section */
	uint64_t bytes;
	uint64_t written;		/* bytes written so far (each written once, in pieces) */
};

struct gguf_writer {
	struct mpk_tmpfile f;		/* renamed into place by finish */
	const char *path;		/* f.path */
	uint32_t alignment;
	/* The metadata, encoded as it is declared. */
	uint8_t *meta;
	size_t meta_len, meta_cap;
	uint64_t n_kv;
	struct wtensor *t;
	uint32_t n_tensors, cap_tensors;
	uint64_t data_size;		/* end of the last tensor, padded */
	uint64_t data_off;		/* set by begin_data */
	bool started;
	int err;			/* the first error: every later call returns it */
};

static int put(struct gguf_writer *w, const void *p, size_t n)
{
	if (w->err)
		return w->err;
	if (w->meta_len + n > w->meta_cap) {
		size_t cap = MP_MAX(w->meta_cap * 2, w->meta_len + n + 4096);
		uint8_t *m = realloc(w->meta, cap);

		if (!m)
			return w->err = mp_err(-ENOMEM, "%s: out of memory for metadata", w->path);
		w->meta = m;
		w->meta_cap = cap;
	}
	memcpy(w->meta + w->meta_len, p, n);
	w->meta_len += n;
	return 0;
}

static int put_u32(struct gguf_writer *w, uint32_t v)
{
	return put(w, &v, sizeof(v));
}

static int put_u64(struct gguf_writer *w, uint64_t v)
{
	return put(w, &v, sizeof(v));
}

static int put_str(struct gguf_writer *w, const char *s)
{
	size_t n = strlen(s);

	return put_u64(w, n) ? w->err : put(w, s, n);
}

/* A key and its value type; counts the entry. */
static int put_key(struct gguf_writer *w, const char *key, uint32_t type)
{
	if (!w->err && w->started)
		w->err = mp_err(-EINVAL, "%s: key '%s' declared after the data began", w->path, key);
	if (put_str(w, key) || put_u32(w, type))
		return w->err;
	w->n_kv++;
	return 0;
}

int gguf_writer_u32(struct gguf_writer *w, const char *key, uint32_t v)
{
	return put_key(w, key, GGUF_U32) ? w->err : put_u32(w, v);
}

int gguf_writer_f32(struct gguf_writer *w, const char *key, float v)
{
	return put_key(w, key, GGUF_F32) ? w->err : put(w, &v, sizeof(v));
}

int gguf_writer_bool(struct gguf_writer *w, const char *key, bool v)
{
	uint8_t b = v;

	return put_key(w, key, GGUF_BOOL) ? w->err : put(w, &b, 1);
}

int gguf_writer_str(struct gguf_writer *w, const char *key, const char *v)
{
	return put_key(w, key, GGUF_STRING) ? w->err : put_str(w, v);
}

static int put_array(struct gguf_writer *w, const char *key, uint32_t elem, uint64_t n)
{
	if (put_key(w, key, GGUF_ARRAY) || put_u32(w, elem))
		return w->err;
	return put_u64(w, n);
}

int gguf_writer_strs(struct gguf_writer *w, const char *key, const char *const *v, uint64_t n)
{
	if (put_array(w, key, GGUF_STRING, n))
		return w->err;
	for (uint64_t i = 0; i < n; i++)
		if (put_str(w, v[i]))
			return w->err;
	return 0;
}

int gguf_writer_f32s(struct gguf_writer *w, const char *key, const float *v, uint64_t n)
{
	return put_array(w, key, GGUF_F32, n) ? w->err : put(w, v, n * sizeof(*v));
}

int gguf_writer_i32s(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
	return put_array(w, key, GGUF_I32, n) ? w->err : put(w, v, n * sizeof(*v));
}

int gguf_writer_tensor(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
		       const uint64_t *ne)
{
	struct wtensor *t;
	uint64_t n = 1;

	if (w->err)
		return w->err;
	if (w->started || strlen(name) >= GGUF_NAME_MAX || !n_dims || n_dims > GGUF_MAX_DIMS)
		return w->err = mp_err(-EINVAL, "%s: cannot declare tensor '%s' (%u dims)%s",
				       w->path, name, n_dims, w->started ? " after the data began" : "");
	if (w->n_tensors == w->cap_tensors) {
		uint32_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
		struct wtensor *nt = realloc(w->t, cap * sizeof(*nt));

		if (!nt)
			return w->err = mp_err(-ENOMEM, "%s: out of memory", w->path);
		w->t = nt;
		w->cap_tensors = cap;
	}
	t = &w->t[w->n_tensors];
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->type = type;
	t->n_dims = n_dims;
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
		t->ne[d] = d < n_dims ? ne[d] : 1;
		n *= t->ne[d];
	}
	t->bytes = ggml_type_bytes(type, n);
	if (!t->bytes)
		return w->err = mp_err(-EINVAL, "%s: tensor '%s': %llu values of %s make no whole "
				       "blocks", w->path, name, (unsigned long long)n,
				       ggml_type_name(type));
	/* llama.cpp wants each tensor right after the previous one, padded to the alignment */
	t->rel = w->data_size;
	w->data_size = MP_ALIGN_UP(t->rel + t->bytes, w->alignment);
	return (int)w->n_tensors++;
}

int gguf_writer_begin_data(struct gguf_writer *w)
{
	uint64_t head[3];
	int err;

	/* the tensor infos follow the metadata in the same buffer */
	for (uint32_t i = 0; i < w->n_tensors && !w->err; i++) {
		const struct wtensor *t = &w->t[i];

		put_str(w, t->name);
		put_u32(w, t->n_dims);
		put(w, t->ne, t->n_dims * sizeof(t->ne[0]));
		put_u32(w, t->type);
		put_u64(w, t->rel);
	}
	if (w->err)
		return w->err;
	w->started = true;
	head[0] = (uint64_t)GGUF_VERSION << 32 | GGUF_MAGIC;
	head[1] = w->n_tensors;
	head[2] = w->n_kv;
	w->data_off = MP_ALIGN_UP(sizeof(head) + w->meta_len, w->alignment);
	/* the padding between tensors stays a hole: zeros */
	err = ftruncate(w->f.fd, (off_t)(w->data_off + w->data_size)) ? -errno : 0;
	if (!err)
		err = mpk_pwrite_full(w->f.fd, head, sizeof(head), 0);
	if (!err)
		err = mpk_pwrite_full(w->f.fd, w->meta, w->meta_len, sizeof(head));
	if (err)
		return w->err = mp_err(err, "%s: writing the header and metadata: %s",
				       w->f.tmp_path, strerror(-err));
	return 0;
}

int gguf_writer_data(struct gguf_writer *w, int i, uint64_t off, const void *buf, uint64_t len)
{
	struct wtensor *t;
	int err;

	if (w->err)
		return w->err;
	if (!w->started || i < 0 || (uint32_t)i >= w->n_tensors)
		return w->err = mp_err(-EINVAL, "%s: data for tensor %d before begin_data or unknown",
				       w->path, i);
	t = &w->t[i];
	if (off > t->bytes || len > t->bytes - off)
		return w->err = mp_err(-EINVAL, "%s: tensor '%s': write of [%llu, +%llu) outside "
				       "its %llu bytes", w->path, t->name, (unsigned long long)off,
				       (unsigned long long)len, (unsigned long long)t->bytes);
	err = mpk_pwrite_full(w->f.fd, buf, len, w->data_off + t->rel + off);
	if (err)
		return w->err = mp_err(err, "%s: writing tensor '%s' at offset %llu: %s",
				       w->f.tmp_path, t->name,
				       (unsigned long long)(w->data_off + t->rel + off), strerror(-err));
	t->written += len;
	return 0;
}

uint64_t gguf_writer_tensor_bytes(const struct gguf_writer *w, int i)
{
	return w->t[i].bytes;
}

int gguf_writer_create(const char *path, uint32_t alignment, struct gguf_writer **out)
{
	struct gguf_writer *w;
	int err;

	*out = NULL;
	if (!alignment || (alignment & (alignment - 1)))
		return mp_err(-EINVAL, "%s: alignment %u is not a power of two", path, alignment);
	w = calloc(1, sizeof(*w));
	if (!w)
		return mp_err(-ENOMEM, "%s: out of memory", path);
	err = mpk_tmpfile_create(&w->f, path);
	if (err) {
		free(w);
		return err;
	}
	w->path = w->f.path;
	w->alignment = alignment;
	if (alignment != GGUF_DEFAULT_ALIGN &&
	    (err = gguf_writer_u32(w, GGUF_KEY_ALIGNMENT, alignment))) {
		gguf_writer_abort(w);
		return err;
	}
	*out = w;
	return 0;
}

static void writer_free(struct gguf_writer *w)
{
	free(w->meta);
	free(w->t);
	free(w);
}

int gguf_writer_finish(struct gguf_writer *w)
{
	int err = w->err;

	for (uint32_t i = 0; i < w->n_tensors && !err; i++)
		if (w->t[i].written != w->t[i].bytes)
			err = mp_err(-ENODATA, "%s: tensor '%s' got %llu of its %llu bytes", w->path,
				     w->t[i].name, (unsigned long long)w->t[i].written,
				     (unsigned long long)w->t[i].bytes);
	if (!err && !w->started)
		err = mp_err(-EINVAL, "%s: finished before the data began", w->path);
	if (err) {
		gguf_writer_abort(w);
		return err;
	}
	err = mpk_tmpfile_commit(&w->f);	/* aborts the file itself on failure */
	writer_free(w);
	return err;
}

void gguf_writer_abort(struct gguf_writer *w)
{
	if (!w)
		return;
	mpk_tmpfile_abort(&w->f);
	writer_free(w);
}

// SPDX-License-Identifier: MIT
/* The .mpk reader: validates header, tables and extents; reads and verifies tensors and experts. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <moepager/store.h>

#include "base/base.h"
#include "base/hash.h"
#include "store/fileio.h"
#include "store/format.h"
#include "store/layout.h"

/* Read size used to stream checksums over large extents (verify). */
#define VERIFY_CHUNK	(16u << 20)
/* O_DIRECT offsets, lengths and buffers are aligned to this. */
#define DIRECT_ALIGN	4096u

struct mp_store {
	char *path;
	int fd;
	struct mp_geometry geom;
	char name[MPK_NAME_MAX];
	uint64_t file_bytes;
	uint64_t identity;
	uint64_t expert_bytes;
	uint64_t total_expert_bytes;
	uint32_t n_tensors;
	uint32_t n_experts;
	struct mp_tensor_info *tensors;
	struct mp_expert_info *experts;	/* layer-major */
};

/* One piece of the file for the overlap check. */
struct extent {
	uint64_t off;
	uint64_t end;
	int kind;		/* EXT_* */
	uint32_t index;		/* tensor index or expert index */
};

enum { EXT_HEADER, EXT_TENSOR_TABLE, EXT_EXPERT_TABLE, EXT_TENSOR, EXT_EXPERT };

static void extent_name(const struct mp_store *s, const struct extent *e, char *buf, size_t len)
{
	switch (e->kind) {
	case EXT_HEADER:
		snprintf(buf, len, "the header");
		break;
	case EXT_TENSOR_TABLE:
		snprintf(buf, len, "the tensor table");
		break;
	case EXT_EXPERT_TABLE:
		snprintf(buf, len, "the expert table");
		break;
	case EXT_TENSOR:
		snprintf(buf, len, "tensor %s", s->tensors[e->index].name);
		break;
	default:
		snprintf(buf, len, "layer %u expert %u", s->experts[e->index].layer,
			 s->experts[e->index].expert);
		break;
	}
}

static int cmp_extent(const void *a, const void *b)
{
	const struct extent *x = a, *y = b;

	if (x->off != y->off)
		return x->off < y->off ? -1 : 1;
	return x->end < y->end ? -1 : x->end > y->end;
}

/* Every extent inside the file was checked by the caller; this finds overlaps. */
static int check_overlaps(struct mp_store *s, const struct mpk_header *h)
{
	size_t n = 3 + (size_t)s->n_tensors + s->n_experts, k = 0;
	struct extent *ext = malloc(n * sizeof(*ext));
	char a[96], b[96];
	int err = 0;

	if (!ext)
		return mp_err(-ENOMEM, "%s: out of memory checking %zu extents", s->path, n);
#define ADD_EXTENT(o, len, kind, i) \
	(ext[k++] = (struct extent){ (o), (o) + (len), (kind), (i) })
	ADD_EXTENT(0, MPK_HEADER_BYTES, EXT_HEADER, 0);
	ADD_EXTENT(h->tensor_table_off, (uint64_t)h->n_tensors * MPK_TENSOR_ENTRY_BYTES,
		   EXT_TENSOR_TABLE, 0);
	ADD_EXTENT(h->expert_table_off, (uint64_t)h->n_experts * MPK_EXPERT_ENTRY_BYTES,
		   EXT_EXPERT_TABLE, 0);
	for (uint32_t i = 0; i < s->n_tensors; i++)
		ADD_EXTENT(s->tensors[i].offset, s->tensors[i].bytes, EXT_TENSOR, i);
	for (uint32_t i = 0; i < s->n_experts; i++)
		ADD_EXTENT(s->experts[i].offset, s->experts[i].bytes, EXT_EXPERT, i);
#undef ADD_EXTENT
	qsort(ext, k, sizeof(*ext), cmp_extent);
	for (size_t i = 1; i < k; i++) {
		/* empty tables (0 entries) cannot overlap anything */
		if (ext[i].off < ext[i - 1].end && ext[i].off != ext[i].end &&
		    ext[i - 1].off != ext[i - 1].end) {
			extent_name(s, &ext[i], a, sizeof(a));
			extent_name(s, &ext[i - 1], b, sizeof(b));
			err = mp_err(-EINVAL, "%s: %s at offset %llu overlaps %s [%llu, %llu)",
				     s->path, a, (unsigned long long)ext[i].off, b,
				     (unsigned long long)ext[i - 1].off,
				     (unsigned long long)ext[i - 1].end);
			break;
		}
	}
	free(ext);
	return err;
}

static int check_header(struct mp_store *s, const struct mpk_header *h, uint64_t size)
{
	uint64_t sum;

	if (h->version != MP_MPK_VERSION)
		return mp_err(-EPROTONOSUPPORT,
			      "%s: unknown format version %u at offset 8 (this reader knows %u)",
			      s->path, h->version, MP_MPK_VERSION);
	sum = XXH3_64bits(h, offsetof(struct mpk_header, header_checksum));
	if (sum != h->header_checksum)
		return mp_err(-EBADMSG,
			      "%s: header checksum mismatch (stored %016llx, computed %016llx): "
			      "bytes [0, %u) are corrupt", s->path,
			      (unsigned long long)h->header_checksum, (unsigned long long)sum,
			      MPK_HEADER_BYTES);
	if (h->header_bytes != MPK_HEADER_BYTES)
		return mp_err(-EINVAL, "%s: header_bytes is %u at offset 12, expected %u",
			      s->path, h->header_bytes, MPK_HEADER_BYTES);
	if (h->flags & ~MPK_FLAGS_KNOWN)
		return mp_err(-EPROTONOSUPPORT, "%s: unknown header flags 0x%x at offset %zu",
			      s->path, h->flags & ~MPK_FLAGS_KNOWN,
			      offsetof(struct mpk_header, flags));
	if (h->file_bytes < MPK_HEADER_BYTES || h->file_bytes > INT64_MAX)
		return mp_err(-EINVAL, "%s: file_bytes %llu at offset 16 is impossible",
			      s->path, (unsigned long long)h->file_bytes);
	if (size < h->file_bytes)
		return mp_err(-ENODATA, "%s: truncated: file is %llu bytes, header says %llu",
			      s->path, (unsigned long long)size, (unsigned long long)h->file_bytes);
	if (!memchr(h->name, 0, sizeof(h->name)))
		return mp_err(-EINVAL, "%s: model name at offset %zu is not NUL-terminated",
			      s->path, offsetof(struct mpk_header, name));
	memcpy(s->name, h->name, sizeof(s->name));
	s->file_bytes = h->file_bytes;
	s->identity = XXH3_64bits(h, offsetof(struct mpk_header, name));
	return 0;
}

static int check_geometry(struct mp_store *s, const struct mpk_header *h)
{
	struct mp_geometry *g = &s->geom;
	char why[512];
	int err;

	/* checked before it becomes an enum: only mp_dtype's values may be stored in one */
	if (h->dtype >= MP_DTYPE_COUNT)
		return mp_err(-EINVAL, "%s: unknown weight type %u at offset %zu", s->path,
			      h->dtype, offsetof(struct mpk_header, dtype));
	*g = (struct mp_geometry){
		.layers = h->layers, .experts = h->experts, .topk = h->topk,
		.hidden = h->hidden, .ffn = h->ffn, .heads = h->heads,
		.kv_heads = h->kv_heads, .head_dim = h->head_dim, .vocab = h->vocab,
		.max_seq = h->max_seq, .dtype = (enum mp_dtype)h->dtype,
		.rope_theta = h->rope_theta, .norm_eps = h->norm_eps,
	};
	err = mp_geometry_check(g);
	if (err) {
		snprintf(why, sizeof(why), "%s", mp_last_error());
		return mp_err(err, "%s: absurd geometry in the header: %s", s->path, why);
	}
	return 0;
}

/* The table fields that must match the geometry exactly. */
static int check_table_fields(struct mp_store *s, const struct mpk_header *h,
			      const struct mpk_layout *l)
{
	const char *p = s->path;

	if (h->tensor_entry_bytes != MPK_TENSOR_ENTRY_BYTES)
		return mp_err(-EINVAL, "%s: tensor_entry_bytes is %u, expected %u", p,
			      h->tensor_entry_bytes, MPK_TENSOR_ENTRY_BYTES);
	if (h->expert_entry_bytes != MPK_EXPERT_ENTRY_BYTES)
		return mp_err(-EINVAL, "%s: expert_entry_bytes is %u, expected %u", p,
			      h->expert_entry_bytes, MPK_EXPERT_ENTRY_BYTES);
	if (h->expert_align != MP_EXPERT_ALIGN)
		return mp_err(-EINVAL, "%s: expert_align is %llu, expected %u", p,
			      (unsigned long long)h->expert_align, MP_EXPERT_ALIGN);
	if (h->expert_bytes != l->expert_bytes)
		return mp_err(-EINVAL, "%s: expert_bytes is %llu, the geometry gives %llu", p,
			      (unsigned long long)h->expert_bytes,
			      (unsigned long long)l->expert_bytes);
	if (h->n_tensors != l->n_tensors)
		return mp_err(-EINVAL, "%s: tensor table has %u entries, the geometry defines %u",
			      p, h->n_tensors, l->n_tensors);
	if (h->n_experts != l->n_experts)
		return mp_err(-EINVAL, "%s: expert table has %u entries, the geometry defines %u",
			      p, h->n_experts, l->n_experts);
	if (h->tensor_table_off < MPK_HEADER_BYTES ||
	    h->tensor_table_off > h->file_bytes ||
	    h->file_bytes - h->tensor_table_off < (uint64_t)h->n_tensors * MPK_TENSOR_ENTRY_BYTES)
		return mp_err(-EINVAL, "%s: tensor table at offset %llu (%u entries) is outside "
			      "the file (%llu bytes)", p, (unsigned long long)h->tensor_table_off,
			      h->n_tensors, (unsigned long long)h->file_bytes);
	if (h->expert_table_off < MPK_HEADER_BYTES ||
	    h->expert_table_off > h->file_bytes ||
	    h->file_bytes - h->expert_table_off < (uint64_t)h->n_experts * MPK_EXPERT_ENTRY_BYTES)
		return mp_err(-EINVAL, "%s: expert table at offset %llu (%u entries) is outside "
			      "the file (%llu bytes)", p, (unsigned long long)h->expert_table_off,
			      h->n_experts, (unsigned long long)h->file_bytes);
	return 0;
}

static void format_shape(char *buf, size_t len, uint32_t ndim, const uint64_t *dims)
{
	int n = snprintf(buf, len, "[");

	for (uint32_t i = 0; i < ndim && i < MPK_MAX_DIMS && n > 0 && (size_t)n < len; i++)
		n += snprintf(buf + n, len - (size_t)n, "%s%llu", i ? ", " : "",
			      (unsigned long long)dims[i]);
	if (n > 0 && (size_t)n < len)
		snprintf(buf + n, len - (size_t)n, "]");
}

static int parse_tensor(struct mp_store *s, const struct mpk_tensor_entry *e, uint32_t i,
			uint64_t entry_off, const struct mp_tensor_info *want)
{
	struct mp_tensor_info *t = &s->tensors[i];
	char have_shape[96], want_shape[96];
	bool ovf;

	if (!memchr(e->name, 0, sizeof(e->name)))
		return mp_err(-EINVAL, "%s: tensor entry %u at offset %llu: name is not "
			      "NUL-terminated", s->path, i, (unsigned long long)entry_off);
	if (strcmp(e->name, want->name))
		return mp_err(-EINVAL, "%s: tensor entry %u at offset %llu is '%s', the geometry "
			      "expects '%s' there", s->path, i, (unsigned long long)entry_off,
			      e->name, want->name);
	if (e->dtype != (uint32_t)want->dtype)
		return mp_err(-EINVAL, "%s: tensor %s: type %u, expected %s", s->path, e->name,
			      e->dtype, mp_dtype_name(want->dtype));
	if (e->ndim != want->ndim || memcmp(e->dims, want->dims, sizeof(e->dims))) {
		format_shape(have_shape, sizeof(have_shape), MP_MIN(e->ndim, MPK_MAX_DIMS),
			     e->dims);
		format_shape(want_shape, sizeof(want_shape), want->ndim, want->dims);
		return mp_err(-EINVAL, "%s: tensor %s: shape %s (entry at offset %llu) does not "
			      "match the geometry's %s", s->path, e->name, have_shape,
			      (unsigned long long)entry_off, want_shape);
	}
	if (e->bytes != mpk_shape_bytes(want->dtype, want->ndim, want->dims, &ovf))
		return mp_err(-EINVAL, "%s: tensor %s: %llu bytes, its shape needs %llu", s->path,
			      e->name, (unsigned long long)e->bytes,
			      (unsigned long long)want->bytes);
	if (e->offset % MPK_TENSOR_ALIGN)
		return mp_err(-EINVAL, "%s: tensor %s: offset %llu is not %u-aligned", s->path,
			      e->name, (unsigned long long)e->offset, MPK_TENSOR_ALIGN);
	if (e->offset > s->file_bytes || s->file_bytes - e->offset < e->bytes)
		return mp_err(-EINVAL, "%s: tensor %s: extent [%llu, +%llu) is outside the file "
			      "(%llu bytes)", s->path, e->name, (unsigned long long)e->offset,
			      (unsigned long long)e->bytes, (unsigned long long)s->file_bytes);
	*t = *want;
	t->offset = e->offset;
	t->checksum = e->checksum;
	return 0;
}

static int parse_expert(struct mp_store *s, const struct mpk_expert_entry *e, uint32_t i,
			uint64_t entry_off)
{
	struct mp_expert_info *x = &s->experts[i];
	uint32_t layer = i / s->geom.experts, expert = i % s->geom.experts;

	if (e->layer != layer || e->expert != expert)
		return mp_err(-EINVAL, "%s: expert entry %u at offset %llu is layer %u expert %u, "
			      "expected layer %u expert %u", s->path, i,
			      (unsigned long long)entry_off, e->layer, e->expert, layer, expert);
	if (e->bytes != s->expert_bytes)
		return mp_err(-EINVAL,
			      "%s: layer %u expert %u: %llu bytes, the geometry gives %llu",
			      s->path, layer, expert, (unsigned long long)e->bytes,
			      (unsigned long long)s->expert_bytes);
	if (e->flags)
		return mp_err(-EPROTONOSUPPORT, "%s: layer %u expert %u: unknown flags 0x%x",
			      s->path, layer, expert, e->flags);
	if (e->offset % MP_EXPERT_ALIGN)
		return mp_err(-EINVAL, "%s: layer %u expert %u: offset %llu is not aligned to %u",
			      s->path, layer, expert, (unsigned long long)e->offset,
			      MP_EXPERT_ALIGN);
	if (e->offset > s->file_bytes || s->file_bytes - e->offset < e->bytes)
		return mp_err(-EINVAL, "%s: layer %u expert %u: extent [%llu, +%llu) is outside "
			      "the file (%llu bytes)", s->path, layer, expert,
			      (unsigned long long)e->offset, (unsigned long long)e->bytes,
			      (unsigned long long)s->file_bytes);
	*x = (struct mp_expert_info){
		.layer = layer, .expert = expert, .offset = e->offset,
		.bytes = e->bytes, .checksum = e->checksum,
	};
	return 0;
}

static int read_table(struct mp_store *s, void *buf, size_t len, uint64_t off, const char *what)
{
	ssize_t n = mpk_pread_full(s->fd, buf, len, off);

	if (n < 0)
		return mp_err((int)n, "%s: reading the %s at offset %llu: %s", s->path, what,
			      (unsigned long long)off, strerror((int)-n));
	if ((size_t)n != len)
		return mp_err(-ENODATA, "%s: truncated: the %s [%llu, +%zu) ends past the end "
			      "of the file", s->path, what, (unsigned long long)off, len);
	return 0;
}

static int load_tables(struct mp_store *s, const struct mpk_header *h, const struct mpk_layout *l)
{
	size_t tlen = (size_t)h->n_tensors * MPK_TENSOR_ENTRY_BYTES;
	size_t elen = (size_t)h->n_experts * MPK_EXPERT_ENTRY_BYTES;
	struct mpk_tensor_entry *tt = NULL;
	struct mpk_expert_entry *et = NULL;
	XXH3_state_t *st = NULL;
	uint64_t sum;
	int err;

	s->n_tensors = h->n_tensors;
	s->n_experts = h->n_experts;
	s->expert_bytes = h->expert_bytes;
	s->total_expert_bytes = (uint64_t)h->n_experts * h->expert_bytes;
	tt = malloc(tlen ? tlen : 1);
	et = malloc(elen ? elen : 1);
	s->tensors = calloc(s->n_tensors ? s->n_tensors : 1, sizeof(*s->tensors));
	s->experts = calloc(s->n_experts ? s->n_experts : 1, sizeof(*s->experts));
	st = XXH3_createState();
	if (!tt || !et || !s->tensors || !s->experts || !st) {
		err = mp_err(-ENOMEM, "%s: out of memory for %u tensor and %u expert entries",
			     s->path, h->n_tensors, h->n_experts);
		goto free_bufs;
	}
	err = read_table(s, tt, tlen, h->tensor_table_off, "tensor table");
	if (err)
		goto free_bufs;
	err = read_table(s, et, elen, h->expert_table_off, "expert table");
	if (err)
		goto free_bufs;

	XXH3_64bits_reset(st);
	XXH3_64bits_update(st, tt, tlen);
	XXH3_64bits_update(st, et, elen);
	sum = XXH3_64bits_digest(st);
	if (sum != h->tables_checksum) {
		err = mp_err(-EBADMSG, "%s: table checksum mismatch (stored %016llx, computed "
			     "%016llx): tensor table at %llu or expert table at %llu is corrupt",
			     s->path, (unsigned long long)h->tables_checksum,
			     (unsigned long long)sum, (unsigned long long)h->tensor_table_off,
			     (unsigned long long)h->expert_table_off);
		goto free_bufs;
	}
	for (uint32_t i = 0; i < s->n_tensors; i++) {
		err = parse_tensor(s, &tt[i], i, h->tensor_table_off +
				   (uint64_t)i * MPK_TENSOR_ENTRY_BYTES, &l->tensors[i]);
		if (err)
			goto free_bufs;
	}
	for (uint32_t i = 0; i < s->n_experts; i++) {
		err = parse_expert(s, &et[i], i, h->expert_table_off +
				   (uint64_t)i * MPK_EXPERT_ENTRY_BYTES);
		if (err)
			goto free_bufs;
	}
	err = check_overlaps(s, h);
free_bufs:
	XXH3_freeState(st);
	free(et);
	free(tt);
	return err;
}

/* Parses and validates everything but the data extents of an open fd. */
static int store_load(struct mp_store *s)
{
	struct mpk_header h;
	struct mpk_layout l;
	struct stat st;
	ssize_t n;
	int err;

	if (fstat(s->fd, &st))
		return mp_err(-errno, "%s: fstat: %s", s->path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		return mp_err(-EINVAL, "%s: not a regular file", s->path);
	n = mpk_pread_full(s->fd, &h, sizeof(h), 0);
	if (n < 0)
		return mp_err((int)n, "%s: reading the header: %s", s->path, strerror((int)-n));
	if (n < MPK_MAGIC_LEN || memcmp(h.magic, MPK_MAGIC, MPK_MAGIC_LEN)) {
		if (n < MPK_MAGIC_LEN)
			return mp_err(-ENODATA,
				      "%s: truncated: file is %zd bytes, the header needs %u",
				      s->path, n, MPK_HEADER_BYTES);
		return mp_err(-EPROTO, "%s: bad magic at offset 0 (not an .mpk file)", s->path);
	}
	if ((size_t)n < sizeof(h))
		return mp_err(-ENODATA, "%s: truncated: file is %zd bytes, the header needs %u",
			      s->path, n, MPK_HEADER_BYTES);
	err = check_header(s, &h, (uint64_t)st.st_size);
	if (err)
		return err;
	err = check_geometry(s, &h);
	if (err)
		return err;
	err = mpk_layout_build(&s->geom, &l);
	if (err)
		return mp_err(err, "%s: geometry has no valid layout", s->path);
	err = check_table_fields(s, &h, &l);
	if (!err)
		err = load_tables(s, &h, &l);
	mpk_layout_free(&l);
	return err;
}

int mp_store_open(const char *path, struct mp_store **out)
{
	struct mp_store *s;
	int err;

	if (!path || !out)
		return mp_err(-EINVAL, "mp_store_open: NULL argument");
	*out = NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return mp_err(-ENOMEM, "%s: out of memory", path);
	s->fd = -1;
	s->path = strdup(path);
	if (!s->path) {
		err = mp_err(-ENOMEM, "%s: out of memory", path);
		goto free_store;
	}
	s->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (s->fd < 0) {
		err = mp_err(-errno, "%s: cannot open: %s", path, strerror(errno));
		goto free_store;
	}
	err = store_load(s);
	if (err)
		goto free_store;
	*out = s;
	return 0;
free_store:
	mp_store_close(s);
	return err;
}

void mp_store_close(struct mp_store *s)
{
	if (!s)
		return;
	if (s->fd >= 0)
		close(s->fd);
	free(s->tensors);
	free(s->experts);
	free(s->path);
	free(s);
}

const struct mp_geometry *mp_store_geometry(const struct mp_store *s)
{
	return &s->geom;
}

const char *mp_store_path(const struct mp_store *s)
{
	return s->path;
}

const char *mp_store_name(const struct mp_store *s)
{
	return s->name;
}

int mp_store_fd(const struct mp_store *s)
{
	return s->fd;
}

uint64_t mp_store_file_bytes(const struct mp_store *s)
{
	return s->file_bytes;
}

uint64_t mp_store_identity(const struct mp_store *s)
{
	return s->identity;
}

uint64_t mp_store_expert_bytes(const struct mp_store *s)
{
	return s->expert_bytes;
}

uint64_t mp_store_total_expert_bytes(const struct mp_store *s)
{
	return s->total_expert_bytes;
}

const struct mp_expert_info *mp_store_expert(const struct mp_store *s, uint32_t layer,
					     uint32_t expert)
{
	if (layer >= s->geom.layers || expert >= s->geom.experts)
		return NULL;
	return &s->experts[mpk_expert_index(&s->geom, layer, expert)];
}

uint32_t mp_store_tensor_count(const struct mp_store *s)
{
	return s->n_tensors;
}

const struct mp_tensor_info *mp_store_tensor_at(const struct mp_store *s, uint32_t i)
{
	return i < s->n_tensors ? &s->tensors[i] : NULL;
}

const struct mp_tensor_info *mp_store_tensor(const struct mp_store *s, const char *name)
{
	for (uint32_t i = 0; name && i < s->n_tensors; i++)
		if (!strcmp(s->tensors[i].name, name))
			return &s->tensors[i];
	return NULL;
}

/* Reads [off, off+len) into buf; what names the extent in messages. */
static int read_extent(struct mp_store *s, void *buf, uint64_t len, uint64_t off, const char *what)
{
	ssize_t n = mpk_pread_full(s->fd, buf, len, off);

	if (n < 0)
		return mp_err((int)n, "%s: %s: read at offset %llu failed: %s", s->path, what,
			      (unsigned long long)off, strerror((int)-n));
	if ((uint64_t)n != len)
		return mp_err(-ENODATA, "%s: %s: short read at offset %llu (%zd of %llu bytes): "
			      "the file shrank", s->path, what, (unsigned long long)off, n,
			      (unsigned long long)len);
	return 0;
}

int mp_store_read_tensor(struct mp_store *s, const struct mp_tensor_info *t, void *buf)
{
	char what[MP_TENSOR_NAME_MAX + 8];
	uint64_t sum;
	int err;

	if (!s || !t || !buf || t < s->tensors || t >= s->tensors + s->n_tensors)
		return mp_err(-EINVAL, "mp_store_read_tensor: not a tensor of this store");
	snprintf(what, sizeof(what), "tensor %s", t->name);
	err = read_extent(s, buf, t->bytes, t->offset, what);
	if (err)
		return err;
	sum = mp_checksum(buf, t->bytes);
	if (sum != t->checksum)
		return mp_err(-EBADMSG, "%s: tensor %s: checksum mismatch at offset %llu "
			      "(stored %016llx, computed %016llx)", s->path, t->name,
			      (unsigned long long)t->offset, (unsigned long long)t->checksum,
			      (unsigned long long)sum);
	return 0;
}

int mp_store_read_expert(struct mp_store *s, uint32_t layer, uint32_t expert, void *buf)
{
	const struct mp_expert_info *x;
	char what[48];
	uint64_t sum;
	int err;

	if (!s || !buf)
		return mp_err(-EINVAL, "mp_store_read_expert: NULL argument");
	x = mp_store_expert(s, layer, expert);
	if (!x)
		return mp_err(-ERANGE, "%s: layer %u expert %u does not exist (%u x %u)", s->path,
			      layer, expert, s->geom.layers, s->geom.experts);
	snprintf(what, sizeof(what), "layer %u expert %u", layer, expert);
	err = read_extent(s, buf, x->bytes, x->offset, what);
	if (err)
		return err;
	sum = mp_checksum(buf, x->bytes);
	if (sum != x->checksum)
		return mp_err(-EBADMSG, "%s: layer %u expert %u: checksum mismatch at offset %llu "
			      "(stored %016llx, computed %016llx)", s->path, layer, expert,
			      (unsigned long long)x->offset, (unsigned long long)x->checksum,
			      (unsigned long long)sum);
	return 0;
}

/*
 * verify reads the whole model once: through O_DIRECT (where the file system
 * allows it) it neither crawls through readahead-sized reads nor evicts the
 * page cache. The fd is reopened through /proc so it is the store's inode even
 * if a new file was renamed over the path since.
 */
struct verify_io {
	int direct_fd;		/* -1: read through the store's fd */
	void *chunk;		/* VERIFY_CHUNK bytes, DIRECT_ALIGN-aligned */
};

/* Reads [off, off+len) of an extent into io->chunk; off is DIRECT_ALIGN-aligned when direct. */
static int verify_read(struct mp_store *s, struct verify_io *io, uint64_t off, size_t len,
		       const char *what)
{
	if (io->direct_fd >= 0 && off % DIRECT_ALIGN == 0) {
		/* rounding up may read past the extent (still inside the chunk) or hit EOF */
		size_t whole = MP_ALIGN_UP(len, DIRECT_ALIGN);
		ssize_t n = mpk_pread_full(io->direct_fd, io->chunk, whole, off);

		if (n >= 0 && (size_t)n >= len)
			return 0;
		if (n != -EINVAL)
			/* read again buffered: it names the error */
			return read_extent(s, io->chunk, len, off, what);
		mp_debug("%s: O_DIRECT read refused, verifying through the page cache", s->path);
		close(io->direct_fd);
		io->direct_fd = -1;
	}
	return read_extent(s, io->chunk, len, off, what);
}

/* Streams an extent through XXH3 in chunks; 0, -EBADMSG or the read error. */
static int check_extent(struct mp_store *s, struct mp_hash *st, struct verify_io *io,
			uint64_t off, uint64_t len, uint64_t want, const char *what, int level)
{
	uint64_t done = 0, sum;
	int err;

	mp_hash_reset(st);
	while (done < len) {
		size_t n = (size_t)MP_MIN(len - done, (uint64_t)VERIFY_CHUNK);

		err = verify_read(s, io, off + done, n, what);
		if (err)
			return err;
		mp_hash_update(st, io->chunk, n);
		done += n;
	}
	sum = mp_hash_digest(st);
	if (sum == want)
		return 0;
	mp_log(level,
	       "%s: %s: checksum mismatch in [%llu, %llu) (stored %016llx, computed %016llx)",
	       s->path, what, (unsigned long long)off, (unsigned long long)(off + len),
	       (unsigned long long)want, (unsigned long long)sum);
	return -EBADMSG;
}

int mp_store_verify(struct mp_store *s, struct mp_verify_result *bad, uint32_t max_bad,
		    void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg)
{
	struct verify_io io = { .direct_fd = -1 };
	uint32_t n_bad = 0, n_bad_tensors = 0;
	char what[MP_TENSOR_NAME_MAX + 48];
	struct mp_hash *st;
	int err;

	if (!s)
		return mp_err(-EINVAL, "mp_store_verify: NULL store");
	st = mp_hash_new();
	if (posix_memalign(&io.chunk, DIRECT_ALIGN, VERIFY_CHUNK))
		io.chunk = NULL;
	if (!st || !io.chunk) {
		err = mp_err(-ENOMEM, "%s: out of memory for verify", s->path);
		goto free_bufs;
	}
	snprintf(what, sizeof(what), "/proc/self/fd/%d", s->fd);
	io.direct_fd = open(what, O_RDONLY | O_DIRECT | O_CLOEXEC);
	posix_fadvise(s->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	for (uint32_t i = 0; i < s->n_tensors; i++) {
		const struct mp_tensor_info *t = &s->tensors[i];

		snprintf(what, sizeof(what), "tensor %s", t->name);
		if (check_extent(s, st, &io, t->offset, t->bytes, t->checksum, what,
				 MP_LOG_ERROR))
			n_bad_tensors++;
	}
	for (uint32_t i = 0; i < s->n_experts; i++) {
		const struct mp_expert_info *x = &s->experts[i];

		/* Experts are reported through bad[]; their log line is detail only. */
		snprintf(what, sizeof(what), "layer %u expert %u", x->layer, x->expert);
		err = check_extent(s, st, &io, x->offset, x->bytes, x->checksum, what,
				   MP_LOG_INFO);
		if (err) {
			if (bad && n_bad < max_bad)
				bad[n_bad] = (struct mp_verify_result){ x->layer, x->expert, err };
			n_bad++;
		}
		if (progress)
			progress(i + 1, s->n_experts, arg);
	}
	err = (int)MP_MIN((uint64_t)n_bad + n_bad_tensors, (uint64_t)INT32_MAX);
free_bufs:
	if (io.direct_fd >= 0)
		close(io.direct_fd);
	free(io.chunk);
	mp_hash_free(st);
	return err;
}

// SPDX-License-Identifier: MIT
/* The .mpa adapter file: reader, writer, and packing a fine-tune's changed experts. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <moepager/adapter.h>

#include "base/base.h"
#include "store/fileio.h"
#include "store/format.h"

struct mp_adapter {
	char *path;
	int fd;
	char name[MPK_NAME_MAX];
	char base_name[MPK_NAME_MAX];
	uint64_t base_identity;
	uint64_t file_bytes;
	uint64_t expert_bytes;
	uint32_t layers;
	uint32_t experts;
	uint32_t n;
	uint32_t max_per_layer;
	struct mp_adapter_expert *entries;	/* sorted by (layer, expert) */
	uint32_t *layer_start;			/* [layers + 1]: entries of layer l */
};

static int check_header(const struct mp_adapter *a, const struct mpa_header *h, uint64_t size)
{
	const char *p = a->path;
	uint64_t sum;

	if (memcmp(h->magic, MPA_MAGIC, MPK_MAGIC_LEN))
		return mp_err(-EPROTO, "%s: not a moepager adapter (bad magic at offset 0)", p);
	if (h->version != MP_MPA_VERSION)
		return mp_err(-EPROTONOSUPPORT, "%s: unknown adapter version %u at offset 8 "
			      "(this reader knows %u)", p, h->version, MP_MPA_VERSION);
	sum = XXH3_64bits(h, offsetof(struct mpa_header, header_checksum));
	if (sum != h->header_checksum)
		return mp_err(-EBADMSG, "%s: header checksum mismatch (stored %016llx, computed "
			      "%016llx): bytes [0, %u) are corrupt", p,
			      (unsigned long long)h->header_checksum, (unsigned long long)sum,
			      MPA_HEADER_BYTES);
	if (h->header_bytes != MPA_HEADER_BYTES || h->entry_bytes != MPA_ENTRY_BYTES)
		return mp_err(-EINVAL, "%s: header_bytes %u / entry_bytes %u, expected %u / %u", p,
			      h->header_bytes, h->entry_bytes, MPA_HEADER_BYTES, MPA_ENTRY_BYTES);
	if (h->flags & ~MPA_FLAGS_KNOWN)
		return mp_err(-EPROTONOSUPPORT, "%s: unknown header flags 0x%x at offset %zu", p,
			      h->flags, offsetof(struct mpa_header, flags));
	if (h->file_bytes < MPA_HEADER_BYTES || h->file_bytes % MPA_ALIGN)
		return mp_err(-EINVAL, "%s: file_bytes %llu at offset 16 is impossible", p,
			      (unsigned long long)h->file_bytes);
	if (size < h->file_bytes)
		return mp_err(-ENODATA, "%s: truncated: file is %llu bytes, header says %llu", p,
			      (unsigned long long)size, (unsigned long long)h->file_bytes);
	if (!memchr(h->name, 0, sizeof(h->name)) || !h->name[0] ||
	    !memchr(h->base_name, 0, sizeof(h->base_name)))
		return mp_err(-EINVAL, "%s: the adapter or base name (offsets %zu, %zu) is empty or "
			      "not NUL-terminated", p, offsetof(struct mpa_header, name),
			      offsetof(struct mpa_header, base_name));
	if (!h->layers || h->layers > MP_MAX_LAYERS || !h->experts ||
	    h->experts > MP_MAX_EXPERTS || h->dtype >= MP_DTYPE_COUNT || !h->expert_bytes)
		return mp_err(-EINVAL, "%s: absurd base geometry in the header: %u layers, %u "
			      "experts, type %u, %llu bytes per expert", p, h->layers, h->experts,
			      h->dtype, (unsigned long long)h->expert_bytes);
	if (!h->n_entries || h->n_entries > h->layers * h->experts)
		return mp_err(-EINVAL, "%s: %u table entries for %u x %u experts", p,
			      h->n_entries, h->layers, h->experts);
	if (h->table_off < MPA_HEADER_BYTES || h->table_off % MPA_ALIGN ||
	    h->table_off > h->file_bytes ||
	    h->file_bytes - h->table_off < (uint64_t)h->n_entries * MPA_ENTRY_BYTES)
		return mp_err(-EINVAL, "%s: table at offset %llu (%u entries) is outside the file "
			      "(%llu bytes) or unaligned", p, (unsigned long long)h->table_off,
			      h->n_entries, (unsigned long long)h->file_bytes);
	return 0;
}

/* Entry i (at file offset off) of a table sorted by (layer, expert); prev is entry i - 1. */
static int parse_entry(struct mp_adapter *a, const struct mpa_entry *e, const struct mpa_entry *prev,
		       uint64_t table_off, uint64_t off)
{
	const char *p = a->path;
	uint64_t table_end = table_off + (uint64_t)a->n * MPA_ENTRY_BYTES;

	if (e->layer >= a->layers || e->expert >= a->experts)
		return mp_err(-EINVAL, "%s: entry at offset %llu names layer %u expert %u, the base "
			      "has %u x %u", p, (unsigned long long)off, e->layer, e->expert,
			      a->layers, a->experts);
	if (prev && (e->layer < prev->layer ||
		     (e->layer == prev->layer && e->expert <= prev->expert)))
		return mp_err(-EINVAL, "%s: entry at offset %llu (layer %u expert %u) is not after "
			      "the one before it (layer %u expert %u)", p, (unsigned long long)off,
			      e->layer, e->expert, prev->layer, prev->expert);
	if (e->bytes != a->expert_bytes || e->flags)
		return mp_err(-EINVAL, "%s: layer %u expert %u: %llu bytes (expected %llu), flags "
			      "0x%x", p, e->layer, e->expert, (unsigned long long)e->bytes,
			      (unsigned long long)a->expert_bytes, e->flags);
	if (e->offset % MPA_ALIGN || e->offset < MPA_HEADER_BYTES ||
	    e->offset > a->file_bytes || a->file_bytes - e->offset < e->bytes ||
	    (e->offset < table_end && e->offset + e->bytes > table_off))
		return mp_err(-EINVAL, "%s: layer %u expert %u: extent [%llu, +%llu) is unaligned, "
			      "outside the file or over the header or table", p, e->layer,
			      e->expert, (unsigned long long)e->offset,
			      (unsigned long long)e->bytes);
	return 0;
}

static int cmp_offset(const void *x, const void *y)
{
	const struct mp_adapter_expert *a = x, *b = y;

	return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Every extent was checked inside the file; this finds two experts sharing bytes. */
static int check_overlaps(const struct mp_adapter *a)
{
	struct mp_adapter_expert *v = malloc(a->n * sizeof(*v));
	int err = 0;

	if (!v)
		return mp_err(-ENOMEM, "%s: out of memory", a->path);
	memcpy(v, a->entries, a->n * sizeof(*v));
	qsort(v, a->n, sizeof(*v), cmp_offset);
	for (uint32_t i = 1; i < a->n && !err; i++)
		if (v[i].offset < v[i - 1].offset + v[i - 1].bytes)
			err = mp_err(-EINVAL, "%s: layer %u expert %u at offset %llu overlaps layer "
				     "%u expert %u", a->path, v[i].layer, v[i].expert,
				     (unsigned long long)v[i].offset, v[i - 1].layer,
				     v[i - 1].expert);
	free(v);
	return err;
}

static int load_table(struct mp_adapter *a, const struct mpa_header *h)
{
	size_t len = (size_t)h->n_entries * MPA_ENTRY_BYTES;
	struct mpa_entry *t = malloc(len);
	ssize_t got;
	int err = 0;

	a->entries = calloc(a->n, sizeof(*a->entries));
	a->layer_start = calloc(a->layers + 1, sizeof(*a->layer_start));
	if (!t || !a->entries || !a->layer_start) {
		err = mp_err(-ENOMEM, "%s: out of memory for %u entries", a->path, a->n);
		goto free_table;
	}
	got = mpk_pread_full(a->fd, t, len, h->table_off);
	if (got != (ssize_t)len) {
		err = mp_err(got < 0 ? (int)got : -ENODATA, "%s: reading the table at offset %llu "
			     "failed", a->path, (unsigned long long)h->table_off);
		goto free_table;
	}
	if (XXH3_64bits(t, len) != h->table_checksum) {
		err = mp_err(-EBADMSG, "%s: table checksum mismatch: bytes [%llu, +%zu) are corrupt",
			     a->path, (unsigned long long)h->table_off, len);
		goto free_table;
	}
	for (uint32_t i = 0; i < a->n; i++) {
		err = parse_entry(a, &t[i], i ? &t[i - 1] : NULL, h->table_off,
				  h->table_off + (uint64_t)i * MPA_ENTRY_BYTES);
		if (err)
			goto free_table;
		a->entries[i] = (struct mp_adapter_expert){ t[i].layer, t[i].expert, t[i].offset,
							    t[i].bytes, t[i].checksum };
		a->layer_start[t[i].layer + 1]++;
	}
	for (uint32_t l = 0; l < a->layers; l++) {
		a->max_per_layer = MP_MAX(a->max_per_layer, a->layer_start[l + 1]);
		a->layer_start[l + 1] += a->layer_start[l];
	}
	err = check_overlaps(a);
free_table:
	free(t);
	return err;
}

static int adapter_load(struct mp_adapter *a)
{
	struct mpa_header *h = malloc(sizeof(*h));
	struct stat st;
	ssize_t got;
	int err;

	if (!h)
		return mp_err(-ENOMEM, "%s: out of memory", a->path);
	if (fstat(a->fd, &st)) {
		err = mp_err(-errno, "%s: stat: %s", a->path, strerror(errno));
		goto free_header;
	}
	got = mpk_pread_full(a->fd, h, sizeof(*h), 0);
	if (got < 0) {
		err = mp_err((int)got, "%s: reading the header: %s", a->path, strerror((int)-got));
		goto free_header;
	}
	if (got < (ssize_t)sizeof(*h)) {
		err = got >= MPK_MAGIC_LEN && !memcmp(h->magic, MPA_MAGIC, MPK_MAGIC_LEN) ?
		      mp_err(-ENODATA, "%s: truncated: %zd bytes, the header alone is %u",
			     a->path, got, MPA_HEADER_BYTES) :
		      mp_err(-EPROTO, "%s: not a moepager adapter (%zd bytes)", a->path, got);
		goto free_header;
	}
	err = check_header(a, h, (uint64_t)st.st_size);
	if (err)
		goto free_header;
	memcpy(a->name, h->name, sizeof(a->name));
	memcpy(a->base_name, h->base_name, sizeof(a->base_name));
	a->base_identity = h->base_identity;
	a->file_bytes = h->file_bytes;
	a->expert_bytes = h->expert_bytes;
	a->layers = h->layers;
	a->experts = h->experts;
	a->n = h->n_entries;
	err = load_table(a, h);
free_header:
	free(h);
	return err;
}

int mp_adapter_open(const char *path, struct mp_adapter **out)
{
	struct mp_adapter *a;
	int err;

	if (!path || !out)
		return mp_err(-EINVAL, "mp_adapter_open: NULL argument");
	*out = NULL;
	a = calloc(1, sizeof(*a));
	if (!a || !(a->path = strdup(path))) {
		free(a);
		return mp_err(-ENOMEM, "%s: out of memory", path);
	}
	a->fd = open(path, O_RDONLY | O_CLOEXEC);
	if (a->fd < 0) {
		err = mp_err(-errno, "%s: %s", path, strerror(errno));
		goto close_adapter;
	}
	err = adapter_load(a);
	if (err)
		goto close_adapter;
	*out = a;
	return 0;
close_adapter:
	mp_adapter_close(a);
	return err;
}

void mp_adapter_close(struct mp_adapter *a)
{
	if (!a)
		return;
	if (a->fd >= 0)
		close(a->fd);
	free(a->entries);
	free(a->layer_start);
	free(a->path);
	free(a);
}

const char *mp_adapter_path(const struct mp_adapter *a)
{
	return a->path;
}

const char *mp_adapter_name(const struct mp_adapter *a)
{
	return a->name;
}

const char *mp_adapter_base_name(const struct mp_adapter *a)
{
	return a->base_name;
}

uint64_t mp_adapter_base_identity(const struct mp_adapter *a)
{
	return a->base_identity;
}

int mp_adapter_fd(const struct mp_adapter *a)
{
	return a->fd;
}

int mp_adapter_check_base(const struct mp_adapter *a, const struct mp_store *base)
{
	const struct mp_geometry *g = mp_store_geometry(base);

	if (mp_store_identity(base) == a->base_identity && g->layers == a->layers &&
	    g->experts == a->experts && mp_store_expert_bytes(base) == a->expert_bytes)
		return 0;
	return mp_err(-EMEDIUMTYPE, "%s: adapter '%s' was made for model '%s' (identity %016llx), "
		      "not for %s ('%s', identity %016llx)", a->path, a->name, a->base_name,
		      (unsigned long long)a->base_identity, mp_store_path(base),
		      mp_store_name(base), (unsigned long long)mp_store_identity(base));
}

uint32_t mp_adapter_layers(const struct mp_adapter *a)
{
	return a->layers;
}

uint32_t mp_adapter_count(const struct mp_adapter *a)
{
	return a->n;
}

uint32_t mp_adapter_max_per_layer(const struct mp_adapter *a)
{
	return a->max_per_layer;
}

const struct mp_adapter_expert *mp_adapter_layer(const struct mp_adapter *a, uint32_t layer,
						 uint32_t *n)
{
	if (layer >= a->layers) {
		*n = 0;
		return NULL;
	}
	*n = a->layer_start[layer + 1] - a->layer_start[layer];
	return a->entries + a->layer_start[layer];
}

const struct mp_adapter_expert *mp_adapter_find(const struct mp_adapter *a, uint32_t layer,
						uint32_t expert)
{
	uint32_t n;
	const struct mp_adapter_expert *e = mp_adapter_layer(a, layer, &n);

	for (uint32_t i = 0; i < n; i++)
		if (e[i].expert == expert)
			return &e[i];
	return NULL;
}

static int read_entry(struct mp_adapter *a, const struct mp_adapter_expert *e, void *buf)
{
	ssize_t got = mpk_pread_full(a->fd, buf, e->bytes, e->offset);

	if (got < 0)
		return mp_err((int)got, "%s: reading layer %u expert %u at offset %llu: %s",
			      a->path, e->layer, e->expert, (unsigned long long)e->offset,
			      strerror((int)-got));
	if ((uint64_t)got != e->bytes)
		return mp_err(-ENODATA, "%s: short read of layer %u expert %u at offset %llu",
			      a->path, e->layer, e->expert, (unsigned long long)e->offset);
	if (XXH3_64bits(buf, e->bytes) != e->checksum)
		return mp_err(-EBADMSG, "%s: layer %u expert %u: checksum mismatch in [%llu, +%llu)",
			      a->path, e->layer, e->expert, (unsigned long long)e->offset,
			      (unsigned long long)e->bytes);
	return 0;
}

int mp_adapter_read_expert(struct mp_adapter *a, uint32_t layer, uint32_t expert, void *buf)
{
	const struct mp_adapter_expert *e = mp_adapter_find(a, layer, expert);

	if (!e)
		return mp_err(-ENOENT, "%s: adapter '%s' does not replace layer %u expert %u",
			      a->path, a->name, layer, expert);
	return read_entry(a, e, buf);
}

int mp_adapter_verify(struct mp_adapter *a)
{
	void *buf = malloc(a->expert_bytes);
	int bad = 0;

	if (!buf)
		return mp_err(-ENOMEM, "%s: out of memory", a->path);
	for (uint32_t i = 0; i < a->n; i++) {
		int err = read_entry(a, &a->entries[i], buf);

		if (err == -EBADMSG || err == -ENODATA) {
			bad++;
		} else if (err) {
			bad = err;
			break;
		}
	}
	free(buf);
	return bad;
}

/*
 * Writer
 */

struct mp_adapter_writer {
	struct mpk_tmpfile out;
	struct mpa_header h;		/* geometry, identity and names; the rest at finish */
	uint64_t next_off;
	uint32_t n;
	struct mpa_entry *entries;	/* in put order, [layers * experts] */
	uint8_t *done;
};

/* Frees the writer; its temporary file was committed or aborted. */
static void writer_free(struct mp_adapter_writer *w)
{
	free(w->entries);
	free(w->done);
	free(w);
}

int mp_adapter_writer_create(const char *path, const struct mp_store *base, const char *name,
			     struct mp_adapter_writer **out)
{
	const struct mp_geometry *g;
	struct mp_adapter_writer *w;
	size_t cells;
	int err;

	if (!path || !base || !name || !out)
		return mp_err(-EINVAL, "mp_adapter_writer_create: NULL argument");
	*out = NULL;
	if (!name[0] || strlen(name) >= MP_ADAPTER_NAME_MAX)
		return mp_err(-EINVAL, "%s: adapter name '%s' is empty or longer than %u bytes",
			      path, name, MP_ADAPTER_NAME_MAX - 1);
	g = mp_store_geometry(base);
	cells = (size_t)g->layers * g->experts;
	w = calloc(1, sizeof(*w));
	if (!w)
		return mp_err(-ENOMEM, "%s: out of memory", path);
	w->entries = calloc(cells, sizeof(*w->entries));
	w->done = calloc(cells, 1);
	if (!w->entries || !w->done) {
		err = mp_err(-ENOMEM, "%s: out of memory", path);
		goto free_writer;
	}
	err = mpk_tmpfile_create(&w->out, path);
	if (err)
		goto free_writer;
	w->h.layers = g->layers;
	w->h.experts = g->experts;
	w->h.hidden = g->hidden;
	w->h.ffn = g->ffn;
	w->h.dtype = (uint32_t)g->dtype;
	w->h.expert_bytes = mp_store_expert_bytes(base);
	w->h.base_identity = mp_store_identity(base);
	memcpy(w->h.name, name, strlen(name));
	snprintf(w->h.base_name, sizeof(w->h.base_name), "%s", mp_store_name(base));
	w->next_off = MPA_HEADER_BYTES;
	*out = w;
	return 0;
free_writer:
	writer_free(w);
	return err;
}

int mp_adapter_writer_put(struct mp_adapter_writer *w, uint32_t layer, uint32_t expert,
			  const void *data)
{
	const char *p = w->out.path;
	size_t cell;
	int err;

	if (layer >= w->h.layers || expert >= w->h.experts)
		return mp_err(-ERANGE, "%s: layer %u expert %u is outside the base's %u x %u", p,
			      layer, expert, w->h.layers, w->h.experts);
	cell = (size_t)layer * w->h.experts + expert;
	if (w->done[cell])
		return mp_err(-EEXIST, "%s: layer %u expert %u was already put", p, layer, expert);
	err = mpk_pwrite_full(w->out.fd, data, w->h.expert_bytes, w->next_off);
	if (err)
		return mp_err(err, "%s: writing layer %u expert %u: %s", w->out.tmp_path, layer,
			      expert, strerror(-err));
	w->entries[w->n++] = (struct mpa_entry){
		.layer = layer, .expert = expert, .offset = w->next_off,
		.bytes = w->h.expert_bytes, .checksum = XXH3_64bits(data, w->h.expert_bytes),
	};
	w->done[cell] = 1;
	w->next_off += MP_ALIGN_UP(w->h.expert_bytes, MPA_ALIGN);
	return 0;
}

static int cmp_entry(const void *x, const void *y)
{
	const struct mpa_entry *a = x, *b = y;

	if (a->layer != b->layer)
		return a->layer < b->layer ? -1 : 1;
	return a->expert < b->expert ? -1 : a->expert > b->expert;
}

int mp_adapter_writer_finish(struct mp_adapter_writer *w)
{
	struct mpa_header *h;
	size_t len;
	int err;

	if (!w)
		return mp_err(-EINVAL, "mp_adapter_writer_finish: NULL writer");
	h = &w->h;
	if (!w->n) {
		err = mp_err(-ENODATA, "%s: the adapter replaces no expert", w->out.path);
		goto abort_write;
	}
	qsort(w->entries, w->n, sizeof(*w->entries), cmp_entry);
	len = (size_t)w->n * MPA_ENTRY_BYTES;
	memcpy(h->magic, MPA_MAGIC, MPK_MAGIC_LEN);
	h->version = MP_MPA_VERSION;
	h->header_bytes = MPA_HEADER_BYTES;
	h->entry_bytes = MPA_ENTRY_BYTES;
	h->table_off = w->next_off;
	h->n_entries = w->n;
	h->table_checksum = XXH3_64bits(w->entries, len);
	h->file_bytes = MP_ALIGN_UP(h->table_off + len, MPA_ALIGN);
	h->header_checksum = XXH3_64bits(h, offsetof(struct mpa_header, header_checksum));
	err = mpk_pwrite_full(w->out.fd, w->entries, len, h->table_off);
	if (!err && ftruncate(w->out.fd, (off_t)h->file_bytes))
		err = -errno;
	/* The header goes last so a crash before here leaves no valid-looking file. */
	if (!err)
		err = mpk_pwrite_full(w->out.fd, h, sizeof(*h), 0);
	if (err) {
		err = mp_err(err, "%s: writing the table and header: %s", w->out.tmp_path,
			     strerror(-err));
		goto abort_write;
	}
	err = mpk_tmpfile_commit(&w->out);
	writer_free(w);
	return err;
abort_write:
	mp_adapter_writer_abort(w);
	return err;
}

void mp_adapter_writer_abort(struct mp_adapter_writer *w)
{
	if (!w)
		return;
	mpk_tmpfile_abort(&w->out);
	writer_free(w);
}

/* The fine-tune changes nothing but experts: same geometry, same non-expert tensors. */
static int check_expert_only(struct mp_store *base, struct mp_store *tuned)
{
	const struct mp_geometry *gb = mp_store_geometry(base), *gt = mp_store_geometry(tuned);

	if (memcmp(gb, gt, sizeof(*gb)))
		return mp_err(-EINVAL, "%s and %s have different geometries: not a fine-tune of "
			      "the base", mp_store_path(base), mp_store_path(tuned));
	for (uint32_t i = 0; i < mp_store_tensor_count(base); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(base, i);
		const struct mp_tensor_info *u = mp_store_tensor(tuned, t->name);

		if (!u || u->checksum != t->checksum)
			return mp_err(-EINVAL, "%s: tensor %s differs from the base's: the fine-tune "
				      "changed more than experts, it is not an expert adapter",
				      mp_store_path(tuned), t->name);
	}
	return 0;
}

int mp_adapter_pack(struct mp_store *base, struct mp_store *tuned, const char *name,
		    const char *path)
{
	const struct mp_geometry *g = mp_store_geometry(base);
	struct mp_adapter_writer *w = NULL;
	void *buf = NULL;
	int err, n = 0;

	err = check_expert_only(base, tuned);
	if (err)
		return err;
	buf = malloc(mp_store_expert_bytes(base));
	if (!buf)
		return mp_err(-ENOMEM, "%s: out of memory", path);
	err = mp_adapter_writer_create(path, base, name, &w);
	for (uint32_t l = 0; l < g->layers && !err; l++)
		for (uint32_t e = 0; e < g->experts && !err; e++) {
			if (mp_store_expert(base, l, e)->checksum ==
			    mp_store_expert(tuned, l, e)->checksum)
				continue;
			err = mp_store_read_expert(tuned, l, e, buf);
			if (!err)
				err = mp_adapter_writer_put(w, l, e, buf);
			n++;
		}
	if (!err && !n)
		err = mp_err(-ENODATA, "%s: no expert differs from the base %s: nothing to pack",
			     mp_store_path(tuned), mp_store_path(base));
	if (err)
		mp_adapter_writer_abort(w);
	else
		err = mp_adapter_writer_finish(w);
	free(buf);
	return err ? err : n;
}

static int merge_tensors(struct mp_store *base, struct mp_store_writer *w, void **buf,
			 uint64_t *cap)
{
	for (uint32_t i = 0; i < mp_store_tensor_count(base); i++) {
		const struct mp_tensor_info *t = mp_store_tensor_at(base, i);
		int err;

		if (t->bytes > *cap) {
			void *p = realloc(*buf, t->bytes);

			if (!p)
				return mp_err(-ENOMEM, "out of memory for tensor %s", t->name);
			*buf = p;
			*cap = t->bytes;
		}
		err = mp_store_read_tensor(base, t, *buf);
		if (!err)
			err = mp_store_writer_put_tensor(w, t->name, *buf);
		if (err)
			return err;
	}
	return 0;
}

int mp_adapter_merge(struct mp_store *base, struct mp_adapter *a, const char *name,
		     const char *path)
{
	const struct mp_geometry *g = mp_store_geometry(base);
	uint64_t cap = mp_store_expert_bytes(base);
	struct mp_store_writer *w;
	void *buf;
	int err;

	err = mp_adapter_check_base(a, base);
	if (err)
		return err;
	buf = malloc(cap);
	if (!buf)
		return mp_err(-ENOMEM, "%s: out of memory", path);
	err = mp_store_writer_create(path, g, name ? name : mp_store_name(base), &w);
	if (err)
		goto free_buf;
	err = merge_tensors(base, w, &buf, &cap);
	for (uint32_t l = 0; l < g->layers && !err; l++)
		for (uint32_t e = 0; e < g->experts && !err; e++) {
			err = mp_adapter_find(a, l, e) ? mp_adapter_read_expert(a, l, e, buf) :
			      mp_store_read_expert(base, l, e, buf);
			if (!err)
				err = mp_store_writer_put_expert(w, l, e, buf);
		}
	if (err)
		mp_store_writer_abort(w);
	else
		err = mp_store_writer_finish(w);
free_buf:
	free(buf);
	return err;
}

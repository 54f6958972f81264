// SPDX-License-Identifier: MIT
/* The .mpk writer: streams tensors and experts to a temporary file, then renames it into place. */
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <moepager/store.h>

#include "base/base.h"
#include "store/fileio.h"
#include "store/format.h"
#include "store/layout.h"

struct mp_store_writer {
	struct mpk_tmpfile out;
	/*
	 * The same file opened O_DIRECT for the experts, or -1 where the file
	 * system refuses it. Buffered writes of a multi-GB model run at a
	 * fraction of the disk's speed here (page-cache allocation) and evict
	 * everything else; direct writes do neither.
	 */
	int direct_fd;
	void *bounce;			/* aligned copy for unaligned callers' experts */
	uint64_t direct_len;		/* expert_bytes rounded up to MPK_FILE_ALIGN */
	struct mp_geometry geom;
	char name[MPK_NAME_MAX];
	struct mpk_layout layout;	/* tensors[].checksum filled as they are put */
	uint8_t *tensor_done;
	uint8_t *expert_done;
	uint64_t *expert_sums;
};

/* Frees the writer; its temporary file was committed or aborted. */
static void writer_free(struct mp_store_writer *w)
{
	if (w->direct_fd >= 0)
		close(w->direct_fd);
	free(w->bounce);
	mpk_layout_free(&w->layout);
	free(w->tensor_done);
	free(w->expert_done);
	free(w->expert_sums);
	free(w);
}

int mp_store_writer_create(const char *path, const struct mp_geometry *g, const char *name,
			   struct mp_store_writer **out)
{
	struct mp_store_writer *w;
	int err;

	if (!path || !g || !out)
		return mp_err(-EINVAL, "mp_store_writer_create: NULL argument");
	*out = NULL;
	if (name && strlen(name) >= MPK_NAME_MAX)
		return mp_err(-EINVAL, "%s: model name '%s' is longer than %u bytes", path, name,
			      MPK_NAME_MAX - 1);
	w = calloc(1, sizeof(*w));
	if (!w)
		return mp_err(-ENOMEM, "%s: out of memory", path);
	w->direct_fd = -1;
	err = mpk_layout_build(g, &w->layout);
	if (err)
		goto free_writer;
	w->geom = *g;
	if (name)
		memcpy(w->name, name, strlen(name));
	w->tensor_done = calloc(w->layout.n_tensors, 1);
	w->expert_done = calloc(w->layout.n_experts, 1);
	w->expert_sums = calloc(w->layout.n_experts, sizeof(*w->expert_sums));
	if (!w->tensor_done || !w->expert_done || !w->expert_sums) {
		err = mp_err(-ENOMEM, "%s: out of memory", path);
		goto free_writer;
	}
	err = mpk_tmpfile_create(&w->out, path);
	if (err)
		goto free_writer;
	/* The padding between experts stays a hole: the file is sparse. */
	if (ftruncate(w->out.fd, (off_t)w->layout.file_bytes)) {
		err = mp_err(-errno, "%s: sizing %s to %llu bytes: %s", path, w->out.tmp_path,
			     (unsigned long long)w->layout.file_bytes, strerror(errno));
		goto abort_tmp;
	}
	w->direct_len = MP_ALIGN_UP(w->layout.expert_bytes, MPK_FILE_ALIGN);
	w->direct_fd = open(w->out.tmp_path, O_WRONLY | O_DIRECT | O_CLOEXEC);
	*out = w;
	return 0;
abort_tmp:
	mpk_tmpfile_abort(&w->out);
free_writer:
	writer_free(w);
	return err;
}

uint32_t mp_store_writer_tensor_count(const struct mp_store_writer *w)
{
	return w->layout.n_tensors;
}

const struct mp_tensor_info *mp_store_writer_tensor_at(const struct mp_store_writer *w,
						      uint32_t i)
{
	return i < w->layout.n_tensors ? &w->layout.tensors[i] : NULL;
}

int mp_store_writer_put_tensor(struct mp_store_writer *w, const char *name, const void *data)
{
	struct mp_tensor_info *t = NULL;
	uint32_t i;
	int err;

	if (!w || !name || !data)
		return mp_err(-EINVAL, "mp_store_writer_put_tensor: NULL argument");
	for (i = 0; i < w->layout.n_tensors; i++) {
		if (!strcmp(w->layout.tensors[i].name, name)) {
			t = &w->layout.tensors[i];
			break;
		}
	}
	if (!t)
		return mp_err(-ENOENT, "%s: the geometry has no tensor '%s'", w->out.path, name);
	if (w->tensor_done[i])
		return mp_err(-EEXIST, "%s: tensor %s was already written", w->out.path, name);
	err = mpk_pwrite_full(w->out.fd, data, t->bytes, t->offset);
	if (err)
		return mp_err(err, "%s: writing tensor %s at offset %llu: %s", w->out.tmp_path, name,
			      (unsigned long long)t->offset, strerror(-err));
	t->checksum = mp_checksum(data, t->bytes);
	w->tensor_done[i] = 1;
	return 0;
}

/* O_DIRECT needs an aligned buffer and length: the slot's padding takes the round-up. */
static int write_expert_direct(struct mp_store_writer *w, const void *data, uint64_t off)
{
	const void *src = data;

	if ((uintptr_t)data % MPK_FILE_ALIGN || w->direct_len != w->layout.expert_bytes) {
		if (!w->bounce) {
			if (posix_memalign(&w->bounce, MPK_FILE_ALIGN, w->direct_len))
				return -ENOMEM;
			memset((char *)w->bounce + w->layout.expert_bytes, 0,
			       w->direct_len - w->layout.expert_bytes);
		}
		memcpy(w->bounce, data, w->layout.expert_bytes);
		src = w->bounce;
	}
	return mpk_pwrite_full(w->direct_fd, src, w->direct_len, off);
}

static int write_expert(struct mp_store_writer *w, const void *data, uint64_t off)
{
	int err;

	if (w->direct_fd >= 0) {
		err = write_expert_direct(w, data, off);
		if (err != -EINVAL)
			return err;
		/* the file system takes O_DIRECT opens but not these writes */
		mp_debug("%s: O_DIRECT write refused, writing through the page cache",
			 w->out.tmp_path);
		close(w->direct_fd);
		w->direct_fd = -1;
	}
	err = mpk_pwrite_full(w->out.fd, data, w->layout.expert_bytes, off);
	/*
	 * Start writeback now: the disk works while the caller makes the next
	 * expert, and finish()'s fsync has little left to do. Advisory only.
	 */
	if (!err)
		(void)sync_file_range(w->out.fd, (off_t)off, (off_t)w->layout.expert_bytes,
				      SYNC_FILE_RANGE_WRITE);
	return err;
}

int mp_store_writer_put_expert(struct mp_store_writer *w, uint32_t layer, uint32_t expert,
			       const void *data)
{
	uint64_t off;
	uint32_t i;
	int err;

	if (!w || !data)
		return mp_err(-EINVAL, "mp_store_writer_put_expert: NULL argument");
	if (layer >= w->geom.layers || expert >= w->geom.experts)
		return mp_err(-ERANGE, "%s: layer %u expert %u does not exist (%u x %u)", w->out.path,
			      layer, expert, w->geom.layers, w->geom.experts);
	i = mpk_expert_index(&w->geom, layer, expert);
	if (w->expert_done[i])
		return mp_err(-EEXIST, "%s: layer %u expert %u was already written", w->out.path,
			      layer, expert);
	off = mpk_layout_expert_offset(&w->layout, i);
	err = write_expert(w, data, off);
	if (err)
		return mp_err(err, "%s: writing layer %u expert %u at offset %llu: %s",
			      w->out.tmp_path, layer, expert, (unsigned long long)off, strerror(-err));
	w->expert_sums[i] = mp_checksum(data, w->layout.expert_bytes);
	w->expert_done[i] = 1;
	return 0;
}

static int check_complete(const struct mp_store_writer *w)
{
	for (uint32_t i = 0; i < w->layout.n_tensors; i++)
		if (!w->tensor_done[i])
			return mp_err(-ENODATA, "%s: tensor %s was never written", w->out.path,
				      w->layout.tensors[i].name);
	for (uint32_t i = 0; i < w->layout.n_experts; i++)
		if (!w->expert_done[i])
			return mp_err(-ENODATA, "%s: layer %u expert %u was never written", w->out.path,
				      i / w->geom.experts, i % w->geom.experts);
	return 0;
}

/* Writes both tables and returns their checksum through *sum. */
static int write_tables(struct mp_store_writer *w, uint64_t *sum)
{
	const struct mpk_layout *l = &w->layout;
	size_t tlen = (size_t)l->n_tensors * MPK_TENSOR_ENTRY_BYTES;
	size_t elen = (size_t)l->n_experts * MPK_EXPERT_ENTRY_BYTES;
	struct mpk_tensor_entry *tt = calloc(l->n_tensors, sizeof(*tt));
	struct mpk_expert_entry *et = calloc(l->n_experts, sizeof(*et));
	XXH3_state_t *st = XXH3_createState();
	int err;

	if (!tt || !et || !st) {
		err = mp_err(-ENOMEM, "%s: out of memory for the tables", w->out.path);
		goto free_tables;
	}
	for (uint32_t i = 0; i < l->n_tensors; i++) {
		const struct mp_tensor_info *t = &l->tensors[i];

		memcpy(tt[i].name, t->name, sizeof(tt[i].name));
		tt[i].dtype = (uint32_t)t->dtype;
		tt[i].ndim = t->ndim;
		memcpy(tt[i].dims, t->dims, sizeof(tt[i].dims));
		tt[i].offset = t->offset;
		tt[i].bytes = t->bytes;
		tt[i].checksum = t->checksum;
	}
	for (uint32_t i = 0; i < l->n_experts; i++) {
		et[i].layer = i / w->geom.experts;
		et[i].expert = i % w->geom.experts;
		et[i].offset = mpk_layout_expert_offset(l, i);
		et[i].bytes = l->expert_bytes;
		et[i].checksum = w->expert_sums[i];
	}
	err = mpk_pwrite_full(w->out.fd, tt, tlen, l->tensor_table_off);
	if (!err)
		err = mpk_pwrite_full(w->out.fd, et, elen, l->expert_table_off);
	if (err) {
		err = mp_err(err, "%s: writing the tables: %s", w->out.tmp_path, strerror(-err));
		goto free_tables;
	}
	XXH3_64bits_reset(st);
	XXH3_64bits_update(st, tt, tlen);
	XXH3_64bits_update(st, et, elen);
	*sum = XXH3_64bits_digest(st);
free_tables:
	XXH3_freeState(st);
	free(et);
	free(tt);
	return err;
}

static void fill_header(const struct mp_store_writer *w, struct mpk_header *h, uint64_t tables_sum)
{
	const struct mp_geometry *g = &w->geom;
	const struct mpk_layout *l = &w->layout;

	memset(h, 0, sizeof(*h));
	memcpy(h->magic, MPK_MAGIC, MPK_MAGIC_LEN);
	h->version = MP_MPK_VERSION;
	h->header_bytes = MPK_HEADER_BYTES;
	h->file_bytes = l->file_bytes;
	h->layers = g->layers;
	h->experts = g->experts;
	h->topk = g->topk;
	h->hidden = g->hidden;
	h->ffn = g->ffn;
	h->heads = g->heads;
	h->kv_heads = g->kv_heads;
	h->head_dim = g->head_dim;
	h->vocab = g->vocab;
	h->max_seq = g->max_seq;
	h->dtype = (uint32_t)g->dtype;
	h->rope_theta = g->rope_theta;
	h->norm_eps = g->norm_eps;
	h->tensor_table_off = l->tensor_table_off;
	h->n_tensors = l->n_tensors;
	h->tensor_entry_bytes = MPK_TENSOR_ENTRY_BYTES;
	h->expert_table_off = l->expert_table_off;
	h->n_experts = l->n_experts;
	h->expert_entry_bytes = MPK_EXPERT_ENTRY_BYTES;
	h->expert_align = MP_EXPERT_ALIGN;
	h->expert_bytes = l->expert_bytes;
	h->tables_checksum = tables_sum;
	memcpy(h->name, w->name, sizeof(h->name));
	h->header_checksum = XXH3_64bits(h, offsetof(struct mpk_header, header_checksum));
}

int mp_store_writer_finish(struct mp_store_writer *w)
{
	struct mpk_header *h = NULL;
	uint64_t sum = 0;
	int err;

	if (!w)
		return mp_err(-EINVAL, "mp_store_writer_finish: NULL writer");
	err = check_complete(w);
	if (err)
		goto abort_write;
	err = write_tables(w, &sum);
	if (err)
		goto abort_write;
	h = malloc(sizeof(*h));
	if (!h) {
		err = mp_err(-ENOMEM, "%s: out of memory", w->out.path);
		goto abort_write;
	}
	fill_header(w, h, sum);
	/* The header goes last so a crash before here leaves no valid-looking file. */
	err = mpk_pwrite_full(w->out.fd, h, sizeof(*h), 0);
	if (err) {
		err = mp_err(err, "%s: writing the header: %s", w->out.tmp_path, strerror(-err));
		goto abort_write;
	}
	free(h);
	err = mpk_tmpfile_commit(&w->out);
	writer_free(w);
	return err;
abort_write:
	free(h);
	mp_store_writer_abort(w);
	return err;
}

void mp_store_writer_abort(struct mp_store_writer *w)
{
	if (!w)
		return;
	mpk_tmpfile_abort(&w->out);
	writer_free(w);
}

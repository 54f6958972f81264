// SPDX-License-Identifier: MIT
/* Trajectory files (docs/trajectory-format.md): writer, reader and the moe-trace v1 export. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


#include "base/base.h"
#include <moepager/traj.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the file is little-endian");

#define TRAJ_MAGIC		"MPTRAJ\r\n"
#define TRAJ_VERSION		1u
#define TRAJ_HEADER_BYTES	128u
/* Every record starts with the first 56 bytes of struct mp_traj_rec. */
#define TRAJ_REC_HDR_BYTES	offsetof(struct mp_traj_rec, ids)

struct file_header {
	char magic[8];
	uint32_t version;
	uint32_t header_bytes;
	uint32_t pid;
	uint32_t source;
	uint64_t start_ns;
	uint64_t start_unix_ns;
	uint64_t range_base;
	uint64_t range_slot_bytes;
	uint32_t range_slots_per_layer;
	uint32_t range_layers;
	uint32_t layers;
	uint32_t experts;
	uint64_t records;
	uint64_t dropped;
	uint64_t checksum;		/* mp_checksum() of the bytes before this field */
	uint8_t reserved[TRAJ_HEADER_BYTES - 96];
};

_Static_assert(sizeof(struct file_header) == TRAJ_HEADER_BYTES, "header size");
_Static_assert(offsetof(struct file_header, checksum) == 88, "checksum offset");

struct mp_traj_writer {
	FILE *f;
	char *path;
	char *tmp;
	struct file_header h;
};

static void header_from_info(struct file_header *h, const struct mp_traj_file_info *info)
{
	memset(h, 0, sizeof(*h));
	memcpy(h->magic, TRAJ_MAGIC, sizeof(h->magic));
	h->version = TRAJ_VERSION;
	h->header_bytes = TRAJ_HEADER_BYTES;
	h->pid = info->pid;
	h->source = info->source;
	h->start_ns = info->start_ns;
	h->start_unix_ns = info->start_unix_ns;
	h->range_base = info->range.base;
	h->range_slot_bytes = info->range.slot_bytes;
	h->range_slots_per_layer = info->range.slots_per_layer;
	h->range_layers = info->range.layers;
	h->layers = info->layers;
	h->experts = info->experts;
}

int mp_traj_writer_create(const char *path, const struct mp_traj_file_info *info,
			  struct mp_traj_writer **out)
{
	struct mp_traj_writer *w;
	int err;

	if (!path || !info || !out)
		return mp_err(-EINVAL, "trajectory writer: NULL argument");
	w = calloc(1, sizeof(*w));
	if (!w)
		return mp_err(-ENOMEM, "trajectory writer: out of memory");
	w->path = strdup(path);
	if (!w->path || asprintf(&w->tmp, "%s.tmp.%d", path, getpid()) < 0) {
		w->tmp = NULL;
		err = mp_err(-ENOMEM, "trajectory writer: out of memory");
		goto err_free;
	}
	w->f = fopen(w->tmp, "wbx");
	if (!w->f) {
		err = mp_err(-errno, "cannot create %s: %s", w->tmp, strerror(errno));
		goto err_free;
	}
	header_from_info(&w->h, info);
	/* The header is written again, complete, by finish. */
	if (fwrite(&w->h, sizeof(w->h), 1, w->f) != 1) {
		err = mp_err(-EIO, "writing %s failed: %s", w->tmp, strerror(errno));
		fclose(w->f);
		unlink(w->tmp);
		goto err_free;
	}
	*out = w;
	return 0;

err_free:
	free(w->tmp);
	free(w->path);
	free(w);
	return err;
}

static int check_record(const struct mp_traj_rec *r)
{
	if (r->kind < MP_TRAJ_ROUTE || r->kind > MP_TRAJ_PREFILL)
		return -EINVAL;
	if (r->kind == MP_TRAJ_ROUTE ? (!r->k || r->k > MP_TRAJ_MAX_K) : r->k != 0)
		return -EINVAL;
	if (r->flags & ~MP_TRAJ_F_WEIGHTS || (r->kind != MP_TRAJ_ROUTE && r->flags))
		return -EINVAL;
	return 0;
}

int mp_traj_writer_put(struct mp_traj_writer *w, const struct mp_traj_rec *r)
{
	size_t n = r->k * sizeof(uint32_t);

	if (check_record(r))
		return mp_err(-EINVAL, "trajectory writer: record %" PRIu64 " has kind %u, k %u, "
			      "flags 0x%x", w->h.records, r->kind, r->k, r->flags);
	if (fwrite(r, TRAJ_REC_HDR_BYTES, 1, w->f) != 1 ||
	    (n && fwrite(r->ids, n, 1, w->f) != 1) ||
	    (r->flags & MP_TRAJ_F_WEIGHTS && fwrite(r->weights, n, 1, w->f) != 1))
		return mp_err(errno == ENOSPC ? -ENOSPC : -EIO, "writing %s failed: %s", w->tmp,
			      strerror(errno));
	w->h.records++;
	return 0;
}

void mp_traj_writer_set_dropped(struct mp_traj_writer *w, uint64_t dropped)
{
	w->h.dropped = dropped;
}

int mp_traj_writer_finish(struct mp_traj_writer *w)
{
	int err = 0;

	w->h.checksum = mp_checksum(&w->h, offsetof(struct file_header, checksum));
	if (fflush(w->f) || fseek(w->f, 0, SEEK_SET) ||
	    fwrite(&w->h, sizeof(w->h), 1, w->f) != 1 || fflush(w->f) || fsync(fileno(w->f)))
		err = mp_err(errno == ENOSPC ? -ENOSPC : -EIO, "writing %s failed: %s", w->tmp,
			     strerror(errno));
	if (fclose(w->f) && !err)
		err = mp_err(-EIO, "closing %s failed: %s", w->tmp, strerror(errno));
	w->f = NULL;
	if (!err && rename(w->tmp, w->path))
		err = mp_err(-errno, "renaming %s to %s failed: %s", w->tmp, w->path,
			     strerror(errno));
	if (err)
		unlink(w->tmp);
	free(w->tmp);
	free(w->path);
	free(w);
	return err;
}

void mp_traj_writer_abort(struct mp_traj_writer *w)
{
	if (!w)
		return;
	if (w->f)
		fclose(w->f);
	unlink(w->tmp);
	free(w->tmp);
	free(w->path);
	free(w);
}

/* Reads exactly len bytes at the file's position; -ENODATA names the offset of a short read. */
static int read_at(FILE *f, const char *path, void *buf, size_t len, uint64_t off, const char *what)
{
	if (fread(buf, len, 1, f) == 1)
		return 0;
	if (ferror(f))
		return mp_err(-EIO, "%s: reading %s at offset %" PRIu64 " failed", path, what, off);
	return mp_err(-ENODATA, "%s: truncated %s at offset %" PRIu64, path, what, off);
}

int64_t mp_traj_file_read(const char *path, struct mp_traj_file_info *info, mp_traj_fn fn,
			  void *arg)
{
	struct mp_traj_rec *r = NULL;
	struct file_header h;
	uint64_t off = 0, i;
	int64_t ret;
	FILE *f;

	if (!path)
		return mp_err(-EINVAL, "trajectory file: NULL path");
	f = fopen(path, "rbe");
	if (!f)
		return mp_err(-errno, "cannot open %s: %s", path, strerror(errno));
	ret = read_at(f, path, &h, sizeof(h), 0, "header");
	if (ret)
		goto out;
	if (memcmp(h.magic, TRAJ_MAGIC, sizeof(h.magic))) {
		ret = mp_err(-EPROTO, "%s: not a moepager trajectory file (bad magic at offset 0)",
			     path);
		goto out;
	}
	if (h.version != TRAJ_VERSION) {
		ret = mp_err(-EPROTONOSUPPORT, "%s: trajectory format version %u (this reader "
			     "knows %u)", path, h.version, TRAJ_VERSION);
		goto out;
	}
	if (h.header_bytes != TRAJ_HEADER_BYTES ||
	    h.checksum != mp_checksum(&h, offsetof(struct file_header, checksum))) {
		ret = mp_err(-EBADMSG, "%s: corrupt header (checksum or size at offset 0)", path);
		goto out;
	}
	if (info) {
		info->pid = h.pid;
		info->source = h.source;
		info->start_ns = h.start_ns;
		info->start_unix_ns = h.start_unix_ns;
		info->range.base = h.range_base;
		info->range.slot_bytes = h.range_slot_bytes;
		info->range.slots_per_layer = h.range_slots_per_layer;
		info->range.layers = h.range_layers;
		info->layers = h.layers;
		info->experts = h.experts;
		info->records = h.records;
		info->dropped = h.dropped;
	}
	r = malloc(sizeof(*r));
	if (!r) {
		ret = mp_err(-ENOMEM, "%s: out of memory", path);
		goto out;
	}
	off = sizeof(h);
	for (i = 0; i < h.records; i++) {
		size_t n;

		memset(r, 0, sizeof(*r));
		ret = read_at(f, path, r, TRAJ_REC_HDR_BYTES, off, "record");
		if (ret)
			goto out;
		if (check_record(r)) {
			ret = mp_err(-EBADMSG, "%s: record %" PRIu64 " at offset %" PRIu64 " is "
				     "corrupt (kind %u, k %u, flags 0x%x)", path, i, off, r->kind,
				     r->k, r->flags);
			goto out;
		}
		off += TRAJ_REC_HDR_BYTES;
		n = r->k * sizeof(uint32_t);
		if (n && (ret = read_at(f, path, r->ids, n, off, "record ids")))
			goto out;
		off += n;
		if (r->flags & MP_TRAJ_F_WEIGHTS) {
			ret = read_at(f, path, r->weights, n, off, "record weights");
			if (ret)
				goto out;
			off += n;
		}
		if (fn && (ret = fn(r, arg)))
			goto out;
	}
	if (fgetc(f) != EOF) {
		ret = mp_err(-EBADMSG, "%s: data after the %" PRIu64 " records the header counts "
			     "(offset %" PRIu64 ")", path, h.records, off);
		goto out;
	}
	ret = (int64_t)h.records;
out:
	free(r);
	fclose(f);
	return ret;
}

/*
 * Export
 */

struct route_row {
	uint32_t request;
	uint32_t token;
	uint32_t layer;
	uint32_t idx;		/* into ids[]/weights[], in units of k */
};

struct export_ctx {
	const char *path;
	uint32_t *requests;		/* recorded request id of each exported request */
	uint32_t nrequests;
	struct route_row *rows;
	uint32_t *ids;
	float *weights;
	uint64_t n, cap;
	uint32_t k;
	bool weights_all;
	uint32_t max_id, max_layer, max_request;
};

static int collect_route(const struct mp_traj_rec *r, void *arg)
{
	struct export_ctx *x = arg;

	/* Prompt tokens have no index in a moe-trace: only generated ones are exported. */
	if (r->kind != MP_TRAJ_ROUTE || r->token == MP_TRAJ_NONE)
		return 0;
	if (!x->k)
		x->k = r->k;
	if (r->k != x->k)
		return mp_err(-EINVAL, "%s: request %u token %u layer %u routes %u experts, "
			      "earlier rows %u: moe-trace v1 needs one top-k", x->path, r->request,
			      r->token, r->layer, r->k, x->k);
	if (x->n == x->cap) {
		uint64_t cap = x->cap ? 2 * x->cap : 4096;
		struct route_row *rows = realloc(x->rows, cap * sizeof(*rows));
		uint32_t *ids = rows ? realloc(x->ids, cap * x->k * sizeof(*ids)) : NULL;
		float *w = ids ? realloc(x->weights, cap * x->k * sizeof(*w)) : NULL;

		if (rows)
			x->rows = rows;
		if (ids)
			x->ids = ids;
		if (!w)
			return mp_err(-ENOMEM, "%s: out of memory for %" PRIu64 " routes", x->path,
				      cap);
		x->weights = w;
		x->cap = cap;
	}
	x->rows[x->n] = (struct route_row){ r->request, r->token, r->layer, (uint32_t)x->n };
	memcpy(x->ids + x->n * x->k, r->ids, x->k * sizeof(uint32_t));
	memcpy(x->weights + x->n * x->k, r->weights, x->k * sizeof(float));
	x->weights_all &= !!(r->flags & MP_TRAJ_F_WEIGHTS);
	for (uint32_t i = 0; i < x->k; i++)
		x->max_id = MP_MAX(x->max_id, r->ids[i]);
	x->max_layer = MP_MAX(x->max_layer, r->layer);
	x->max_request = MP_MAX(x->max_request, r->request);
	x->n++;
	return 0;
}

static int row_cmp(const void *a, const void *b)
{
	const struct route_row *x = a, *y = b;

	if (x->request != y->request)
		return x->request < y->request ? -1 : 1;
	if (x->token != y->token)
		return x->token < y->token ? -1 : 1;
	if (x->layer != y->layer)
		return x->layer < y->layer ? -1 : 1;
	return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/*
 * Numbers the recorded requests 0.. in id order (x->requests keeps the
 * recorded ids). Keeps the rows sorted.
 */
static int renumber(struct export_ctx *x)
{
	/* At most one exported request per distinct id, and per row. */
	x->requests = calloc(MP_MIN((uint64_t)x->max_request + 1, x->n), sizeof(*x->requests));
	if (!x->requests)
		return mp_err(-ENOMEM, "%s: out of memory", x->path);
	for (uint64_t i = 0; i < x->n; i++) {
		uint32_t req = x->rows[i].request;

		if (!i || req != x->requests[x->nrequests - 1])
			x->requests[x->nrequests++] = req;
		x->rows[i].request = x->nrequests - 1;
	}
	x->max_request = x->nrequests - 1;
	return 0;
}

/*
 * Checks the sorted rows: requests 0..R-1, tokens from 0 and consecutive,
 * each token with layers 0..L-1 exactly once. A request's last token may
 * hold only layers 0..m-1 (recording stopped mid-token): it is left out with
 * a warning. Sets keep[] for the rows to write; returns their number.
 */
static int64_t check_rows(struct export_ctx *x, uint32_t layers, bool *keep)
{
	uint64_t i, end, kept = 0;
	uint32_t req = 0, tok = 0;
	bool first = true;

	for (i = 0; i < x->n; i = end) {
		const struct route_row *g = &x->rows[i];
		uint64_t cnt, j;
		bool prefix;

		for (end = i; end < x->n && x->rows[end].request == g->request &&
			      x->rows[end].token == g->token; end++)
			;
		if (first ? g->request != 0 : g->request != req && g->request != req + 1)
			return mp_err(-EINVAL, "%s: request %u has no route records (requests must "
				      "be 0..%u)", x->path, first ? 0 : req + 1, x->max_request);
		if (first || g->request != req) {
			req = g->request;
			tok = 0;
			first = false;
		}
		if (g->token != tok)
			return mp_err(-EINVAL, "%s: request %u token %u has no route records (the "
				      "next recorded is token %u; moe-trace v1 needs tokens from "
				      "0, consecutive)", x->path, req, tok, g->token);
		for (j = i + 1; j < end; j++)
			if (x->rows[j].layer == x->rows[j - 1].layer)
				return mp_err(-EINVAL, "%s: request %u token %u layer %u is "
					      "recorded twice", x->path, req, tok,
					      x->rows[j].layer);
		/* Sorted and distinct: the layers are 0..cnt-1 when the last one is cnt-1. */
		cnt = end - i;
		prefix = x->rows[end - 1].layer == cnt - 1;
		if (prefix && cnt == layers) {
			for (j = i; j < end; j++)
				keep[j] = true;
			kept += cnt;
		} else if (prefix && (end == x->n || x->rows[end].request != req)) {
			mp_warn("%s: request %u token %u has %" PRIu64 " of %u layers (recording "
				"stopped mid-token): left out", x->path, req, tok, cnt, layers);
		} else {
			for (j = i; j < end && x->rows[j].layer == j - i; j++)
				;
			return mp_err(-EINVAL, "%s: request %u token %u has no layer %" PRIu64,
				      x->path, req, tok, j - i);
		}
		tok++;
	}
	return (int64_t)kept;
}

int64_t mp_traj_export_moe_trace(const char *path, uint32_t experts, FILE *out)
{
	struct export_ctx x = { .path = path, .weights_all = true };
	struct mp_traj_file_info info;
	bool *keep = NULL;
	uint32_t layers;
	int64_t ret;

	if (!out)
		return mp_err(-EINVAL, "trajectory export: NULL output");
	ret = mp_traj_file_read(path, &info, collect_route, &x);
	if (ret < 0)
		goto out;
	if (!x.n) {
		ret = mp_err(-ENODATA, "%s: no route records of generated tokens (a "
			     "page-fault-only recording has no token boundaries to export)", path);
		goto out;
	}
	layers = info.layers ? info.layers : x.max_layer + 1;
	if (!experts)
		experts = info.experts ? info.experts : x.max_id + 1;
	if (x.max_id >= experts || x.max_layer >= layers) {
		ret = mp_err(-EINVAL, "%s: expert %u or layer %u out of the %u x %u geometry", path,
			     x.max_id, x.max_layer, layers, experts);
		goto out;
	}
	qsort(x.rows, x.n, sizeof(*x.rows), row_cmp);
	ret = renumber(&x);
	if (ret < 0)
		goto out;
	keep = calloc(x.n, sizeof(*keep));
	if (!keep) {
		ret = mp_err(-ENOMEM, "%s: out of memory", path);
		goto out;
	}
	ret = check_rows(&x, layers, keep);
	if (ret < 0)
		goto out;

	fprintf(out, "# moe-trace v1\n# name=moepager-trace-pid%u\n# layers=%u\n# experts=%u\n"
		"# topk=%u\n# requests=%u\n", info.pid, layers, experts, x.k, x.nrequests);
	/* Request i of the export was recorded as request recorded_requests[i]. */
	fprintf(out, "# recorded_requests=");
	for (uint32_t i = 0; i < x.nrequests; i++)
		fprintf(out, "%s%u", i ? "," : "", x.requests[i]);
	fprintf(out, "\nrequest,token,layer");
	for (uint32_t i = 0; i < x.k; i++)
		fprintf(out, ",e%u", i);
	for (uint32_t i = 0; x.weights_all && i < x.k; i++)
		fprintf(out, ",w%u", i);
	fputc('\n', out);
	for (uint64_t i = 0; i < x.n; i++) {
		const struct route_row *r = &x.rows[i];

		if (!keep[i])
			continue;
		fprintf(out, "%u,%u,%u", r->request, r->token, r->layer);
		for (uint32_t j = 0; j < x.k; j++)
			fprintf(out, ",%u", x.ids[(uint64_t)r->idx * x.k + j]);
		/* %.9g: every f32 prints back to the same value. */
		for (uint32_t j = 0; x.weights_all && j < x.k; j++)
			fprintf(out, ",%.9g", (double)x.weights[(uint64_t)r->idx * x.k + j]);
		fputc('\n', out);
	}
	if (fflush(out) || ferror(out))
		ret = mp_err(-EIO, "writing the moe-trace export failed: %s", strerror(errno));
out:
	free(keep);
	free(x.requests);
	free(x.rows);
	free(x.ids);
	free(x.weights);
	return ret;
}

// SPDX-License-Identifier: MIT
/* The .mpc consolidation map file: writer, and a reader that checks every field. */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <moepager/consolidate.h>

#include "base/base.h"
#include "store/consolidate_priv.h"
#include "store/fileio.h"

#define OFF(field) offsetof(struct mpc_header, field)

static uint64_t models_len(const struct mp_consolidation *c)
{
	return (uint64_t)c->n * MPC_MODEL_ENTRY_BYTES;
}

static uint64_t positions_len(const struct mp_consolidation *c)
{
	return (uint64_t)c->n_positions * MPC_POSITION_ENTRY_BYTES;
}

static uint64_t pairs_len(const struct mp_consolidation *c)
{
	return (uint64_t)c->n_pairs * c->n_positions * sizeof(double);
}

/*
 * Writer: the header, then the model, position and pair tables back to back
 */

static void fill_header(const struct mp_consolidation *c, struct mpc_header *h)
{
	memcpy(h->magic, MPC_MAGIC, MPK_MAGIC_LEN);
	h->version = MP_MPC_VERSION;
	h->header_bytes = MPC_HEADER_BYTES;
	h->n_models = c->n;
	h->layers = c->layers;
	h->experts = c->experts;
	h->hidden = c->hidden;
	h->ffn = c->ffn;
	h->dtype = c->dtype;
	h->capacity = c->capacity;
	h->expert_bytes = c->expert_bytes;
	h->models_off = MPC_HEADER_BYTES;
	h->positions_off = h->models_off + models_len(c);
	h->pairs_off = h->positions_off + positions_len(c);
	h->file_bytes = h->pairs_off + pairs_len(c);
	h->model_entry_bytes = MPC_MODEL_ENTRY_BYTES;
	h->position_entry_bytes = MPC_POSITION_ENTRY_BYTES;
	h->n_positions = c->n_positions;
	h->n_pairs = c->n_pairs;
	h->models_checksum = XXH3_64bits(c->models, models_len(c));
	h->positions_checksum = XXH3_64bits(c->pos, positions_len(c));
	h->pairs_checksum = XXH3_64bits(c->pairs, pairs_len(c));
	h->header_checksum = XXH3_64bits(h, OFF(header_checksum));
}

int mp_consolidation_write(const struct mp_consolidation *c, const char *path)
{
	struct mpc_header *h;
	struct mpk_tmpfile out;
	int err;

	if (!c || !path)
		return mp_err(-EINVAL, "mp_consolidation_write: NULL argument");
	h = calloc(1, sizeof(*h));
	if (!h)
		return mp_err(-ENOMEM, "%s: out of memory", path);
	fill_header(c, h);
	err = mpk_tmpfile_create(&out, path);
	if (err)
		goto free_header;
	err = mpk_pwrite_full(out.fd, c->models, models_len(c), h->models_off);
	if (!err)
		err = mpk_pwrite_full(out.fd, c->pos, positions_len(c), h->positions_off);
	if (!err)
		err = mpk_pwrite_full(out.fd, c->pairs, pairs_len(c), h->pairs_off);
	/* The header goes last so a crash before here leaves no valid-looking file. */
	if (!err)
		err = mpk_pwrite_full(out.fd, h, sizeof(*h), 0);
	if (err) {
		err = mp_err(err, "%s: writing the map: %s", out.tmp_path, strerror(-err));
		mpk_tmpfile_abort(&out);
		goto free_header;
	}
	err = mpk_tmpfile_commit(&out);
free_header:
	free(h);
	return err;
}

/*
 * Reader
 */

static int check_magic_and_sums(const char *p, const struct mpc_header *h)
{
	uint64_t sum;

	if (memcmp(h->magic, MPC_MAGIC, MPK_MAGIC_LEN))
		return mp_err(-EPROTO, "%s: not a moepager consolidation map (bad magic at offset 0)",
			      p);
	if (h->version != MP_MPC_VERSION)
		return mp_err(-EPROTONOSUPPORT, "%s: unknown map version %u at offset %zu (this "
			      "reader knows %u)", p, h->version, OFF(version), MP_MPC_VERSION);
	sum = XXH3_64bits(h, OFF(header_checksum));
	if (sum != h->header_checksum)
		return mp_err(-EBADMSG, "%s: header checksum mismatch (stored %016llx, computed "
			      "%016llx): bytes [0, %zu) are corrupt", p,
			      (unsigned long long)h->header_checksum, (unsigned long long)sum,
			      OFF(header_checksum));
	if (h->flags & ~MPC_FLAGS_KNOWN)
		return mp_err(-EPROTONOSUPPORT, "%s: unknown header flags 0x%x at offset %zu", p,
			      h->flags, OFF(flags));
	return 0;
}

/* A u32 header field that must equal want. */
static int check_u32(const char *p, const char *field, size_t off, uint32_t got, uint32_t want)
{
	if (got == want)
		return 0;
	return mp_err(-EINVAL, "%s: %s %u at offset %zu, expected %u", p, field, got, off, want);
}

static int check_sizes(const char *p, const struct mpc_header *h, uint64_t size)
{
	int err = check_u32(p, "header_bytes", OFF(header_bytes), h->header_bytes,
			    MPC_HEADER_BYTES);

	if (!err)
		err = check_u32(p, "model_entry_bytes", OFF(model_entry_bytes),
				h->model_entry_bytes, MPC_MODEL_ENTRY_BYTES);
	if (!err)
		err = check_u32(p, "position_entry_bytes", OFF(position_entry_bytes),
				h->position_entry_bytes, MPC_POSITION_ENTRY_BYTES);
	if (err)
		return err;
	if (h->file_bytes < MPC_HEADER_BYTES)
		return mp_err(-EINVAL, "%s: file_bytes %llu at offset %zu is smaller than the header",
			      p, (unsigned long long)h->file_bytes, OFF(file_bytes));
	if (size < h->file_bytes)
		return mp_err(-ENODATA, "%s: truncated: file is %llu bytes, header says %llu", p,
			      (unsigned long long)size, (unsigned long long)h->file_bytes);
	return 0;
}

static int check_counts(const char *p, const struct mpc_header *h)
{
	size_t esize = mp_dtype_size(h->dtype);

	if (!h->n_models || h->n_models > MP_CONSOL_MAX_MODELS)
		return mp_err(-EINVAL, "%s: n_models %u at offset %zu is not in [1, %u]", p,
			      h->n_models, OFF(n_models), MP_CONSOL_MAX_MODELS);
	if (!h->layers || h->layers > MP_MAX_LAYERS || !h->experts || h->experts > MP_MAX_EXPERTS)
		return mp_err(-EINVAL, "%s: %u layers x %u experts at offsets %zu, %zu is absurd", p,
			      h->layers, h->experts, OFF(layers), OFF(experts));
	if (!esize || !h->hidden || h->hidden > MP_MAX_DIM || !h->ffn || h->ffn > MP_MAX_DIM ||
	    h->expert_bytes != 3ull * h->hidden * h->ffn * esize)
		return mp_err(-EINVAL, "%s: hidden %u, ffn %u, dtype %u, expert_bytes %llu (offsets "
			      "%zu-%zu) do not describe an expert", p, h->hidden, h->ffn, h->dtype,
			      (unsigned long long)h->expert_bytes, OFF(hidden), OFF(expert_bytes));
	if (h->n_positions != h->layers * h->experts)
		return check_u32(p, "n_positions", OFF(n_positions), h->n_positions,
				 h->layers * h->experts);
	if (h->n_pairs != h->n_models * (h->n_models - 1) / 2)
		return check_u32(p, "n_pairs", OFF(n_pairs), h->n_pairs,
				 h->n_models * (h->n_models - 1) / 2);
	if (h->capacity > h->n_positions)
		return mp_err(-EINVAL, "%s: capacity %u at offset %zu exceeds the %u positions", p,
			      h->capacity, OFF(capacity), h->n_positions);
	return 0;
}

struct table {
	const char *name;
	const char *field;	/* its *_off field in the header, and where that is */
	size_t field_off;
	uint64_t off;
	uint64_t len;
};

/* Each table inside [4096, file_bytes) and clear of the others. */
static int check_tables(const char *p, const struct mpc_header *h, const struct table *t)
{
	for (int i = 0; i < 3; i++) {
		if (t[i].off < MPC_HEADER_BYTES || t[i].off > h->file_bytes ||
		    h->file_bytes - t[i].off < t[i].len)
			return mp_err(-EINVAL, "%s: the %s table at %llu (%s at offset %zu), %llu "
				      "bytes, is not inside [%u, %llu)", p, t[i].name,
				      (unsigned long long)t[i].off, t[i].field, t[i].field_off,
				      (unsigned long long)t[i].len, MPC_HEADER_BYTES,
				      (unsigned long long)h->file_bytes);
		for (int j = 0; j < i; j++)
			if (t[i].len && t[j].len && t[i].off < t[j].off + t[j].len &&
			    t[j].off < t[i].off + t[i].len)
				return mp_err(-EINVAL, "%s: the %s table at %llu (%s at offset %zu) "
					      "overlaps the %s table", p, t[i].name,
					      (unsigned long long)t[i].off, t[i].field,
					      t[i].field_off, t[j].name);
	}
	return 0;
}

static int read_table(const char *p, int fd, const struct table *t, void *buf, uint64_t sum,
		      size_t sum_field)
{
	ssize_t got = mpk_pread_full(fd, buf, t->len, t->off);

	if (got != (ssize_t)t->len)
		return mp_err(got < 0 ? (int)got : -ENODATA, "%s: reading the %s table at %llu "
			      "failed", p, t->name, (unsigned long long)t->off);
	if (XXH3_64bits(buf, t->len) != sum)
		return mp_err(-EBADMSG, "%s: %s table checksum mismatch (checksum at offset %zu): "
			      "bytes [%llu, +%llu) are corrupt", p, t->name, sum_field,
			      (unsigned long long)t->off, (unsigned long long)t->len);
	return 0;
}

static int check_models(const char *p, const struct mp_consolidation *c, uint64_t off)
{
	for (uint32_t i = 0; i < c->n; i++, off += MPC_MODEL_ENTRY_BYTES) {
		const struct mpc_model_entry *m = &c->models[i];

		if (!memchr(m->name, 0, sizeof(m->name)) || !memchr(m->file, 0, sizeof(m->file)))
			return mp_err(-EINVAL, "%s: model %u (entry at offset %llu): name or file "
				      "(offsets +%zu, +%zu) not NUL-terminated", p, i,
				      (unsigned long long)off, offsetof(struct mpc_model_entry, name),
				      offsetof(struct mpc_model_entry, file));
		if (m->flags)
			return mp_err(-EPROTONOSUPPORT, "%s: model %u (entry at offset %llu): unknown "
				      "flags 0x%x", p, i, (unsigned long long)off, m->flags);
		for (uint32_t j = 0; j < i; j++)
			if (c->models[j].identity == m->identity)
				return mp_err(-EINVAL, "%s: model %u (entry at offset %llu) has the "
					      "identity of model %u: a map is of different models",
					      p, i, (unsigned long long)off, j);
	}
	return 0;
}

static int check_pairs(const char *p, const struct mp_consolidation *c, uint64_t off)
{
	for (uint32_t i = 0, k = 0; i < c->n; i++)
		for (uint32_t j = i + 1; j < c->n; j++, k++)
			for (uint32_t q = 0; q < c->n_positions; q++) {
				double d = c->pairs[(size_t)k * c->n_positions + q];

				if (!isfinite(d) || d < 0)
					return mp_err(-EINVAL, "%s: distance %g between models %u and "
						      "%u at layer %u expert %u (offset %llu) is not "
						      "a distance", p, d, i, j, q / c->experts,
						      q % c->experts, (unsigned long long)off +
						      ((uint64_t)k * c->n_positions + q) * 8);
			}
	return 0;
}

/* Distances are their pairs' sums; ranks, owners and counts are Algorithm 1's for them. */
static int check_positions(const char *p, const struct mp_consolidation *c, uint64_t off,
			   const uint32_t *rank, const int32_t *owner)
{
	uint32_t owned[MP_CONSOL_MAX_MODELS] = { 0 };

	for (uint32_t q = 0; q < c->n_positions; q++) {
		const struct mpc_position_entry *e = &c->pos[q];
		unsigned long long at = off + (uint64_t)q * MPC_POSITION_ENTRY_BYTES;

		if (e->rank != rank[q])
			return mp_err(-EINVAL, "%s: layer %u expert %u (entry at offset %llu): rank "
				      "%u, its distance ranks it %u", p, q / c->experts,
				      q % c->experts, at, e->rank, rank[q]);
		if (e->owner != owner[q])
			return mp_err(-EINVAL, "%s: layer %u expert %u (entry at offset %llu): owner "
				      "%d, Algorithm 1 gives %d for rank %u of capacity %u", p,
				      q / c->experts, q % c->experts, at, e->owner, owner[q],
				      e->rank, c->capacity);
		if (e->owner >= 0)
			owned[e->owner]++;
	}
	for (uint32_t i = 0; i < c->n; i++)
		if (owned[i] != c->models[i].owned)
			return mp_err(-EINVAL, "%s: model %u's entry says it owns %u positions, it "
				      "owns %u", p, i, c->models[i].owned, owned[i]);
	return 0;
}

static int check_distances(const char *p, const struct mp_consolidation *c, uint64_t off)
{
	for (uint32_t q = 0; q < c->n_positions; q++) {
		double d = c->pos[q].distance, sum = mpc_pair_sum(c, q);

		if (memcmp(&d, &sum, sizeof(d)) || !isfinite(sum))
			return mp_err(-EINVAL, "%s: layer %u expert %u: distance %.17g at offset %llu "
				      "is not the sum %.17g of its pairs", p, q / c->experts,
				      q % c->experts, d, (unsigned long long)off +
				      (uint64_t)q * MPC_POSITION_ENTRY_BYTES +
				      offsetof(struct mpc_position_entry, distance), sum);
	}
	return 0;
}

static int check_assignment(const char *p, const struct mp_consolidation *c, uint64_t off)
{
	uint32_t *rank = malloc(c->n_positions * sizeof(*rank));
	int32_t *owner = malloc(c->n_positions * sizeof(*owner));
	int err = rank && owner ? check_distances(p, c, off) :
		  mp_err(-ENOMEM, "%s: out of memory", p);

	if (!err)
		err = mpc_rank(c, rank, owner);
	if (!err)
		err = check_positions(p, c, off, rank, owner);
	free(rank);
	free(owner);
	return err;
}

static int load_tables(const char *p, int fd, struct mp_consolidation *c,
		       const struct mpc_header *h)
{
	const struct table t[3] = {
		{ "model", "models_off", OFF(models_off), h->models_off, models_len(c) },
		{ "position", "positions_off", OFF(positions_off), h->positions_off,
		  positions_len(c) },
		{ "pair", "pairs_off", OFF(pairs_off), h->pairs_off, pairs_len(c) },
	};
	int err = check_tables(p, h, t);

	if (!err)
		err = mpc_alloc_tables(c);
	if (!err)
		err = read_table(p, fd, &t[0], c->models, h->models_checksum, OFF(models_checksum));
	if (!err)
		err = read_table(p, fd, &t[1], c->pos, h->positions_checksum,
				 OFF(positions_checksum));
	if (!err)
		err = read_table(p, fd, &t[2], c->pairs, h->pairs_checksum, OFF(pairs_checksum));
	if (!err)
		err = check_models(p, c, h->models_off);
	if (!err)
		err = check_pairs(p, c, h->pairs_off);
	if (!err)
		err = check_assignment(p, c, h->positions_off);
	return err;
}

static int read_header(const char *p, int fd, struct mpc_header *h)
{
	struct stat st;
	ssize_t got;
	int err;

	if (fstat(fd, &st))
		return mp_err(-errno, "%s: stat: %s", p, strerror(errno));
	got = mpk_pread_full(fd, h, sizeof(*h), 0);
	if (got < 0)
		return mp_err((int)got, "%s: reading the header: %s", p, strerror((int)-got));
	if (got < (ssize_t)sizeof(*h))
		return got >= MPK_MAGIC_LEN && !memcmp(h->magic, MPC_MAGIC, MPK_MAGIC_LEN) ?
		       mp_err(-ENODATA, "%s: truncated: %zd bytes, the header alone is %u", p, got,
			      MPC_HEADER_BYTES) :
		       mp_err(-EPROTO, "%s: not a moepager consolidation map (%zd bytes)", p, got);
	err = check_magic_and_sums(p, h);
	if (!err)
		err = check_sizes(p, h, (uint64_t)st.st_size);
	if (!err)
		err = check_counts(p, h);
	return err;
}

static int map_load(const char *p, int fd, struct mp_consolidation *c)
{
	struct mpc_header *h = malloc(sizeof(*h));
	int err;

	if (!h)
		return mp_err(-ENOMEM, "%s: out of memory", p);
	err = read_header(p, fd, h);
	if (err)
		goto free_header;
	*c = (struct mp_consolidation){
		.n = h->n_models, .n_pairs = h->n_pairs, .layers = h->layers,
		.experts = h->experts, .n_positions = h->n_positions, .capacity = h->capacity,
		.hidden = h->hidden, .ffn = h->ffn, .dtype = h->dtype,
		.expert_bytes = h->expert_bytes,
	};
	err = load_tables(p, fd, c, h);
free_header:
	free(h);
	return err;
}

int mp_consolidation_open(const char *path, struct mp_consolidation **out)
{
	struct mp_consolidation *c;
	int fd, err;

	if (!path || !out)
		return mp_err(-EINVAL, "mp_consolidation_open: NULL argument");
	*out = NULL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return mp_err(-ENOMEM, "%s: out of memory", path);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		err = mp_err(-errno, "%s: %s", path, strerror(errno));
		goto close_map;
	}
	err = map_load(path, fd, c);
	close(fd);
	if (err)
		goto close_map;
	*out = c;
	return 0;
close_map:
	mp_consolidation_close(c);
	return err;
}

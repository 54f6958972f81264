// SPDX-License-Identifier: MIT
/* The expert-map store: FineMoE's per-iteration gate maps, cosine search, RDY replacement, file. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <moepager/store.h>

#include "prefetch/emap.h"
#include "base/base.h"

#define EMAP_DEFAULT_CAPACITY	1024u
#define EMAP_MAX_CAPACITY	(1u << 20)

/* The file header: all little-endian, 64 bytes, checksummed (docs/prefetch.md). */
#define EMAP_MAGIC		"MPEXMAP\n"
#define EMAP_VERSION		1u

struct emap_header {
	char magic[8];
	uint32_t version;
	uint32_t header_bytes;
	uint32_t layers;
	uint32_t experts;
	uint32_t sem_dim;
	uint32_t count;
	uint64_t inserted;
	uint64_t replaced;
	uint64_t payload_sum;	/* mp_checksum() of the records */
	uint64_t header_sum;	/* mp_checksum() of the bytes before this field */
};

_Static_assert(sizeof(struct emap_header) == 64, "expert-map header is 64 bytes");

/*
 * Records are stored by columns: value i of every record is one contiguous
 * run (maps[i][y]), so scoring a query against the whole store is, for each
 * of the query's non-zero values, one multiply-add into every record's dot
 * product: independent across records (the compiler vectorises it) and, for
 * each record, in the order a row-by-row dot product would add its terms.
 */
struct mp_emap {
	struct mp_emap_config cfg;
	uint32_t lj;		/* floats of one map */
	uint32_t cap;
	uint32_t count;
	uint64_t id;		/* unique among stores: a query of another store starts over */
	float *maps;		/* [lj][cap] */
	float *sem;		/* [sem_dim][cap] */
	float *sem_norm;	/* [cap] */
	float *prefix_sq;	/* [layers][cap]: a record's sum of squares of layers 0..l */
	uint16_t *top;		/* [cap][layers][topk]: each row's top-k, in vote order */
	uint32_t *gen;		/* [cap]: changes with every write of the record */
	uint32_t writes;
	float *row;		/* [lj] scratch: a normalised map */
	double *dot;		/* [cap] scratch */
	double *dot2;		/* [cap] scratch */
	uint64_t inserted;
	uint64_t replaced;
	uint64_t searches;
};

/* Marks the end of a row's top-k when fewer than k of its experts ran. */
#define NO_EXPERT UINT16_MAX

float mp_cosine(const float *a, const float *b, uint32_t n)
{
	double dot = 0, na = 0, nb = 0;

	for (uint32_t i = 0; i < n; i++) {
		dot += (double)a[i] * b[i];
		na += (double)a[i] * a[i];
		nb += (double)b[i] * b[i];
	}
	if (na <= 0 || nb <= 0)
		return 0.0f;
	return (float)(dot / sqrt(na * nb));
}

static int check_config(const struct mp_emap_config *c)
{
	if (!c->layers || c->layers > MP_MAX_LAYERS)
		return mp_err(-EINVAL, "expert map: layers %u out of range 1..%u", c->layers,
			      MP_MAX_LAYERS);
	if (!c->experts || c->experts > MP_MAX_EXPERTS)
		return mp_err(-EINVAL, "expert map: experts %u out of range 1..%u", c->experts,
			      MP_MAX_EXPERTS);
	if (!c->topk || c->topk > MP_MAX_TOPK || c->topk > c->experts)
		return mp_err(-EINVAL, "expert map: topk %u out of range 1..%u", c->topk,
			      MP_MIN(MP_MAX_TOPK, c->experts));
	if (c->sem_dim > MP_EMAP_MAX_SEM)
		return mp_err(-EINVAL, "expert map: sem_dim %u above %u", c->sem_dim, MP_EMAP_MAX_SEM);
	if (c->capacity > EMAP_MAX_CAPACITY)
		return mp_err(-EINVAL, "expert map: capacity %u above %u", c->capacity,
			      EMAP_MAX_CAPACITY);
	if (c->distance > c->layers)
		return mp_err(-EINVAL, "expert map: distance %u above layers %u", c->distance,
			      c->layers);
	return 0;
}

static uint64_t arrays_bytes(const struct mp_emap *m)
{
	uint64_t cap = m->cap, sem = m->cfg.sem_dim ? m->cfg.sem_dim : 1;

	return cap * ((m->lj + sem + 1 + m->cfg.layers) * sizeof(float) +
		      (uint64_t)m->cfg.layers * m->cfg.topk * sizeof(uint16_t) +
		      sizeof(uint32_t) + 2 * sizeof(double)) + m->lj * sizeof(float);
}

int mp_emap_create(const struct mp_emap_config *cfg, struct mp_emap **out)
{
	static _Atomic uint64_t stores;
	struct mp_emap *m;
	size_t cap;
	int err;

	if (!cfg || !out)
		return mp_err(-EINVAL, "expert map: no config");
	err = check_config(cfg);
	if (err)
		return err;
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->cfg = *cfg;
	if (!m->cfg.capacity)
		m->cfg.capacity = EMAP_DEFAULT_CAPACITY;
	m->cap = m->cfg.capacity;
	m->id = ++stores;
	cap = m->cap;
	m->lj = cfg->layers * cfg->experts;
	m->maps = calloc(cap * m->lj, sizeof(float));
	m->sem = calloc(cap * (cfg->sem_dim ? cfg->sem_dim : 1), sizeof(float));
	m->sem_norm = calloc(cap, sizeof(float));
	m->prefix_sq = calloc(cap * cfg->layers, sizeof(float));
	m->top = calloc(cap * cfg->layers * cfg->topk, sizeof(uint16_t));
	m->gen = calloc(cap, sizeof(uint32_t));
	m->row = calloc(m->lj, sizeof(float));
	m->dot = calloc(cap, sizeof(double));
	m->dot2 = calloc(cap, sizeof(double));
	if (!m->maps || !m->sem || !m->sem_norm || !m->prefix_sq || !m->top || !m->gen ||
	    !m->row || !m->dot || !m->dot2) {
		mp_emap_destroy(m);
		return mp_err(-ENOMEM, "expert map: no memory for %zu records", cap);
	}
	*out = m;
	return 0;
}

void mp_emap_destroy(struct mp_emap *m)
{
	if (!m)
		return;
	free(m->maps);
	free(m->sem);
	free(m->sem_norm);
	free(m->prefix_sq);
	free(m->top);
	free(m->gen);
	free(m->row);
	free(m->dot);
	free(m->dot2);
	free(m);
}

const struct mp_emap_config *mp_emap_config(const struct mp_emap *m)
{
	return &m->cfg;
}

void mp_emap_stats(const struct mp_emap *m, struct mp_emap_stats *out)
{
	out->count = m->count;
	out->capacity = m->cfg.capacity;
	out->inserted = m->inserted;
	out->replaced = m->replaced;
	out->searches = m->searches;
	out->bytes = sizeof(*m) + arrays_bytes(m);
}

/* The k largest positive values of row, largest first (ties: lower j), NO_EXPERT after. */
static void row_topk(const float *row, uint32_t J, uint32_t k, uint16_t *ids)
{
	for (uint32_t i = 0; i < k; i++) {
		uint32_t best = J;

		for (uint32_t j = 0; j < J; j++) {
			bool used = false;

			for (uint32_t t = 0; t < i; t++)
				used |= ids[t] == j;
			if (!used && row[j] > 0 && (best == J || row[j] > row[best]))
				best = j;
		}
		ids[i] = best == J ? NO_EXPERT : (uint16_t)best;
		if (best == J)
			return;		/* fewer than k experts ran (an all-zero row) */
	}
}

/*
 * Writes record y from a normalised row-major map and its semantic vector
 * (NULL: zeros), with everything derived from them: norms, top-k, a new
 * generation.
 */
static void put_record(struct mp_emap *m, uint32_t y, const float *map, const float *sem)
{
	const uint32_t L = m->cfg.layers, J = m->cfg.experts, K = m->cfg.topk;
	double acc = 0, s = 0;

	for (uint32_t i = 0; i < m->lj; i++)
		m->maps[(size_t)i * m->cap + y] = map[i];
	for (uint32_t l = 0; l < L; l++) {
		for (uint32_t j = 0; j < J; j++)
			acc += (double)map[l * J + j] * map[l * J + j];
		m->prefix_sq[(size_t)l * m->cap + y] = (float)acc;
		row_topk(map + (size_t)l * J, J, K, m->top + ((size_t)y * L + l) * K);
	}
	for (uint32_t i = 0; i < m->cfg.sem_dim; i++) {
		float v = sem ? sem[i] : 0.0f;

		m->sem[(size_t)i * m->cap + y] = v;
		s += (double)v * v;
	}
	m->sem_norm[y] = (float)sqrt(s);
	if (!++m->writes)
		m->writes = 1;		/* never 0: a query's "none" */
	m->gen[y] = m->writes;
}

/* Copies map into dst with every layer row scaled to sum to 1. */
static int normalise_map(const struct mp_emap *m, const float *map, float *dst)
{
	for (uint32_t l = 0; l < m->cfg.layers; l++) {
		const float *row = map + (size_t)l * m->cfg.experts;
		double sum = 0;

		for (uint32_t j = 0; j < m->cfg.experts; j++) {
			if (!(row[j] >= 0) || !isfinite(row[j]))
				return mp_err(-EINVAL, "expert map: layer %u expert %u: gate "
					      "value %g is not a finite non-negative number", l, j,
					      row[j]);
			sum += row[j];
		}
		for (uint32_t j = 0; j < m->cfg.experts; j++)
			dst[l * m->cfg.experts + j] = sum > 0 ? (float)(row[j] / sum) : 0.0f;
	}
	return 0;
}

static double sumsq(const float *v, uint32_t n)
{
	double s = 0;

	for (uint32_t i = 0; i < n; i++)
		s += (double)v[i] * v[i];
	return s;
}

/* acc[y] += a * col[y] for every record y < n: the next term of each record's dot product. */
static void fold(double *restrict acc, double a, const float *restrict col, uint32_t n)
{
	for (uint32_t y = 0; y < n; y++)
		acc[y] += a * col[y];
}

/*
 * Adds v[0..n) . (values 0..n of the columns cols) into every record's acc,
 * term by term in index order. A zero term is skipped: adding +-0 leaves a
 * sum that is never -0 unchanged, so the sums are those of a plain loop.
 */
static void fold_vec(const struct mp_emap *m, double *acc, const float *v, uint32_t n,
		     const float *cols)
{
	for (uint32_t i = 0; i < n; i++)
		if (v[i] != 0)
			fold(acc, v[i], cols + (size_t)i * m->cap, m->count);
}

/* Every record's dot product with v over columns cols, into acc. */
static void dots(const struct mp_emap *m, double *acc, const float *v, uint32_t n,
		 const float *cols)
{
	memset(acc, 0, m->count * sizeof(*acc));
	fold_vec(m, acc, v, n, cols);
}

/* Cosine of a trajectory prefix of squared norm vsq with record y's first `layers` layers. */
static float cos_prefix(const struct mp_emap *m, uint32_t y, double dot, double vsq,
			uint32_t layers)
{
	double ysq = m->prefix_sq[(size_t)(layers - 1) * m->cap + y];

	if (vsq <= 0 || ysq <= 0)
		return 0.0f;
	return (float)(dot / sqrt(vsq * ysq));
}

static float cos_sem(const struct mp_emap *m, uint32_t y, double dot, double vnorm)
{
	if (vnorm <= 0 || m->sem_norm[y] <= 0)
		return 0.0f;
	return (float)(dot / (vnorm * m->sem_norm[y]));
}

/* The record whose RDY against the new map norm (and sem) is highest: FineMoE's victim. */
static uint32_t most_redundant(struct mp_emap *m, const float *norm, const float *sem)
{
	const uint32_t L = m->cfg.layers, d = m->cfg.distance;
	double nsq = sumsq(norm, m->lj), snorm = sem ? sqrt(sumsq(sem, m->cfg.sem_dim)) : 0;
	float best = -INFINITY;
	uint32_t y = 0;

	dots(m, m->dot, norm, m->lj, m->maps);
	if (m->cfg.sem_dim && snorm > 0)
		dots(m, m->dot2, sem, m->cfg.sem_dim, m->sem);
	for (uint32_t i = 0; i < m->count; i++) {
		float traj = cos_prefix(m, i, m->dot[i], nsq, L);
		float s = !m->cfg.sem_dim ? traj : snorm > 0 ? cos_sem(m, i, m->dot2[i], snorm) : 0;
		/* Without semantic vectors both terms are the trajectory's. */
		float rdy = ((float)d / L) * s + ((float)(L - d) / L) * traj;

		if (rdy > best) {
			best = rdy;
			y = i;
		}
	}
	return y;
}

int mp_emap_insert(struct mp_emap *m, const float *map, const float *sem)
{
	uint32_t y;
	int err;

	if (!m || !map)
		return mp_err(-EINVAL, "expert map: insert without a map");
	for (uint32_t i = 0; sem && i < m->cfg.sem_dim; i++)
		if (!isfinite(sem[i]))
			return mp_err(-EINVAL, "expert map: semantic value %u is %g", i, sem[i]);
	err = normalise_map(m, map, m->row);
	if (err)
		return err;
	if (m->count == m->cap) {
		y = most_redundant(m, m->row, sem);
		m->replaced++;
	} else {
		y = m->count++;
	}
	put_record(m, y, m->row, sem);
	m->inserted++;
	return (int)y;
}

int mp_emap_search_sem(struct mp_emap *m, const float *sem, float *score)
{
	float best = -INFINITY;
	double vnorm;
	int arg = -ENOENT;

	if (!m->count || !m->cfg.sem_dim || !sem)
		return -ENOENT;
	vnorm = sqrt(sumsq(sem, m->cfg.sem_dim));
	dots(m, m->dot, sem, m->cfg.sem_dim, m->sem);
	for (uint32_t y = 0; y < m->count; y++) {
		float c = cos_sem(m, y, m->dot[y], vnorm);

		if (c > best) {
			best = c;
			arg = (int)y;
		}
	}
	m->searches++;
	if (score)
		*score = best;
	return arg;
}

int mp_emap_search_traj(struct mp_emap *m, const float *map, uint32_t prefix_layers,
			float *score)
{
	float best = -INFINITY;
	uint32_t n;
	double vsq;
	int arg = -ENOENT;

	if (!m->count || !map || !prefix_layers)
		return -ENOENT;
	if (prefix_layers > m->cfg.layers)
		prefix_layers = m->cfg.layers;
	n = prefix_layers * m->cfg.experts;
	vsq = sumsq(map, n);
	dots(m, m->dot, map, n, m->maps);
	for (uint32_t y = 0; y < m->count; y++) {
		float c = cos_prefix(m, y, m->dot[y], vsq, prefix_layers);

		if (c > best) {
			best = c;
			arg = (int)y;
		}
	}
	m->searches++;
	if (score)
		*score = best;
	return arg;
}

/* Adds w to acc[j] for each of the top-k experts of record y's row of layer. */
static void vote(const struct mp_emap *m, uint32_t y, uint32_t layer, double w, double *acc)
{
	const uint16_t *ids = m->top + ((size_t)y * m->cfg.layers + layer) * m->cfg.topk;

	for (uint32_t i = 0; i < m->cfg.topk && ids[i] != NO_EXPERT; i++)
		acc[ids[i]] += w;
}

/*
 * out[j] = (k/J + sum_y w_y [j in top-k of y's row]) / (1 + sum_y w_y): the
 * pseudo-record keeps every probability above zero and is all there is for
 * an empty store or a context no record shares.
 */
static void finish_use(const struct mp_emap *m, const double *acc, double wsum, float *out)
{
	const uint32_t J = m->cfg.experts, k = m->cfg.topk;

	for (uint32_t j = 0; j < J; j++)
		out[j] = (float)(((double)k / J + acc[j]) / (1.0 + wsum));
}

int mp_emap_predict_layer(struct mp_emap *m, uint32_t layer, const float *ctx, uint32_t offset,
			  float *out)
{
	const uint32_t J = m->cfg.experts;
	double acc[MP_MAX_PREDICT_EXPERTS] = { 0 }, wsum = 0;

	if (!ctx || layer >= m->cfg.layers || !m->cfg.sem_dim || J > MP_MAX_PREDICT_EXPERTS ||
	    (uint64_t)offset + J > m->cfg.sem_dim)
		return -EINVAL;
	dots(m, m->dot, ctx, J, m->sem + (size_t)offset * m->cap);
	for (uint32_t y = 0; y < m->count; y++) {
		double w = m->dot[y];

		if (!(w > 0))
			continue;
		wsum += w;
		vote(m, y, layer, w, acc);
	}
	finish_use(m, acc, wsum, out);
	m->searches++;
	return 0;
}

/* The MP_EMAP_NEIGHBOURS records of highest positive cosine, by decreasing cosine. */
struct neighbours {
	uint32_t n;
	uint32_t y[MP_EMAP_NEIGHBOURS];
	float c[MP_EMAP_NEIGHBOURS];
};

static void neighbour_add(struct neighbours *nb, uint32_t y, float c)
{
	uint32_t i;

	if (!(c > 0) || (nb->n == MP_EMAP_NEIGHBOURS && c <= nb->c[nb->n - 1]))
		return;
	/* Insertion: n is small. */
	i = nb->n < MP_EMAP_NEIGHBOURS ? nb->n++ : nb->n - 1;
	for (; i > 0 && nb->c[i - 1] < c; i--) {
		nb->y[i] = nb->y[i - 1];
		nb->c[i] = nb->c[i - 1];
	}
	nb->y[i] = y;
	nb->c[i] = c;
}

/* The neighbours' vote, weighted by their cosine, for layer `target`: finish_use() into out. */
static void neighbour_vote(const struct mp_emap *m, const struct neighbours *nb, uint32_t target,
			   float *out)
{
	double acc[MP_MAX_PREDICT_EXPERTS] = { 0 }, wsum = 0;

	for (uint32_t i = 0; i < nb->n; i++) {
		wsum += nb->c[i];
		vote(m, nb->y[i], target, nb->c[i], acc);
	}
	finish_use(m, acc, wsum, out);
}

/* Record y's dot product with the first n values of map, added row by row. */
static double record_dot(const struct mp_emap *m, uint32_t y, const float *map, uint32_t n)
{
	double dot = 0;

	for (uint32_t i = 0; i < n; i++)
		dot += (double)map[i] * m->maps[(size_t)i * m->cap + y];
	return dot;
}

void mp_emap_query_reset(struct mp_emap_query *q)
{
	q->store = 0;
}

void mp_emap_query_fini(struct mp_emap_query *q)
{
	free(q->dot);
	free(q->gen);
	memset(q, 0, sizeof(*q));
}

/*
 * Brings q's dot products up to map's first `prefix` layers: only the rows
 * added since the last call, plus a full product for each record written
 * since (another request's map). A prefix that did not grow means the
 * rows were rewritten (a new iteration, a layer gated again): start over.
 */
static int query_fold(struct mp_emap *m, struct mp_emap_query *q, const float *map,
		      uint32_t prefix)
{
	const uint32_t J = m->cfg.experts;
	uint32_t from;

	if (q->cap < m->cap) {
		double *dot = realloc(q->dot, m->cap * sizeof(*dot));
		uint32_t *gen = dot ? realloc(q->gen, m->cap * sizeof(*gen)) : NULL;

		if (dot)
			q->dot = dot;
		if (!gen)
			return -ENOMEM;
		q->gen = gen;
		q->cap = m->cap;
		q->store = 0;
	}
	if (q->store != m->id || prefix <= q->layers) {
		q->store = m->id;
		q->layers = 0;
		q->vsq = 0;
		memset(q->dot, 0, m->count * sizeof(*q->dot));
		memset(q->gen, 0, q->cap * sizeof(*q->gen));
		memcpy(q->gen, m->gen, m->count * sizeof(*q->gen));
	}
	from = q->layers * J;
	for (uint32_t i = from; i < prefix * J; i++)
		q->vsq += (double)map[i] * map[i];
	fold_vec(m, q->dot, map + from, prefix * J - from, m->maps + (size_t)from * m->cap);
	for (uint32_t y = 0; y < m->count; y++) {
		if (q->gen[y] == m->gen[y])
			continue;
		q->dot[y] = record_dot(m, y, map, prefix * J);
		q->gen[y] = m->gen[y];
	}
	q->layers = prefix;
	return 0;
}

int mp_emap_predict_traj(struct mp_emap *m, struct mp_emap_query *q, const float *map,
			 uint32_t prefix_layers, uint32_t target, float *out, float *score)
{
	const uint32_t J = m->cfg.experts;
	struct neighbours nb = { 0 };
	const double *dot = m->dot;
	double vsq;

	if (!map || !prefix_layers || prefix_layers > m->cfg.layers || target >= m->cfg.layers ||
	    J > MP_MAX_PREDICT_EXPERTS)
		return -EINVAL;
	if (q && !query_fold(m, q, map, prefix_layers)) {
		dot = q->dot;
		vsq = q->vsq;
	} else {
		vsq = sumsq(map, prefix_layers * J);
		dots(m, m->dot, map, prefix_layers * J, m->maps);
	}
	for (uint32_t y = 0; y < m->count; y++)
		neighbour_add(&nb, y, cos_prefix(m, y, dot[y], vsq, prefix_layers));
	neighbour_vote(m, &nb, target, out);
	if (score)
		*score = nb.n ? nb.c[0] : 0.0f;
	m->searches++;
	return 0;
}

int mp_emap_predict_sem(struct mp_emap *m, const float *sem, float *out, float *score)
{
	const uint32_t J = m->cfg.experts;
	struct neighbours nb = { 0 };
	double vnorm;

	if (!sem || !out || !m->cfg.sem_dim || J > MP_MAX_PREDICT_EXPERTS)
		return -EINVAL;
	vnorm = sqrt(sumsq(sem, m->cfg.sem_dim));
	dots(m, m->dot, sem, m->cfg.sem_dim, m->sem);
	for (uint32_t y = 0; y < m->count; y++)
		neighbour_add(&nb, y, cos_sem(m, y, m->dot[y], vnorm));
	for (uint32_t l = 0; l < m->cfg.layers; l++)
		neighbour_vote(m, &nb, l, out + (size_t)l * J);
	if (score)
		*score = nb.n ? nb.c[0] : 0.0f;
	m->searches++;
	return 0;
}

int mp_emap_record(const struct mp_emap *m, uint32_t idx, float *map, float *sem)
{
	if (idx >= m->count)
		return -ENOENT;
	for (uint32_t i = 0; map && i < m->lj; i++)
		map[i] = m->maps[(size_t)i * m->cap + idx];
	for (uint32_t i = 0; sem && i < m->cfg.sem_dim; i++)
		sem[i] = m->sem[(size_t)i * m->cap + idx];
	return 0;
}

/*
 * File
 */

/* The records as the file holds them: each one's map, then its semantic vector. */
static float *gather_records(const struct mp_emap *m, size_t *bytes)
{
	size_t rec = (size_t)m->lj + m->cfg.sem_dim;
	float *buf = malloc(rec * sizeof(float) * (m->count ? m->count : 1));

	if (!buf)
		return NULL;
	for (uint32_t y = 0; y < m->count; y++)
		mp_emap_record(m, y, buf + y * rec, buf + y * rec + m->lj);
	*bytes = rec * sizeof(float) * m->count;
	return buf;
}

static int write_all(int fd, const void *buf, size_t len, const char *path)
{
	const char *p = buf;

	while (len) {
		ssize_t n = write(fd, p, len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return mp_err(-errno, "expert map %s: write: %s", path, strerror(errno));
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int mp_emap_save(const struct mp_emap *m, const char *path)
{
	struct emap_header h = { 0 };
	char tmp[4096];
	float *recs;
	size_t bytes;
	int fd, err = 0;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
		return mp_err(-ENAMETOOLONG, "expert map %s: path too long", path);
	memcpy(h.magic, EMAP_MAGIC, sizeof(h.magic));
	h.version = EMAP_VERSION;
	h.header_bytes = sizeof(h);
	h.layers = m->cfg.layers;
	h.experts = m->cfg.experts;
	h.sem_dim = m->cfg.sem_dim;
	h.count = m->count;
	h.inserted = m->inserted;
	h.replaced = m->replaced;
	recs = gather_records(m, &bytes);
	if (!recs)
		return mp_err(-ENOMEM, "expert map %s: no memory to write %u records", path,
			      m->count);
	h.payload_sum = mp_checksum(recs, bytes);
	h.header_sum = mp_checksum(&h, offsetof(struct emap_header, header_sum));

	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		err = mp_err(-errno, "expert map %s: create: %s", tmp, strerror(errno));
		goto free_recs;
	}
	err = write_all(fd, &h, sizeof(h), tmp);
	if (!err)
		err = write_all(fd, recs, bytes, tmp);
	if (!err && fsync(fd))
		err = mp_err(-errno, "expert map %s: fsync: %s", tmp, strerror(errno));
	close(fd);
	if (!err && rename(tmp, path))
		err = mp_err(-errno, "expert map %s: rename: %s", path, strerror(errno));
	if (err)
		unlink(tmp);
free_recs:
	free(recs);
	return err;
}

static int read_exact(int fd, void *buf, size_t len, uint64_t off, const char *path)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return mp_err(-errno, "expert map %s: read at offset %llu: %s", path,
				      (unsigned long long)(off + got), strerror(errno));
		if (!n)
			return mp_err(-ENODATA, "expert map %s: truncated at offset %llu "
				      "(%zu more bytes expected)", path,
				      (unsigned long long)(off + got), len - got);
		got += (size_t)n;
	}
	return 0;
}

int mp_emap_load(const char *path, const struct mp_emap_config *cfg, struct mp_emap **out)
{
	struct emap_header h;
	struct mp_emap *m = NULL;
	char *payload = NULL;
	struct stat sb;
	uint32_t keep;
	size_t rec;
	int fd, err;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return mp_err(-errno, "expert map %s: open: %s", path, strerror(errno));
	err = read_exact(fd, &h, sizeof(h), 0, path);
	if (err == -ENODATA)
		err = mp_err(-EPROTO, "expert map %s: shorter than its %zu-byte header", path,
			     sizeof(h));
	if (err)
		goto close_fd;
	if (memcmp(h.magic, EMAP_MAGIC, sizeof(h.magic))) {
		err = mp_err(-EPROTO, "expert map %s: offset 0: not an expert-map file", path);
		goto close_fd;
	}
	if (h.header_sum != mp_checksum(&h, offsetof(struct emap_header, header_sum))) {
		err = mp_err(-EBADMSG, "expert map %s: offset 56: header checksum mismatch", path);
		goto close_fd;
	}
	if (h.version != EMAP_VERSION || h.header_bytes != sizeof(h)) {
		err = mp_err(-EPROTONOSUPPORT, "expert map %s: offset 8: version %u "
			     "(this reader knows %u)", path, h.version, EMAP_VERSION);
		goto close_fd;
	}
	if (h.layers != cfg->layers || h.experts != cfg->experts || h.sem_dim != cfg->sem_dim) {
		err = mp_err(-EINVAL, "expert map %s: offset 16: file is %u layers x %u experts, "
			     "sem_dim %u; the model needs %u x %u, sem_dim %u", path, h.layers,
			     h.experts, h.sem_dim, cfg->layers, cfg->experts, cfg->sem_dim);
		goto close_fd;
	}
	if (fstat(fd, &sb) == 0 && (uint64_t)sb.st_size < sizeof(h) +
	    (uint64_t)h.count * ((uint64_t)h.layers * h.experts + h.sem_dim) * sizeof(float)) {
		err = mp_err(-ENODATA, "expert map %s: truncated at offset %llu: %u records need "
			     "%llu bytes", path, (unsigned long long)sb.st_size, h.count,
			     (unsigned long long)(sizeof(h) + (uint64_t)h.count *
			     ((uint64_t)h.layers * h.experts + h.sem_dim) * sizeof(float)));
		goto close_fd;
	}
	err = mp_emap_create(cfg, &m);
	if (err)
		goto close_fd;
	keep = MP_MIN(h.count, m->cfg.capacity);
	if (keep < h.count)
		mp_warn("expert map %s: %u records, capacity %u: keeping the first %u", path,
			h.count, m->cfg.capacity, keep);
	rec = ((size_t)m->lj + cfg->sem_dim) * sizeof(float);
	/* The whole payload is checked before any of it is used (the header bounds its size). */
	payload = malloc(rec * h.count + 1);
	if (!payload) {
		err = mp_err(-ENOMEM, "expert map %s: no memory for %u records", path, h.count);
		goto destroy;
	}
	err = read_exact(fd, payload, rec * h.count, sizeof(h), path);
	if (err)
		goto free_payload;
	if (mp_checksum(payload, rec * h.count) != h.payload_sum) {
		err = mp_err(-EBADMSG, "expert map %s: offset 64: record checksum mismatch", path);
		goto free_payload;
	}
	for (uint32_t y = 0; y < keep; y++) {
		const float *map = (const float *)(payload + y * rec);

		for (uint32_t i = 0; i < m->lj; i++) {
			if (!(map[i] >= 0 && map[i] <= 1.0001f)) {
				err = mp_err(-EBADMSG, "expert map %s: offset %llu: gate value %g "
					     "out of [0, 1]", path,
					     (unsigned long long)(sizeof(h) + y * rec + i * 4), map[i]);
				goto free_payload;
			}
		}
		put_record(m, y, map, map + m->lj);
	}
	m->count = keep;
	m->inserted = h.inserted;
	m->replaced = h.replaced;
	free(payload);
	*out = m;
	close(fd);
	return 0;

free_payload:
	free(payload);
destroy:
	mp_emap_destroy(m);
close_fd:
	close(fd);
	return err;
}

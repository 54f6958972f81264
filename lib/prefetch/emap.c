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
 * A record's map is kept as sparse rows: of each layer, the kept values by
 * increasing expert id, padded with expert J (a slot of a spread-out query
 * that is always 0). Each (layer, expert) also lists the records whose kept
 * row holds it: a search folds a query row in through the lists of its
 * kept experts only, so it touches the records that share an expert with
 * it, kept x kept / J values per record on average rather than all kept,
 * and adds each record's terms in expert order, as a dense row-by-row dot
 * product adds the same non-zero terms. A post is 8 bytes, what a search
 * reads of it: which of the record's kept values it is, only a record's
 * removal needs, and finds in the record's row (kept_slot()).
 */
struct post {
	uint32_t y;		/* the record */
	float v;
};

struct list {
	struct post *p;
	uint32_t n, cap;
};

struct rows {
	uint16_t *id;		/* [layers][cap][kept] */
	float *val;		/* [layers][cap][kept] */
	float *prefix_sq;	/* [layers][cap]: sum of squares of layers 0..l as kept */
	struct list *lists;	/* [layers][experts] */
	uint32_t *where;	/* [layers][cap][kept]: each kept value's place in its list */
};

/* A map's kept rows before they are written. */
struct kept_map {
	uint16_t *id;		/* [layers][kept] */
	float *val;
	float *prefix_sq;	/* [layers] */
	double sq;
};

struct mp_emap {
	struct mp_emap_config cfg;
	uint32_t lj;		/* floats of one map */
	uint32_t cap;
	uint32_t kept;		/* values a row keeps */
	uint32_t count;
	uint64_t id;		/* unique among stores: a query of another store starts over */
	struct rows maps;
	struct rows ctx;	/* sem_is_map: the records' semantic maps */
	/*
	 * Otherwise the vectors: [sem_dim][cap] by columns when searches read
	 * them, [cap][sem_dim] by records when they read the sketches (then
	 * only a save reads them, and an insert writes one record's floats
	 * together, not sem_dim cache lines apart).
	 */
	float *sem;
	/*
	 * What searches compare: sem itself, or (sem_dim above
	 * MP_EMAP_SKETCH_DIM) each vector's sketch, sdim floats by columns.
	 */
	uint32_t sdim;
	float *sk;		/* [sdim][cap], NULL: searches read sem */
	float *qsk;		/* [sdim] scratch: the sketch of a query's vector */
	uint32_t *skb;		/* [sem_dim]: each value's bucket, the top bit its sign */
	float *sem_norm;	/* [cap]: of what searches compare */
	uint16_t *top;		/* [layers][cap][topk]: each row's top-k, in vote order */
	uint32_t *gen;		/* [cap]: changes with every write of the record */
	uint32_t writes;
	float *row;		/* [lj] scratch: a normalised map */
	float *qrow;		/* [experts + 1] scratch: a kept row spread out; qrow[J] stays 0 */
	struct kept_map kmap, kctx;	/* a record being written */
	struct mp_emap_query tmp;	/* the searches of callers without a query */
	uint64_t inserted;
	uint64_t replaced;
	uint64_t searches;
};

/* Marks the end of a row's top-k when fewer than k of its experts ran. */
#define NO_EXPERT UINT16_MAX
#define MAX_KEPT (MP_EMAP_ROW_KEEP * MP_MAX_TOPK)

/*
 * Eight lanes (GCC vector extensions): the target_clones below compile
 * them to one AVX-512 register, two AVX2 ones or four SSE ones, each lane
 * the same IEEE operation as the plain loop's, so the same bits.
 */
typedef double v8d __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));

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
	if (c->sem_is_map && c->sem_dim != c->layers * c->experts)
		return mp_err(-EINVAL, "expert map: a semantic map of %u floats, not layers x "
			      "experts (%u)", c->sem_dim, c->layers * c->experts);
	if (c->capacity > EMAP_MAX_CAPACITY)
		return mp_err(-EINVAL, "expert map: capacity %u above %u", c->capacity,
			      EMAP_MAX_CAPACITY);
	if (c->distance > c->layers)
		return mp_err(-EINVAL, "expert map: distance %u above layers %u", c->distance,
			      c->layers);
	return 0;
}

static int rows_alloc(struct rows *r, size_t cap, uint32_t layers, uint32_t experts,
		      uint32_t kept)
{
	r->id = calloc(cap * layers * kept, sizeof(*r->id));
	r->val = calloc(cap * layers * kept, sizeof(*r->val));
	r->prefix_sq = calloc(cap * layers, sizeof(*r->prefix_sq));
	r->lists = calloc((size_t)layers * experts, sizeof(*r->lists));
	r->where = calloc(cap * layers * kept, sizeof(*r->where));
	return r->id && r->val && r->prefix_sq && r->lists && r->where ? 0 : -ENOMEM;
}

static void rows_free(struct rows *r, uint32_t nlists)
{
	for (uint32_t i = 0; r->lists && i < nlists; i++)
		free(r->lists[i].p);
	free(r->lists);
	free(r->where);
	free(r->id);
	free(r->val);
	free(r->prefix_sq);
}

static uint64_t rows_bytes(const struct mp_emap *m, const struct rows *r)
{
	uint64_t b = (uint64_t)m->cap * m->cfg.layers *
		     (m->kept * (sizeof(uint16_t) + sizeof(float) + sizeof(uint32_t)) +
		      sizeof(float)) + (uint64_t)m->lj * sizeof(struct list);

	for (uint32_t i = 0; r->lists && i < m->lj; i++)
		b += (uint64_t)r->lists[i].cap * sizeof(struct post);
	return b;
}

/*
 * A long semantic vector's sketch (feature hashing): each of its values is
 * added, with a sign, into one of sdim buckets, both picked by a fixed hash
 * of its index. Inner products, and so cosines, are kept in expectation,
 * within about 1/sqrt(sdim) of a unit vector's: enough to rank neighbours,
 * at sdim instead of sem_dim floats per record read by every search.
 */
static uint32_t sketch_hash(uint32_t i)
{
	i ^= i >> 16;
	i *= 0x7feb352du;
	i ^= i >> 15;
	i *= 0x846ca68bu;
	i ^= i >> 16;
	return i;
}

int mp_emap_create(const struct mp_emap_config *cfg, struct mp_emap **out)
{
	static _Atomic uint64_t stores;
	struct mp_emap *m;
	size_t cap, sem;
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
	m->kept = MP_MIN(cfg->experts, MP_EMAP_ROW_KEEP * cfg->topk);
	m->id = ++stores;
	cap = m->cap;
	m->lj = cfg->layers * cfg->experts;
	sem = cfg->sem_dim && !cfg->sem_is_map ? cfg->sem_dim : 0;
	err = rows_alloc(&m->maps, cap, cfg->layers, cfg->experts, m->kept);
	if (!err && cfg->sem_is_map)
		err = rows_alloc(&m->ctx, cap, cfg->layers, cfg->experts, m->kept);
	m->sem = sem ? calloc(cap * sem, sizeof(float)) : NULL;
	m->sdim = sem > MP_EMAP_SKETCH_DIM ? MP_EMAP_SKETCH_DIM : (uint32_t)sem;
	if (m->sdim < sem) {
		m->sk = calloc(cap * m->sdim, sizeof(float));
		m->qsk = calloc(m->sdim, sizeof(float));
		m->skb = calloc(sem, sizeof(uint32_t));
		if (!m->sk || !m->qsk || !m->skb)
			err = -ENOMEM;
		for (uint32_t i = 0; m->skb && i < sem; i++) {
			uint32_t h = sketch_hash(i);

			m->skb[i] = (h % m->sdim) | (h & 0x80000000u);
		}
	}
	m->sem_norm = calloc(cap, sizeof(float));
	m->top = calloc(cap * cfg->layers * cfg->topk, sizeof(uint16_t));
	m->gen = calloc(cap, sizeof(uint32_t));
	m->row = calloc(m->lj, sizeof(float));
	m->qrow = calloc(cfg->experts + 1, sizeof(float));
	for (uint32_t i = 0; i < 2; i++) {
		struct kept_map *k = i ? &m->kctx : &m->kmap;

		k->id = calloc((size_t)cfg->layers * m->kept, sizeof(*k->id));
		k->val = calloc((size_t)cfg->layers * m->kept, sizeof(*k->val));
		k->prefix_sq = calloc(cfg->layers, sizeof(*k->prefix_sq));
		if (!k->id || !k->val || !k->prefix_sq)
			err = -ENOMEM;
	}
	if (err || (sem && !m->sem) || !m->sem_norm || !m->top || !m->gen || !m->row ||
	    !m->qrow) {
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
	rows_free(&m->maps, m->lj);
	rows_free(&m->ctx, m->lj);
	free(m->sem);
	free(m->sk);
	free(m->qsk);
	free(m->skb);
	free(m->sem_norm);
	free(m->top);
	free(m->gen);
	free(m->row);
	free(m->qrow);
	for (uint32_t i = 0; i < 2; i++) {
		struct kept_map *k = i ? &m->kctx : &m->kmap;

		free(k->id);
		free(k->val);
		free(k->prefix_sq);
	}
	mp_emap_query_fini(&m->tmp);
	free(m);
}

const struct mp_emap_config *mp_emap_config(const struct mp_emap *m)
{
	return &m->cfg;
}

/*
 * What query_fit() allocates for a query of m's layers holding row_cap
 * floats of rows and products for cap records: its rows, their kept values
 * and norms, and three pairs of products and writes (trajectory, semantic,
 * next iteration's).
 */
static uint64_t fitted_bytes(const struct mp_emap *m, uint32_t row_cap, uint32_t cap)
{
	return (row_cap ? (uint64_t)row_cap * sizeof(float) +
			  (uint64_t)m->cfg.layers * (MAX_KEPT * (sizeof(uint16_t) +
							       sizeof(float)) + sizeof(double)) : 0) +
	       (uint64_t)cap * 3 * (sizeof(double) + sizeof(uint32_t));
}

uint64_t mp_emap_query_bytes(const struct mp_emap *m, const struct mp_emap_query *q)
{
	return fitted_bytes(m, q->row_cap, q->cap);
}

void mp_emap_stats(const struct mp_emap *m, struct mp_emap_stats *out)
{
	uint64_t cap = m->cap;

	out->count = m->count;
	out->capacity = m->cfg.capacity;
	out->inserted = m->inserted;
	out->replaced = m->replaced;
	out->searches = m->searches;
	/* Records, the scratch rows, and the store's own query's arrays (a full one). */
	out->bytes = sizeof(*m) + rows_bytes(m, &m->maps) +
		     (m->cfg.sem_is_map ? rows_bytes(m, &m->ctx) : 0) +
		     cap * (m->sem ? m->cfg.sem_dim : 0) * sizeof(float) +
		     (m->sk ? (cap + 1) * m->sdim * sizeof(float) +
			      (uint64_t)m->cfg.sem_dim * sizeof(uint32_t) : 0) +
		     cap * (sizeof(float) + (uint64_t)m->cfg.layers * m->cfg.topk *
			    sizeof(uint16_t) + sizeof(uint32_t)) +
		     (m->lj + m->cfg.experts + 1) * sizeof(float) + fitted_bytes(m, m->lj, m->cap);
}

/*
 * Keeps row's `kept` largest positive values (ties: lower index), scaled to
 * keep the row's sum when it has more non-zero ones, and writes them by
 * increasing index to id/val, padded with (J, 0); adds their squares to *sq
 * in that order. A NULL row is all zeros.
 */
static void keep_row(const float *row, uint32_t J, uint32_t kept, uint16_t *id, float *val,
		     double *sq)
{
	uint32_t best[MAX_KEPT], n = 0, nz = 0;
	double total = 0, sum = 0, scale = 1;

	/* By decreasing value: an equal value comes after the lower index already in. */
	for (uint32_t j = 0; row && j < J; j++) {
		float v = row[j];
		uint32_t i;

		if (!(v > 0))
			continue;
		nz++;
		total += v;
		if (n == kept && !(v > row[best[n - 1]]))
			continue;
		i = n < kept ? n++ : n - 1;
		for (; i > 0 && row[best[i - 1]] < v; i--)
			best[i] = best[i - 1];
		best[i] = j;
	}
	if (nz > n) {
		for (uint32_t i = 0; i < n; i++)
			sum += row[best[i]];
		scale = total / sum;
	}
	/* By increasing index: insertion, n is small. */
	for (uint32_t i = 1; i < n; i++)
		for (uint32_t t = i; t > 0 && best[t - 1] > best[t]; t--) {
			uint32_t x = best[t];

			best[t] = best[t - 1];
			best[t - 1] = x;
		}
	for (uint32_t i = 0; i < kept; i++) {
		float v = i < n ? (nz > n ? (float)(row[best[i]] * scale) : row[best[i]]) : 0.0f;

		id[i] = i < n ? (uint16_t)best[i] : (uint16_t)J;
		val[i] = v;
		*sq += (double)v * v;
	}
}

/* Where record y's kept row of layer l starts in r. */
static size_t at(const struct mp_emap *m, uint32_t l, uint32_t y)
{
	return ((size_t)l * m->cap + y) * m->kept;
}

/* Room for one more entry in each list row (a kept row of layer l) will join. */
static int lists_reserve(struct mp_emap *m, struct rows *r, uint32_t l, const uint16_t *id)
{
	for (uint32_t i = 0; i < m->kept && id[i] < m->cfg.experts; i++) {
		struct list *li = &r->lists[(size_t)l * m->cfg.experts + id[i]];
		uint32_t cap = li->cap ? 2 * li->cap : 8;
		struct post *p;

		if (li->n < li->cap)
			continue;
		p = realloc(li->p, MP_MIN(cap, m->cap) * sizeof(*p));
		if (!p)
			return mp_err(-ENOMEM, "expert map: no memory for layer %u expert %u's "
				      "records", l, id[i]);
		li->p = p;
		li->cap = MP_MIN(cap, m->cap);
	}
	return 0;
}

/* Which of record y's kept values of layer l is expert e's (its row holds e). */
static uint32_t kept_slot(const struct mp_emap *m, const struct rows *r, uint32_t l, uint32_t y,
			  uint16_t e)
{
	const uint16_t *id = r->id + at(m, l, y);
	uint32_t i = 0;

	while (i + 1 < m->kept && id[i] != e)
		i++;
	return i;
}

/* Takes record y's kept row of layer l out of its lists (the last entry fills each gap). */
static void lists_remove(struct mp_emap *m, struct rows *r, uint32_t l, uint32_t y)
{
	const uint16_t *id = r->id + at(m, l, y);
	const uint32_t *where = r->where + at(m, l, y);

	for (uint32_t i = 0; i < m->kept && id[i] < m->cfg.experts; i++) {
		struct list *li = &r->lists[(size_t)l * m->cfg.experts + id[i]];
		struct post last = li->p[--li->n];

		if (where[i] == li->n)
			continue;
		li->p[where[i]] = last;
		r->where[at(m, l, last.y) + kept_slot(m, r, l, last.y, id[i])] = where[i];
	}
}

static void lists_add(struct mp_emap *m, struct rows *r, uint32_t l, uint32_t y)
{
	const uint16_t *id = r->id + at(m, l, y);
	const float *val = r->val + at(m, l, y);

	for (uint32_t i = 0; i < m->kept && id[i] < m->cfg.experts; i++) {
		struct list *li = &r->lists[(size_t)l * m->cfg.experts + id[i]];

		r->where[at(m, l, y) + i] = li->n;
		li->p[li->n++] = (struct post){ y, val[i] };
	}
}

/*
 * Whether q followed map in m: its trajectory products are m's and the
 * rows it folded in are map's first q->layers (then so are their kept
 * rows and squared norms, which an insert of map can take from q).
 */
static bool followed(const struct mp_emap *m, const struct mp_emap_query *q, const float *map)
{
	return q && q->store == m->id && q->layers &&
	       !memcmp(map, q->rows, (size_t)q->layers * m->cfg.experts * sizeof(*map));
}

/*
 * A map's kept rows (NULL: zeros) into k, with room made in r's lists for
 * them. Returns 0, or -ENOMEM with the store unchanged.
 */
static int keep_map(struct mp_emap *m, struct rows *r, const float *map, struct kept_map *k,
		    const struct mp_emap_query *q)
{
	const uint32_t J = m->cfg.experts, K = m->kept;
	/* The layers a query that followed map has kept already, the same way. */
	const uint32_t from_q = map && followed(m, q, map) ? q->layers : 0;
	int err = 0;

	k->sq = 0;
	for (uint32_t l = 0; !err && l < m->cfg.layers; l++) {
		if (l < from_q) {
			memcpy(k->id + l * K, q->kid + (size_t)l * K, K * sizeof(*k->id));
			memcpy(k->val + l * K, q->kval + (size_t)l * K, K * sizeof(*k->val));
			k->sq = q->ksq[l];
		} else {
			keep_row(map ? map + (size_t)l * J : NULL, J, K, k->id + l * K,
				 k->val + l * K, &k->sq);
		}
		k->prefix_sq[l] = (float)k->sq;
		err = lists_reserve(m, r, l, k->id + l * K);
	}
	return err;
}

/* Writes k as record y's rows in r, and in r's lists instead of what it held. */
static void put_rows(struct mp_emap *m, struct rows *r, uint32_t y, const struct kept_map *k)
{
	for (uint32_t l = 0; l < m->cfg.layers; l++) {
		if (m->gen[y])
			lists_remove(m, r, l, y);
		memcpy(r->id + at(m, l, y), k->id + l * m->kept, m->kept * sizeof(*k->id));
		memcpy(r->val + at(m, l, y), k->val + l * m->kept, m->kept * sizeof(*k->val));
		r->prefix_sq[(size_t)l * m->cap + y] = k->prefix_sq[l];
		lists_add(m, r, l, y);
	}
}

/*
 * The k largest positive values of row, largest first (ties: lower j),
 * NO_EXPERT after: one pass, each value inserted among the k best so far
 * (k is small), an equal value after the lower index already in.
 */
static void row_topk(const float *row, uint32_t J, uint32_t k, uint16_t *ids)
{
	uint32_t n = 0;

	for (uint32_t j = 0; j < J; j++) {
		float v = row[j];
		uint32_t i;

		if (!(v > 0) || (n == k && !(v > row[ids[n - 1]])))
			continue;
		i = n < k ? n++ : n - 1;
		for (; i > 0 && row[ids[i - 1]] < v; i--)
			ids[i] = ids[i - 1];
		ids[i] = (uint16_t)j;
	}
	for (uint32_t i = n; i < k; i++)
		ids[i] = NO_EXPERT;	/* fewer than k experts ran (an all-zero row) */
}

/* Where value i of record y's semantic vector is in m->sem. */
static size_t sem_at(const struct mp_emap *m, uint32_t y, uint32_t i)
{
	return m->sk ? (size_t)y * m->cfg.sem_dim + i : (size_t)i * m->cap + y;
}

/* What searches compare for sem: sem, or its sketch in m->qsk (NULL stays NULL). */
static const float *search_vec(struct mp_emap *m, const float *sem)
{
	if (!m->sk || !sem)
		return sem;
	memset(m->qsk, 0, m->sdim * sizeof(float));
	for (uint32_t i = 0; i < m->cfg.sem_dim; i++) {
		uint32_t b = m->skb[i];

		m->qsk[b & ~0x80000000u] += b & 0x80000000u ? -sem[i] : sem[i];
	}
	return m->qsk;
}

/*
 * Writes record y from a normalised map and its semantic vector (NULL:
 * zeros), with everything derived from them: kept rows and their lists,
 * norms, top-k, a new generation. Returns 0, or -ENOMEM with the record as
 * it was.
 */
static int put_record(struct mp_emap *m, uint32_t y, const float *map, const float *sem,
		      const struct mp_emap_query *q)
{
	const uint32_t L = m->cfg.layers, J = m->cfg.experts, K = m->cfg.topk;
	double s = 0;
	int err;

	err = keep_map(m, &m->maps, map, &m->kmap, q);
	if (!err && m->cfg.sem_is_map)
		err = keep_map(m, &m->ctx, sem, &m->kctx, NULL);
	if (err)
		return err;
	put_rows(m, &m->maps, y, &m->kmap);
	for (uint32_t l = 0; l < L; l++)
		row_topk(map + (size_t)l * J, J, K, m->top + ((size_t)l * m->cap + y) * K);
	if (m->cfg.sem_is_map) {
		put_rows(m, &m->ctx, y, &m->kctx);
		s = m->kctx.sq;
	}
	for (uint32_t i = 0; m->sem && i < m->cfg.sem_dim; i++)
		m->sem[sem_at(m, y, i)] = sem ? sem[i] : 0.0f;
	if (m->sem) {
		const float *v = search_vec(m, sem);

		for (uint32_t i = 0; i < m->sdim; i++) {
			float x = v ? v[i] : 0.0f;

			if (m->sk)
				m->sk[(size_t)i * m->cap + y] = x;
			s += (double)x * x;
		}
	}
	m->sem_norm[y] = (float)sqrt(s);
	if (!++m->writes)
		m->writes = 1;		/* never 0: a query's "none" */
	m->gen[y] = m->writes;
	return 0;
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

/*
 * Kept rows
 */

/* Spreads a kept row over m->qrow (clear: sets those places back to 0). */
static void spread(struct mp_emap *m, const uint16_t *id, const float *val, bool clear)
{
	for (uint32_t i = 0; i < m->kept; i++)
		m->qrow[id[i]] = clear ? 0.0f : val[i];
	m->qrow[m->cfg.experts] = 0.0f;
}

/*
 * acc[y] += (the kept row id/val of layer l) . (record y's), through the
 * lists of the row's experts: only the records that share one, each one's
 * terms in expert order.
 */
static void fold_rows(const struct mp_emap *m, const struct rows *r, uint32_t l,
		      const uint16_t *id, const float *val, double *acc)
{
	for (uint32_t i = 0; i < m->kept && id[i] < m->cfg.experts; i++) {
		const struct list *li = &r->lists[(size_t)l * m->cfg.experts + id[i]];
		/* Read once: acc may alias them as far as the compiler knows (no strict aliasing). */
		const struct post *p = li->p;
		const uint32_t n = li->n;
		const double a = val[i];

		for (uint32_t x = 0; x < n; x++)
			acc[p[x].y] += a * p[x].v;
	}
}

/* As fold_rows() into a fresh w[y] (every record's) and, term by term as well, into acc[y]. */
static void fold_rows_both(const struct mp_emap *m, const struct rows *r, uint32_t l,
			   const uint16_t *id, const float *val, double *w, double *acc)
{
	memset(w, 0, m->count * sizeof(*w));
	for (uint32_t i = 0; i < m->kept && id[i] < m->cfg.experts; i++) {
		const struct list *li = &r->lists[(size_t)l * m->cfg.experts + id[i]];
		double a = val[i];

		for (uint32_t n = 0; n < li->n; n++) {
			double t = a * li->p[n].v;

			w[li->p[n].y] += t;
			acc[li->p[n].y] += t;
		}
	}
}

/* Record y's dot product with map's first `layers` layers as kept, added as fold_rows() does. */
static double record_rows_dot(struct mp_emap *m, const struct rows *r, uint32_t y,
			      const float *map, uint32_t layers)
{
	uint16_t id[MAX_KEPT];
	float val[MAX_KEPT];
	double dot = 0, sq = 0;

	for (uint32_t l = 0; l < layers; l++) {
		const uint16_t *rid = r->id + at(m, l, y);
		const float *rval = r->val + at(m, l, y);

		keep_row(map + (size_t)l * m->cfg.experts, m->cfg.experts, m->kept, id, val, &sq);
		spread(m, id, val, false);
		for (uint32_t i = 0; i < m->kept; i++)
			dot += (double)m->qrow[rid[i]] * rval[i];
		spread(m, id, val, true);
	}
	return dot;
}

/* Keeps row (a map's row l), adding its squares to *sq, and folds it into every record's acc. */
static void fold_map_row(struct mp_emap *m, const struct rows *r, const float *row, uint32_t l,
			 double *acc, double *sq)
{
	uint16_t id[MAX_KEPT];
	float val[MAX_KEPT];

	keep_row(row, m->cfg.experts, m->kept, id, val, sq);
	fold_rows(m, r, l, id, val, acc);
}

/*
 * Dense semantic vectors, by columns
 */

/*
 * Every record's dot product with v (sdim floats), term by term in index
 * order. A zero term is skipped: adding +-0 leaves a sum that is never -0
 * unchanged, so the sums are those of a plain loop. Eight records' sums in
 * one vector through all the terms (the same additions in the same order:
 * the same bits), four such at once.
 */
#ifndef __SANITIZE_THREAD__	/* TSan instruments ifunc resolvers, which run before it is up */
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void sem_dots_cols(double *restrict acc, const float *restrict v, const float *restrict cols,
			  uint32_t dim, uint32_t cap, uint32_t n)
{
	uint32_t y = 0;

	/* 32 records at once: four sums in flight hide an addition's latency. */
	for (; y + 32 <= n; y += 32) {
		v8d s[4] = { { 0 } };

		for (uint32_t i = 0; i < dim; i++) {
			const float *col = cols + (size_t)i * cap + y;
			v8f c[4];

			if (v[i] == 0)
				continue;
			memcpy(c, col, sizeof(c));
			for (uint32_t b = 0; b < 4; b++)
				s[b] += (double)v[i] * __builtin_convertvector(c[b], v8d);
		}
		memcpy(acc + y, s, sizeof(s));
	}
	for (; y + 8 <= n; y += 8) {
		v8d s = { 0 };

		for (uint32_t i = 0; i < dim; i++) {
			v8f c;

			if (v[i] == 0)
				continue;
			memcpy(&c, cols + (size_t)i * cap + y, sizeof(c));
			s += (double)v[i] * __builtin_convertvector(c, v8d);
		}
		memcpy(acc + y, &s, sizeof(s));
	}
	for (; y < n; y++) {
		double s = 0;

		for (uint32_t i = 0; i < dim; i++)
			if (v[i] != 0)
				s += (double)v[i] * cols[(size_t)i * cap + y];
		acc[y] = s;
	}
}

static void sem_dots(const struct mp_emap *m, double *acc, const float *v)
{
	sem_dots_cols(acc, v, m->sk ? m->sk : m->sem, m->sdim, m->cap, m->count);
}

static double record_sem_dot(const struct mp_emap *m, uint32_t y, const float *v)
{
	const float *cols = m->sk ? m->sk : m->sem;
	double dot = 0;

	for (uint32_t i = 0; i < m->sdim; i++)
		dot += (double)v[i] * cols[(size_t)i * m->cap + y];
	return dot;
}

/*
 * Queries
 */

void mp_emap_query_reset(struct mp_emap_query *q)
{
	double *dot = q->sdot;
	uint32_t *gen = q->sgen;

	q->store = 0;
	q->sem_store = 0;
	/* The last iteration's rows, all of them and in order: the new semantic map's products. */
	if (q->next_store && q->next_layers == q->next_full) {
		q->sem_store = q->next_store;
		q->snorm = sqrt(q->next_sq);
		q->sdot = q->ndot;
		q->sgen = q->ngen;
		q->ndot = dot;
		q->ngen = gen;
	}
	q->next_store = 0;
}

void mp_emap_query_fini(struct mp_emap_query *q)
{
	free(q->rows);
	free(q->kid);
	free(q->kval);
	free(q->ksq);
	free(q->dot);
	free(q->gen);
	free(q->sdot);
	free(q->sgen);
	free(q->ndot);
	free(q->ngen);
	memset(q, 0, sizeof(*q));
}

/*
 * Starts products afresh: zero for every record, each belonging to the
 * record's current write; places past the records belong to no write (0),
 * whatever another store or an earlier use left there.
 */
static void products_start(const struct mp_emap *m, const struct mp_emap_query *q, double *dot,
			   uint32_t *gen)
{
	memset(dot, 0, m->count * sizeof(*dot));
	memcpy(gen, m->gen, m->count * sizeof(*gen));
	memset(gen + m->count, 0, (q->cap - m->count) * sizeof(*gen));
}

/* (Re)allocates one of a query's product arrays for cap records. */
static bool grow(void **p, size_t cap, size_t size)
{
	void *n = realloc(*p, cap * size);

	if (n)
		*p = n;
	return n != NULL;
}

static int query_fit(const struct mp_emap *m, struct mp_emap_query *q)
{
	if (q->row_cap < m->lj) {
		const size_t kept = (size_t)m->cfg.layers * MAX_KEPT;

		if (!grow((void **)&q->rows, m->lj, sizeof(*q->rows)) ||
		    !grow((void **)&q->kid, kept, sizeof(*q->kid)) ||
		    !grow((void **)&q->kval, kept, sizeof(*q->kval)) ||
		    !grow((void **)&q->ksq, m->cfg.layers, sizeof(*q->ksq)))
			return mp_err(-ENOMEM, "expert map: no memory for a query of %u layers",
				      m->cfg.layers);
		q->row_cap = m->lj;
		q->store = 0;	/* its rows were another geometry's */
	}
	if (q->cap >= m->cap)
		return 0;
	if (!grow((void **)&q->dot, m->cap, sizeof(double)) ||
	    !grow((void **)&q->gen, m->cap, sizeof(uint32_t)) ||
	    !grow((void **)&q->sdot, m->cap, sizeof(double)) ||
	    !grow((void **)&q->sgen, m->cap, sizeof(uint32_t)) ||
	    !grow((void **)&q->ndot, m->cap, sizeof(double)) ||
	    !grow((void **)&q->ngen, m->cap, sizeof(uint32_t)))
		return mp_err(-ENOMEM, "expert map: no memory for a query of %u records", m->cap);
	q->cap = m->cap;
	q->next_store = 0;
	mp_emap_query_reset(q);
	return 0;
}

/*
 * Brings q's trajectory products up to map's first `prefix` layers: only
 * the rows added since the last call, plus a whole product for each record
 * written since. A prefix that did not grow means the rows were rewritten
 * (a layer gated again): start over.
 */
static int query_traj(struct mp_emap *m, struct mp_emap_query *q, const float *map,
		      uint32_t prefix)
{
	int err = query_fit(m, q);

	if (err)
		return err;
	if (q->store != m->id || prefix <= q->layers) {
		q->store = m->id;
		q->layers = 0;
		q->vsq = 0;
		products_start(m, q, q->dot, q->gen);
	}
	for (uint32_t l = q->layers; l < prefix; l++) {
		const size_t at = (size_t)l * m->cfg.experts;
		uint16_t *id = q->kid + (size_t)l * m->kept;
		float *val = q->kval + (size_t)l * m->kept;

		memcpy(q->rows + at, map + at, m->cfg.experts * sizeof(*q->rows));
		keep_row(map + at, m->cfg.experts, m->kept, id, val, &q->vsq);
		q->ksq[l] = q->vsq;
		fold_rows(m, &m->maps, l, id, val, q->dot);
	}
	for (uint32_t y = 0; q->writes != m->writes && y < m->count; y++) {
		if (q->gen[y] == m->gen[y])
			continue;
		q->dot[y] = record_rows_dot(m, &m->maps, y, map, prefix);
		q->gen[y] = m->gen[y];
	}
	q->writes = m->writes;
	q->layers = prefix;
	return 0;
}

/* Brings q's semantic products with sem (its iteration's vector) up to date. */
static int query_sem(struct mp_emap *m, struct mp_emap_query *q, const float *sem)
{
	const bool map = m->cfg.sem_is_map;
	int err = query_fit(m, q);

	if (err)
		return err;
	if (!map)
		sem = search_vec(m, sem);
	if (q->sem_store != m->id) {
		double sq = 0;

		q->sem_store = m->id;
		products_start(m, q, q->sdot, q->sgen);
		if (map) {
			for (uint32_t l = 0; l < m->cfg.layers; l++)
				fold_map_row(m, &m->ctx, sem + (size_t)l * m->cfg.experts, l,
					     q->sdot, &sq);
		} else {
			sq = sumsq(sem, m->sdim);
			sem_dots(m, q->sdot, sem);
		}
		q->snorm = sqrt(sq);
	}
	for (uint32_t y = 0; y < m->count; y++) {
		if (q->sgen[y] == m->gen[y])
			continue;
		q->sdot[y] = map ? record_rows_dot(m, &m->ctx, y, sem, m->cfg.layers) :
				   record_sem_dot(m, y, sem);
		q->sgen[y] = m->gen[y];
	}
	return 0;
}

/* The query to use: the caller's, or the store's own started afresh. */
static struct mp_emap_query *query_of(struct mp_emap *m, struct mp_emap_query *q)
{
	if (q)
		return q;
	mp_emap_query_reset(&m->tmp);
	return &m->tmp;
}

/* Cosine of a trajectory prefix of squared norm vsq with record y's first `layers` layers. */
static float cos_prefix(const struct mp_emap *m, uint32_t y, double dot, double vsq,
			uint32_t layers)
{
	double ysq = m->maps.prefix_sq[(size_t)(layers - 1) * m->cap + y];

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

/*
 * Starts t (fitted to m) from q's trajectory products when q followed the
 * map the store is given: the rows q folded in are those of norm (the
 * iteration's rows normalised again, most often the same bits). Then only
 * the layers after q's prefix are folded in for the insert, not all of
 * them again: the same terms added in the same order, the same sums.
 */
static void reuse_traj(const struct mp_emap *m, const struct mp_emap_query *q, const float *norm,
		       struct mp_emap_query *t)
{
	const size_t n = (size_t)q->layers * m->cfg.experts, nk = (size_t)q->layers * m->kept;

	if (q->layers >= m->cfg.layers || q->cap < m->cap || !followed(m, q, norm))
		return;
	memcpy(t->rows, q->rows, n * sizeof(*t->rows));
	memcpy(t->kid, q->kid, nk * sizeof(*t->kid));
	memcpy(t->kval, q->kval, nk * sizeof(*t->kval));
	memcpy(t->ksq, q->ksq, q->layers * sizeof(*t->ksq));
	memcpy(t->dot, q->dot, m->count * sizeof(*t->dot));
	memcpy(t->gen, q->gen, m->count * sizeof(*t->gen));
	memset(t->gen + m->count, 0, (t->cap - m->count) * sizeof(*t->gen));
	t->vsq = q->vsq;
	t->layers = q->layers;
	t->writes = q->writes;
	t->store = m->id;
}

/*
 * The record whose RDY against the new map norm (and sem) is highest:
 * FineMoE's victim. q's semantic products are reused when it has them.
 */
static int most_redundant(struct mp_emap *m, struct mp_emap_query *q, const float *norm,
			  const float *sem, uint32_t *victim)
{
	const uint32_t L = m->cfg.layers, d = m->cfg.distance;
	struct mp_emap_query *t = &m->tmp;
	float best = -INFINITY;
	int err;

	mp_emap_query_reset(t);
	err = query_fit(m, t);
	if (!err && q)
		reuse_traj(m, q, norm, t);
	if (!err)
		err = query_traj(m, t, norm, L);
	if (!err && m->cfg.sem_dim && sem) {
		if (!q || q->sem_store != m->id)
			q = t;
		err = query_sem(m, q, sem);
	}
	if (err)
		return err;
	*victim = 0;
	for (uint32_t i = 0; i < m->count; i++) {
		float traj = cos_prefix(m, i, t->dot[i], t->vsq, L);
		float s = !m->cfg.sem_dim ? traj : sem ? cos_sem(m, i, q->sdot[i], q->snorm) : 0;
		/* Without semantic vectors both terms are the trajectory's. */
		float rdy = ((float)d / L) * s + ((float)(L - d) / L) * traj;

		if (rdy > best) {
			best = rdy;
			*victim = i;
		}
	}
	return 0;
}

int mp_emap_insert(struct mp_emap *m, struct mp_emap_query *q, const float *map,
		   const float *sem)
{
	uint32_t y;
	int err;

	if (!m || !map)
		return mp_err(-EINVAL, "expert map: insert without a map");
	for (uint32_t i = 0; sem && i < m->cfg.sem_dim; i++)
		if (!isfinite(sem[i]) || (m->cfg.sem_is_map && sem[i] < 0))
			return mp_err(-EINVAL, "expert map: semantic value %u is %g", i, sem[i]);
	err = normalise_map(m, map, m->row);
	if (err)
		return err;
	if (m->count == m->cap) {
		err = most_redundant(m, q, m->row, sem, &y);
		if (!err)
			err = put_record(m, y, m->row, sem, q);
		if (err)
			return err;
		m->replaced++;
	} else {
		y = m->count;
		err = put_record(m, y, m->row, sem, q);
		if (err)
			return err;
		m->count++;
	}
	m->inserted++;
	return (int)y;
}

int mp_emap_search_sem(struct mp_emap *m, struct mp_emap_query *q, const float *sem,
		       float *score)
{
	float best = -INFINITY;
	int arg = -ENOENT;

	if (!m->count || !m->cfg.sem_dim || !sem)
		return -ENOENT;
	q = query_of(m, q);
	if (query_sem(m, q, sem))
		return -ENOMEM;
	for (uint32_t y = 0; y < m->count; y++) {
		float c = cos_sem(m, y, q->sdot[y], q->snorm);

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
	struct mp_emap_query *q = query_of(m, NULL);
	float best = -INFINITY;
	int arg = -ENOENT;

	if (!m->count || !map || !prefix_layers)
		return -ENOENT;
	if (prefix_layers > m->cfg.layers)
		prefix_layers = m->cfg.layers;
	if (query_traj(m, q, map, prefix_layers))
		return -ENOMEM;
	for (uint32_t y = 0; y < m->count; y++) {
		float c = cos_prefix(m, y, q->dot[y], q->vsq, prefix_layers);

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
	const uint16_t *ids = m->top + ((size_t)layer * m->cap + y) * m->cfg.topk;

	for (uint32_t i = 0; i < m->cfg.topk && ids[i] != NO_EXPERT; i++)
		acc[ids[i]] += w;
}

/*
 * out[j] = (k/J + sum_y w_y [j in top-k of y's row]) / (1 + sum_y w_y): the
 * pseudo-record keeps every probability above zero and is all there is for
 * an empty store or a context no record shares.
 */
#ifndef __SANITIZE_THREAD__	/* TSan instruments ifunc resolvers, which run before it is up */
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void finish_use(const struct mp_emap *m, const double *acc, double wsum, float *out)
{
	const uint32_t J = m->cfg.experts, k = m->cfg.topk;
	const double prior = (double)k / J, den = 1.0 + wsum;
	uint32_t j = 0;

	/* Eight at a time: the same divisions, a register each (two with AVX2). */
	for (; j + 8 <= J; j += 8) {
		v8d a;
		v8f o;

		memcpy(&a, acc + j, sizeof(a));
		o = __builtin_convertvector((prior + a) / den, v8f);
		memcpy(out + j, &o, sizeof(o));
	}
	for (; j < J; j++)
		out[j] = (float)((prior + acc[j]) / den);
}

/*
 * Folds ctx, row `layer` of q's iteration's map, into every record's product
 * with the semantic map of q's next iteration, writing the row's own product
 * with each record's row to w. Layers must come in order from 0; otherwise
 * the products are dropped (and computed afresh when needed).
 */
static void fold_next(struct mp_emap *m, struct mp_emap_query *q, uint32_t layer,
		      const float *ctx, double *w)
{
	uint16_t id[MAX_KEPT];
	float val[MAX_KEPT];
	double sq = 0;

	if (layer == 0) {
		q->next_store = m->id;
		q->next_layers = 0;
		q->next_sq = 0;
		q->next_full = m->cfg.layers;
		products_start(m, q, q->ndot, q->ngen);
	}
	if (q->next_store != m->id || q->next_layers != layer) {
		q->next_store = 0;
		memset(w, 0, m->count * sizeof(*w));
		fold_map_row(m, &m->ctx, ctx, layer, w, &sq);
		return;
	}
	keep_row(ctx, m->cfg.experts, m->kept, id, val, &q->next_sq);
	fold_rows_both(m, &m->ctx, layer, id, val, w, q->ndot);
	q->next_layers++;
}

int mp_emap_predict_layer(struct mp_emap *m, struct mp_emap_query *q, uint32_t layer,
			  const float *ctx, float *out)
{
	const uint32_t J = m->cfg.experts;
	double acc[MP_MAX_PREDICT_EXPERTS] = { 0 }, wsum = 0, sq = 0;
	double *w;

	if (!ctx || layer >= m->cfg.layers || !m->cfg.sem_is_map || J > MP_MAX_PREDICT_EXPERTS)
		return -EINVAL;
	if (query_fit(m, &m->tmp) || (q && query_fit(m, q)))
		return -ENOMEM;
	/* The store's own trajectory products make room for the row's. */
	mp_emap_query_reset(&m->tmp);
	w = m->tmp.dot;
	if (q) {
		fold_next(m, q, layer, ctx, w);
	} else {
		memset(w, 0, m->count * sizeof(*w));
		fold_map_row(m, &m->ctx, ctx, layer, w, &sq);
	}
	for (uint32_t y = 0; y < m->count; y++) {
		if (!(w[y] > 0))
			continue;
		wsum += w[y];
		vote(m, y, layer, w[y], acc);
	}
	finish_use(m, acc, wsum, out);
	m->searches++;
	return 0;
}

/*
 * The MP_EMAP_NEIGHBOURS records of highest positive cosine, by decreasing
 * cosine, equal ones by increasing index: the records a pass in index
 * order keeps, whatever order they are offered in.
 */
struct neighbours {
	uint32_t n;
	uint32_t y[MP_EMAP_NEIGHBOURS];
	float c[MP_EMAP_NEIGHBOURS];
};

/* Whether record y of cosine c goes before record y2 of cosine c2. */
static bool ranks_before(float c, uint32_t y, float c2, uint32_t y2)
{
	return c > c2 || (c == c2 && y < y2);
}

static void neighbour_add(struct neighbours *nb, uint32_t y, float c)
{
	uint32_t i;

	if (!(c > 0) || (nb->n == MP_EMAP_NEIGHBOURS &&
			 !ranks_before(c, y, nb->c[nb->n - 1], nb->y[nb->n - 1])))
		return;
	/* Insertion: n is small. */
	i = nb->n < MP_EMAP_NEIGHBOURS ? nb->n++ : nb->n - 1;
	for (; i > 0 && ranks_before(c, y, nb->c[i - 1], nb->y[i - 1]); i--) {
		nb->y[i] = nb->y[i - 1];
		nb->c[i] = nb->c[i - 1];
	}
	nb->y[i] = y;
	nb->c[i] = c;
}

static bool neighbour_has(const struct neighbours *nb, uint32_t y)
{
	for (uint32_t i = 0; i < nb->n; i++)
		if (nb->y[i] == y)
			return true;
	return false;
}

/*
 * Turning records away without their cosine: once the neighbours are
 * found, a record whose cosine num / den is below the last one's t by a
 * margin far above a float's rounding (1e-6 against 6e-8) certainly rounds
 * to a float below t, and neighbour_add() would turn it away. No square
 * root or division for them, most records; the others are judged by their
 * cosine as before, so the neighbours are the same.
 */
#define BELOW_MARGIN (1 - 1e-6)

/* t^2 vsq x margin, t the last neighbour's cosine, once they are all found (else 0: no bar). */
static double traj_bar(const struct neighbours *nb, double vsq)
{
	double t = nb->n == MP_EMAP_NEIGHBOURS ? nb->c[nb->n - 1] : 0.0;

	return t * t * vsq * BELOW_MARGIN;
}

/*
 * The trajectory neighbours of q's prefix of `layers` layers, starting
 * from the last search's (q->nb_y: most often still among the nearest,
 * they set a high bar at once). Then a record sharing nothing with the
 * prefix (product 0) never is one, and the others are first compared by
 * dot^2 against (t^2 vsq) x their prefix's squared norm: a load, two
 * multiplications and two well-predicted branches for most records.
 */
static void traj_neighbours(const struct mp_emap *m, struct mp_emap_query *q, uint32_t layers,
			    struct neighbours *nb)
{
	const float *ysq = m->maps.prefix_sq + (size_t)(layers - 1) * m->cap;
	const double *dot = q->dot;
	double f;	/* the bar: traj_bar() */

	for (uint32_t i = 0; i < q->nb_n; i++) {
		uint32_t y = q->nb_y[i];

		if (y < m->count && dot[y] > 0 && !neighbour_has(nb, y))
			neighbour_add(nb, y, cos_prefix(m, y, dot[y], q->vsq, layers));
	}
	f = traj_bar(nb, q->vsq);
	for (uint32_t y = 0; y < m->count; y++) {
		const double d = dot[y];

		if (!(d > 0) || d * d < f * ysq[y] || neighbour_has(nb, y))
			continue;
		neighbour_add(nb, y, cos_prefix(m, y, d, q->vsq, layers));
		f = traj_bar(nb, q->vsq);
	}
	q->nb_n = nb->n;
	memcpy(q->nb_y, nb->y, nb->n * sizeof(*nb->y));
}

/* The semantic neighbours of q's vector: as traj_neighbours(), without the squares. */
static void sem_neighbours(const struct mp_emap *m, const struct mp_emap_query *q,
			   struct neighbours *nb)
{
	for (uint32_t y = 0; y < m->count; y++) {
		double dot = q->sdot[y];

		if (!(dot > 0))
			continue;
		if (nb->n == MP_EMAP_NEIGHBOURS &&
		    dot < (double)nb->c[nb->n - 1] * q->snorm * m->sem_norm[y] * BELOW_MARGIN)
			continue;
		neighbour_add(nb, y, cos_sem(m, y, dot, q->snorm));
	}
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

int mp_emap_predict_traj_n(struct mp_emap *m, struct mp_emap_query *q, const float *map,
			   uint32_t prefix_layers, uint32_t target, uint32_t n, float *out,
			   float *score)
{
	struct neighbours nb = { 0 };

	if (!map || !prefix_layers || prefix_layers > m->cfg.layers || !n ||
	    target >= m->cfg.layers || n > m->cfg.layers - target ||
	    m->cfg.experts > MP_MAX_PREDICT_EXPERTS)
		return -EINVAL;
	q = query_of(m, q);
	if (query_traj(m, q, map, prefix_layers))
		return -ENOMEM;
	traj_neighbours(m, q, prefix_layers, &nb);
	for (uint32_t i = 0; i < n; i++)
		neighbour_vote(m, &nb, target + i, out + (size_t)i * m->cfg.experts);
	if (score)
		*score = nb.n ? nb.c[0] : 0.0f;
	m->searches++;
	return 0;
}

int mp_emap_predict_traj(struct mp_emap *m, struct mp_emap_query *q, const float *map,
			 uint32_t prefix_layers, uint32_t target, float *out, float *score)
{
	return mp_emap_predict_traj_n(m, q, map, prefix_layers, target, 1, out, score);
}

int mp_emap_predict_sem(struct mp_emap *m, struct mp_emap_query *q, const float *sem,
			float *out, float *score)
{
	const uint32_t J = m->cfg.experts;
	struct neighbours nb = { 0 };

	if (!sem || !out || !m->cfg.sem_dim || J > MP_MAX_PREDICT_EXPERTS)
		return -EINVAL;
	q = query_of(m, q);
	if (query_sem(m, q, sem))
		return -ENOMEM;
	sem_neighbours(m, q, &nb);
	for (uint32_t l = 0; l < m->cfg.layers; l++)
		neighbour_vote(m, &nb, l, out + (size_t)l * J);
	if (score)
		*score = nb.n ? nb.c[0] : 0.0f;
	m->searches++;
	return 0;
}

/* Record y's kept rows of r, spread out into dense (layers x experts floats). */
static void get_rows(const struct mp_emap *m, const struct rows *r, uint32_t y, float *dense)
{
	memset(dense, 0, m->lj * sizeof(float));
	for (uint32_t l = 0; l < m->cfg.layers; l++) {
		const uint16_t *id = r->id + at(m, l, y);
		const float *val = r->val + at(m, l, y);

		for (uint32_t i = 0; i < m->kept && id[i] < m->cfg.experts; i++)
			dense[(size_t)l * m->cfg.experts + id[i]] = val[i];
	}
}

int mp_emap_record(const struct mp_emap *m, uint32_t idx, float *map, float *sem)
{
	if (idx >= m->count)
		return -ENOENT;
	if (map)
		get_rows(m, &m->maps, idx, map);
	if (sem && m->cfg.sem_is_map)
		get_rows(m, &m->ctx, idx, sem);
	for (uint32_t i = 0; sem && m->sem && i < m->cfg.sem_dim; i++)
		sem[i] = m->sem[sem_at(m, idx, i)];
	return 0;
}

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
		err = put_record(m, y, map, map + m->lj, NULL);
		if (err)
			goto free_payload;
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

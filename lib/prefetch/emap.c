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

struct mp_emap {
	struct mp_emap_config cfg;
	uint32_t lj;		/* floats of one map */
	uint32_t count;
	float *maps;		/* [capacity][lj] */
	float *sem;		/* [capacity][sem_dim] */
	float *sem_norm;	/* [capacity] */
	float *prefix_sq;	/* [capacity][layers]: sum of squares of layers 0..l */
	float *scratch;		/* [capacity] RDY scores */
	uint64_t inserted;
	uint64_t replaced;
	uint64_t searches;
};

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

int mp_emap_create(const struct mp_emap_config *cfg, struct mp_emap **out)
{
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
	cap = m->cfg.capacity;
	m->lj = cfg->layers * cfg->experts;
	m->maps = calloc(cap * m->lj, sizeof(float));
	m->sem = calloc(cap * (cfg->sem_dim ? cfg->sem_dim : 1), sizeof(float));
	m->sem_norm = calloc(cap, sizeof(float));
	m->prefix_sq = calloc(cap * cfg->layers, sizeof(float));
	m->scratch = calloc(cap, sizeof(float));
	if (!m->maps || !m->sem || !m->sem_norm || !m->prefix_sq || !m->scratch) {
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
	free(m->scratch);
	free(m);
}

const struct mp_emap_config *mp_emap_config(const struct mp_emap *m)
{
	return &m->cfg;
}

void mp_emap_stats(const struct mp_emap *m, struct mp_emap_stats *out)
{
	size_t cap = m->cfg.capacity;

	out->count = m->count;
	out->capacity = m->cfg.capacity;
	out->inserted = m->inserted;
	out->replaced = m->replaced;
	out->searches = m->searches;
	out->bytes = sizeof(*m) + cap * sizeof(float) *
		     ((uint64_t)m->lj + (m->cfg.sem_dim ? m->cfg.sem_dim : 1) + 2 + m->cfg.layers);
}

/* Recomputes the derived norms of record y after its data changed. */
static void index_record(struct mp_emap *m, uint32_t y)
{
	const float *map = m->maps + (size_t)y * m->lj;
	float *pre = m->prefix_sq + (size_t)y * m->cfg.layers;
	double acc = 0, s = 0;

	for (uint32_t l = 0; l < m->cfg.layers; l++) {
		for (uint32_t j = 0; j < m->cfg.experts; j++)
			acc += (double)map[l * m->cfg.experts + j] * map[l * m->cfg.experts + j];
		pre[l] = (float)acc;
	}
	for (uint32_t i = 0; i < m->cfg.sem_dim; i++) {
		float v = m->sem[(size_t)y * m->cfg.sem_dim + i];

		s += (double)v * v;
	}
	m->sem_norm[y] = (float)sqrt(s);
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

/* Dot products of vector v (n floats, stride) against every record's first n floats. */
static float cos_prefix(const struct mp_emap *m, uint32_t y, const float *v, double vsq,
			uint32_t layers)
{
	const float *map = m->maps + (size_t)y * m->lj;
	uint32_t n = layers * m->cfg.experts;
	double dot = 0, ysq = m->prefix_sq[(size_t)y * m->cfg.layers + layers - 1];

	if (vsq <= 0 || ysq <= 0)
		return 0.0f;
	for (uint32_t i = 0; i < n; i++)
		dot += (double)v[i] * map[i];
	return (float)(dot / sqrt(vsq * ysq));
}

static float cos_sem(const struct mp_emap *m, uint32_t y, const float *v, double vnorm)
{
	const float *s = m->sem + (size_t)y * m->cfg.sem_dim;
	double dot = 0;

	if (vnorm <= 0 || m->sem_norm[y] <= 0)
		return 0.0f;
	for (uint32_t i = 0; i < m->cfg.sem_dim; i++)
		dot += (double)v[i] * s[i];
	return (float)(dot / (vnorm * m->sem_norm[y]));
}

static double sumsq(const float *v, uint32_t n)
{
	double s = 0;

	for (uint32_t i = 0; i < n; i++)
		s += (double)v[i] * v[i];
	return s;
}

int mp_emap_insert(struct mp_emap *m, const float *map, const float *sem)
{
	float *tmp;
	uint32_t y;
	int err;

	if (!m || !map)
		return mp_err(-EINVAL, "expert map: insert without a map");
	tmp = m->maps + (size_t)(m->count < m->cfg.capacity ? m->count : 0) * m->lj;
	/* Normalise into a scratch copy first when full: the victim is not known yet. */
	if (m->count == m->cfg.capacity) {
		const uint32_t L = m->cfg.layers, d = m->cfg.distance;
		float *norm = malloc(m->lj * sizeof(float));
		double nsq, snorm;
		float best = -INFINITY;

		if (!norm)
			return -ENOMEM;
		err = normalise_map(m, map, norm);
		if (err) {
			free(norm);
			return err;
		}
		nsq = sumsq(norm, m->lj);
		snorm = sem ? sqrt(sumsq(sem, m->cfg.sem_dim)) : 0;
		y = 0;
		for (uint32_t i = 0; i < m->count; i++) {
			float traj = cos_prefix(m, i, norm, nsq, L);
			float s = m->cfg.sem_dim ? cos_sem(m, i, sem ? sem : norm, snorm) : traj;
			/* Without semantic vectors both terms are the trajectory's. */
			float rdy = ((float)d / L) * s + ((float)(L - d) / L) * traj;

			if (rdy > best) {
				best = rdy;
				y = i;
			}
		}
		memcpy(m->maps + (size_t)y * m->lj, norm, m->lj * sizeof(float));
		free(norm);
		m->replaced++;
	} else {
		err = normalise_map(m, map, tmp);
		if (err)
			return err;
		y = m->count++;
	}
	if (m->cfg.sem_dim) {
		float *dst = m->sem + (size_t)y * m->cfg.sem_dim;

		if (sem)
			memcpy(dst, sem, m->cfg.sem_dim * sizeof(float));
		else
			memset(dst, 0, m->cfg.sem_dim * sizeof(float));
	}
	index_record(m, y);
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
	for (uint32_t y = 0; y < m->count; y++) {
		float c = cos_sem(m, y, sem, vnorm);

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
	double vsq;
	int arg = -ENOENT;

	if (!m->count || !map || !prefix_layers)
		return -ENOENT;
	if (prefix_layers > m->cfg.layers)
		prefix_layers = m->cfg.layers;
	vsq = sumsq(map, prefix_layers * m->cfg.experts);
	for (uint32_t y = 0; y < m->count; y++) {
		float c = cos_prefix(m, y, map, vsq, prefix_layers);

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

/* Adds w to acc[j] for each of the k largest values of row (ties: lower j first). */
static void add_topk(const float *row, uint32_t J, uint32_t k, double w, double *acc)
{
	uint32_t taken[MP_MAX_TOPK];

	for (uint32_t i = 0; i < k; i++) {
		uint32_t best = J;

		for (uint32_t j = 0; j < J; j++) {
			bool used = false;

			for (uint32_t t = 0; t < i; t++)
				used |= taken[t] == j;
			if (!used && row[j] > 0 && (best == J || row[j] > row[best]))
				best = j;
		}
		if (best == J)
			return;		/* fewer than k experts ran (an all-zero row) */
		taken[i] = best;
		acc[best] += w;
	}
}

/*
 * out[j] = (k/J + sum_y w_y [j in top-k of y's row]) / (1 + sum_y w_y): the
 * pseudo-record keeps every probability above zero and is all there is for
 * an empty store or a context no record shares.
 */
static void finish_use(const double *acc, double wsum, uint32_t J, uint32_t k, float *out)
{
	for (uint32_t j = 0; j < J; j++)
		out[j] = (float)(((double)k / J + acc[j]) / (1.0 + wsum));
}

int mp_emap_predict_layer(struct mp_emap *m, uint32_t layer, const float *ctx, uint32_t offset,
			  uint32_t k, float *out)
{
	const uint32_t J = m->cfg.experts;
	double acc[MP_MAX_PREDICT_EXPERTS] = { 0 }, wsum = 0;

	if (!ctx || layer >= m->cfg.layers || !m->cfg.sem_dim || !k || k > MP_MAX_TOPK ||
	    k > J || J > MP_MAX_PREDICT_EXPERTS || (uint64_t)offset + J > m->cfg.sem_dim)
		return -EINVAL;
	for (uint32_t y = 0; y < m->count; y++) {
		const float *c = m->sem + (size_t)y * m->cfg.sem_dim + offset;
		double w = 0;

		for (uint32_t j = 0; j < J; j++)
			w += (double)ctx[j] * c[j];
		if (!(w > 0))
			continue;
		wsum += w;
		add_topk(m->maps + (size_t)y * m->lj + (size_t)layer * J, J, k, w, acc);
	}
	finish_use(acc, wsum, J, k, out);
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
			   uint32_t k, float *out)
{
	const uint32_t J = m->cfg.experts;
	double acc[MP_MAX_PREDICT_EXPERTS] = { 0 }, wsum = 0;

	for (uint32_t i = 0; i < nb->n; i++) {
		wsum += nb->c[i];
		add_topk(m->maps + (size_t)nb->y[i] * m->lj + (size_t)target * J, J, k, nb->c[i],
			 acc);
	}
	finish_use(acc, wsum, J, k, out);
}

int mp_emap_predict_traj(struct mp_emap *m, const float *map, uint32_t prefix_layers,
			 uint32_t target, uint32_t k, float *out, float *score)
{
	const uint32_t J = m->cfg.experts;
	struct neighbours nb = { 0 };
	double vsq;

	if (!map || !prefix_layers || prefix_layers > m->cfg.layers || target >= m->cfg.layers ||
	    !k || k > MP_MAX_TOPK || k > J || J > MP_MAX_PREDICT_EXPERTS)
		return -EINVAL;
	vsq = sumsq(map, prefix_layers * J);
	for (uint32_t y = 0; y < m->count; y++)
		neighbour_add(&nb, y, cos_prefix(m, y, map, vsq, prefix_layers));
	neighbour_vote(m, &nb, target, k, out);
	if (score)
		*score = nb.n ? nb.c[0] : 0.0f;
	m->searches++;
	return 0;
}

int mp_emap_predict_sem(struct mp_emap *m, const float *sem, uint32_t k, float *out,
			float *score)
{
	const uint32_t J = m->cfg.experts;
	struct neighbours nb = { 0 };
	double vnorm;

	if (!sem || !out || !m->cfg.sem_dim || !k || k > MP_MAX_TOPK || k > J ||
	    J > MP_MAX_PREDICT_EXPERTS)
		return -EINVAL;
	vnorm = sqrt(sumsq(sem, m->cfg.sem_dim));
	for (uint32_t y = 0; y < m->count; y++)
		neighbour_add(&nb, y, cos_sem(m, y, sem, vnorm));
	for (uint32_t l = 0; l < m->cfg.layers; l++)
		neighbour_vote(m, &nb, l, k, out + (size_t)l * J);
	if (score)
		*score = nb.n ? nb.c[0] : 0.0f;
	m->searches++;
	return 0;
}

const float *mp_emap_layer(const struct mp_emap *m, uint32_t idx, uint32_t layer)
{
	if (idx >= m->count || layer >= m->cfg.layers)
		return NULL;
	return m->maps + (size_t)idx * m->lj + (size_t)layer * m->cfg.experts;
}

const float *mp_emap_sem(const struct mp_emap *m, uint32_t idx)
{
	if (idx >= m->count || !m->cfg.sem_dim)
		return NULL;
	return m->sem + (size_t)idx * m->cfg.sem_dim;
}

/*
 * File
 */

static int payload_sum(const struct mp_emap *m, uint32_t count, uint64_t *sum)
{
	/* Records are hashed as written: the map, then the semantic vector, record by record. */
	size_t rec = ((size_t)m->lj + m->cfg.sem_dim) * sizeof(float);
	float *buf = malloc(rec * (count ? count : 1));

	if (!buf)
		return mp_err(-ENOMEM, "expert map: no memory to checksum %u records", count);
	for (uint32_t y = 0; y < count; y++) {
		memcpy((char *)buf + y * rec, m->maps + (size_t)y * m->lj, m->lj * sizeof(float));
		memcpy((char *)buf + y * rec + m->lj * sizeof(float),
		       m->sem + (size_t)y * m->cfg.sem_dim, m->cfg.sem_dim * sizeof(float));
	}
	*sum = mp_checksum(buf, rec * count);
	free(buf);
	return 0;
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
	err = payload_sum(m, m->count, &h.payload_sum);
	if (err)
		return err;
	h.header_sum = mp_checksum(&h, offsetof(struct emap_header, header_sum));

	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return mp_err(-errno, "expert map %s: create: %s", tmp, strerror(errno));
	err = write_all(fd, &h, sizeof(h), tmp);
	for (uint32_t y = 0; !err && y < m->count; y++) {
		err = write_all(fd, m->maps + (size_t)y * m->lj, m->lj * sizeof(float), tmp);
		if (!err && m->cfg.sem_dim)
			err = write_all(fd, m->sem + (size_t)y * m->cfg.sem_dim,
					m->cfg.sem_dim * sizeof(float), tmp);
	}
	if (!err && fsync(fd))
		err = mp_err(-errno, "expert map %s: fsync: %s", tmp, strerror(errno));
	close(fd);
	if (!err && rename(tmp, path))
		err = mp_err(-errno, "expert map %s: rename: %s", path, strerror(errno));
	if (err)
		unlink(tmp);
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
		memcpy(m->maps + (size_t)y * m->lj, payload + y * rec, m->lj * sizeof(float));
		memcpy(m->sem + (size_t)y * cfg->sem_dim, payload + y * rec + m->lj * sizeof(float),
		       cfg->sem_dim * sizeof(float));
	}
	m->count = keep;
	for (uint32_t y = 0; y < keep; y++) {
		for (uint32_t i = 0; i < m->lj; i++) {
			float v = m->maps[(size_t)y * m->lj + i];

			if (!(v >= 0 && v <= 1.0001f)) {
				err = mp_err(-EBADMSG, "expert map %s: offset %llu: gate value %g "
					     "out of [0, 1]", path,
					     (unsigned long long)(sizeof(h) + y * rec + i * 4), v);
				goto free_payload;
			}
		}
		index_record(m, y);
	}
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

// SPDX-License-Identifier: MIT
/* Multi-MoE's Algorithm 1: expert distances between model variants, the ranking, the owners. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/consolidate.h>

#include "base/base.h"
#include "store/consolidate_priv.h"

/* Elements of each expert converted to f32 at a time (64 KiB per model). */
#define DIST_CHUNK	16384u
/* Squares are summed in f32 over blocks this long, the blocks in double. */
#define DIST_BLOCK	256u

/* Raw experts of k models and their f32 chunks; acc[] the squared sums of their pairs. */
struct dist_work {
	uint32_t k;
	enum mp_dtype dtype;
	uint64_t elems;
	uint64_t expert_bytes;
	uint8_t **raw;
	float **f32;
	double *acc;
};

static void work_free(struct dist_work *w)
{
	for (uint32_t i = 0; i < w->k && w->raw; i++)
		free(w->raw[i]);
	for (uint32_t i = 0; i < w->k && w->f32; i++)
		free(w->f32[i]);
	free(w->raw);
	free(w->f32);
	free(w->acc);
}

static int work_init(struct dist_work *w, struct mp_store *s, uint32_t k)
{
	const struct mp_geometry *g = mp_store_geometry(s);
	bool ok;

	memset(w, 0, sizeof(*w));
	w->k = k;
	w->dtype = g->dtype;
	w->expert_bytes = mp_store_expert_bytes(s);
	w->elems = w->expert_bytes / mp_dtype_size(g->dtype);
	w->raw = calloc(k, sizeof(*w->raw));
	w->f32 = calloc(k, sizeof(*w->f32));
	w->acc = calloc((size_t)k * (k - 1) / 2 + 1, sizeof(*w->acc));
	ok = w->raw && w->f32 && w->acc;
	for (uint32_t i = 0; ok && i < k; i++) {
		w->raw[i] = malloc(w->expert_bytes);
		w->f32[i] = malloc(DIST_CHUNK * sizeof(float));
		ok = w->raw[i] && w->f32[i];
	}
	if (ok)
		return 0;
	work_free(w);
	return mp_err(-ENOMEM, "%s: out of memory for %u experts of %llu bytes", mp_store_path(s),
		      k, (unsigned long long)w->expert_bytes);
}

/* Sum of (a - b)^2: f32 lanes over short blocks (so the compiler vectorises), blocks in double. */
static double sum_sq_diff(const float *a, const float *b, size_t n)
{
	double total = 0;
	size_t i = 0;

	for (; i + DIST_BLOCK <= n; i += DIST_BLOCK) {
		float lane[8] = { 0 };

		for (size_t k = i; k < i + DIST_BLOCK; k += 8)
			for (size_t j = 0; j < 8; j++) {
				float d = a[k + j] - b[k + j];

				lane[j] += d * d;
			}
		for (size_t j = 0; j < 8; j++)
			total += lane[j];
	}
	for (; i < n; i++) {
		double d = (double)a[i] - (double)b[i];

		total += d * d;
	}
	return total;
}

/* acc[pair] = squared L2 distance between the k raw experts, for every pair (i < j). */
static void pair_sums(struct dist_work *w)
{
	size_t esize = mp_dtype_size(w->dtype);
	uint32_t pairs = w->k * (w->k - 1) / 2;

	memset(w->acc, 0, pairs * sizeof(*w->acc));
	for (uint64_t off = 0; off < w->elems; off += DIST_CHUNK) {
		size_t len = (size_t)MP_MIN((uint64_t)DIST_CHUNK, w->elems - off);
		uint32_t p = 0;

		for (uint32_t i = 0; i < w->k; i++)
			mp_dtype_to_f32(w->dtype, w->raw[i] + off * esize, w->f32[i], len);
		for (uint32_t i = 0; i < w->k; i++)
			for (uint32_t j = i + 1; j < w->k; j++)
				w->acc[p++] += sum_sq_diff(w->f32[i], w->f32[j], len);
	}
}

/*
 * Geometry: every field must match, named with both files when one does not
 */

static int check_geometry(struct mp_store *a, struct mp_store *b)
{
	const struct mp_geometry *x = mp_store_geometry(a), *y = mp_store_geometry(b);
	static const struct {
		const char *name;
		size_t off;
	} fields[] = {
#define FIELD(f) { #f, offsetof(struct mp_geometry, f) }
		FIELD(layers), FIELD(experts), FIELD(topk), FIELD(hidden), FIELD(ffn),
		FIELD(heads), FIELD(kv_heads), FIELD(head_dim), FIELD(vocab), FIELD(max_seq),
#undef FIELD
	};

	for (size_t i = 0; i < MP_ARRAY_SIZE(fields); i++) {
		uint32_t u, v;

		memcpy(&u, (const char *)x + fields[i].off, sizeof(u));
		memcpy(&v, (const char *)y + fields[i].off, sizeof(v));
		if (u != v)
			return mp_err(-EINVAL, "%s and %s differ in geometry: %s %u vs %u",
				      mp_store_path(a), mp_store_path(b), fields[i].name, u, v);
	}
	if (x->dtype != y->dtype)
		return mp_err(-EINVAL, "%s and %s differ in geometry: dtype %s vs %s",
			      mp_store_path(a), mp_store_path(b), mp_dtype_name(x->dtype),
			      mp_dtype_name(y->dtype));
	if (x->rope_theta != y->rope_theta || x->norm_eps != y->norm_eps)
		return mp_err(-EINVAL, "%s and %s differ in geometry: %s %g vs %g",
			      mp_store_path(a), mp_store_path(b),
			      x->rope_theta != y->rope_theta ? "rope_theta" : "norm_eps",
			      x->rope_theta != y->rope_theta ? x->rope_theta : x->norm_eps,
			      x->rope_theta != y->rope_theta ? y->rope_theta : y->norm_eps);
	return 0;
}

static int check_inputs(struct mp_store *const *models, uint32_t n, uint32_t capacity)
{
	const struct mp_geometry *g;
	int err;

	if (!models || !n || n > MP_CONSOL_MAX_MODELS)
		return mp_err(-EINVAL, "consolidation of %u models: between 1 and %u", n,
			      MP_CONSOL_MAX_MODELS);
	g = mp_store_geometry(models[0]);
	if (capacity > g->layers * g->experts)
		return mp_err(-EINVAL, "capacity %u exceeds the %u x %u = %u positions of %s",
			      capacity, g->layers, g->experts, g->layers * g->experts,
			      mp_store_path(models[0]));
	for (uint32_t i = 1; i < n; i++) {
		err = check_geometry(models[0], models[i]);
		if (err)
			return err;
		for (uint32_t j = 0; j < i; j++)
			if (mp_store_identity(models[i]) == mp_store_identity(models[j]))
				return mp_err(-EINVAL, "%s and %s are the same model (identity "
					      "%016llx): consolidate different models",
					      mp_store_path(models[j]), mp_store_path(models[i]),
					      (unsigned long long)mp_store_identity(models[i]));
	}
	return 0;
}

/*
 * The map in memory
 */

int mpc_alloc_tables(struct mp_consolidation *c)
{
	c->models = calloc(c->n, sizeof(*c->models));
	c->pos = calloc(c->n_positions, sizeof(*c->pos));
	c->pairs = calloc((size_t)c->n_pairs * c->n_positions + 1, sizeof(*c->pairs));
	if (c->models && c->pos && c->pairs)
		return 0;
	return mp_err(-ENOMEM, "out of memory for a map of %u models x %u positions", c->n,
		      c->n_positions);
}

double mpc_pair_sum(const struct mp_consolidation *c, uint32_t p)
{
	double sum = 0;

	for (uint32_t k = 0; k < c->n_pairs; k++)
		sum += c->pairs[(size_t)k * c->n_positions + p];
	return sum;
}

struct ranked {
	double distance;
	uint32_t p;
};

static int cmp_ranked(const void *x, const void *y)
{
	const struct ranked *a = x, *b = y;

	if (a->distance != b->distance)
		return a->distance < b->distance ? -1 : 1;
	return a->p < b->p ? -1 : a->p > b->p;
}

int mpc_rank(const struct mp_consolidation *c, uint32_t *rank, int32_t *owner)
{
	struct ranked *v = malloc(c->n_positions * sizeof(*v));

	if (!v)
		return mp_err(-ENOMEM, "out of memory ranking %u positions", c->n_positions);
	for (uint32_t p = 0; p < c->n_positions; p++)
		v[p] = (struct ranked){ c->pos[p].distance, p };
	qsort(v, c->n_positions, sizeof(*v), cmp_ranked);
	for (uint32_t r = 0; r < c->n_positions; r++) {
		rank[v[r].p] = r + 1;
		owner[v[r].p] = r < c->capacity ? (int32_t)(r % c->n) : MP_CONSOL_NONE;
	}
	free(v);
	return 0;
}

/* True when every model's expert at (layer, expert) has one checksum: the same bytes. */
static bool same_bytes(struct mp_store *const *models, uint32_t n, uint32_t layer,
		       uint32_t expert)
{
	uint64_t sum = mp_store_expert(models[0], layer, expert)->checksum;

	for (uint32_t i = 1; i < n; i++)
		if (mp_store_expert(models[i], layer, expert)->checksum != sum)
			return false;
	return true;
}

/*
 * Reads position p's expert from every model and fills the pair table's
 * column p. Experts of one checksum everywhere (a fine-tune that left them
 * alone) are at distance 0 and are not read.
 */
static int position_distances(struct mp_consolidation *c, struct mp_store *const *models,
			      struct dist_work *w, uint32_t p)
{
	uint32_t layer = p / c->experts, expert = p % c->experts;

	if (same_bytes(models, c->n, layer, expert))
		return 0;
	for (uint32_t i = 0; i < c->n; i++) {
		int err = mp_store_read_expert(models[i], layer, expert, w->raw[i]);

		if (err)
			return err;
	}
	pair_sums(w);
	for (uint32_t k = 0; k < c->n_pairs; k++)
		c->pairs[(size_t)k * c->n_positions + p] = sqrt(w->acc[k]);
	c->pos[p].distance = mpc_pair_sum(c, p);
	if (!isfinite(c->pos[p].distance))
		return mp_err(-EINVAL, "layer %u expert %u: the distance between the models is not "
			      "finite (a weight is inf or NaN)", layer, expert);
	return 0;
}

static int compute_distances(struct mp_consolidation *c, struct mp_store *const *models,
			     void (*progress)(uint64_t, uint64_t, void *), void *arg)
{
	struct dist_work w;
	int err = work_init(&w, models[0], c->n);

	if (err)
		return err;
	for (uint32_t p = 0; !err && p < c->n_positions; p++) {
		err = position_distances(c, models, &w, p);
		if (!err && progress)
			progress(p + 1, c->n_positions, arg);
	}
	work_free(&w);
	return err;
}

/* The model table: identities, names and file names (for messages). */
static void describe_models(struct mp_consolidation *c, struct mp_store *const *models)
{
	for (uint32_t i = 0; i < c->n; i++) {
		const char *path = mp_store_path(models[i]), *slash = strrchr(path, '/');
		struct mpc_model_entry *m = &c->models[i];

		m->identity = mp_store_identity(models[i]);
		snprintf(m->name, sizeof(m->name), "%s", mp_store_name(models[i]));
		snprintf(m->file, sizeof(m->file), "%s", slash ? slash + 1 : path);
	}
}

static int assign_owners(struct mp_consolidation *c)
{
	uint32_t *rank = malloc(c->n_positions * sizeof(*rank));
	int32_t *owner = malloc(c->n_positions * sizeof(*owner));
	int err = rank && owner ? mpc_rank(c, rank, owner) :
		  mp_err(-ENOMEM, "out of memory ranking %u positions", c->n_positions);

	for (uint32_t p = 0; !err && p < c->n_positions; p++) {
		c->pos[p].rank = rank[p];
		c->pos[p].owner = owner[p];
		if (owner[p] >= 0)
			c->models[owner[p]].owned++;
	}
	free(rank);
	free(owner);
	return err;
}

int mp_consolidation_build(struct mp_store *const *models, uint32_t n, uint32_t capacity,
			   void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg,
			   struct mp_consolidation **out)
{
	const struct mp_geometry *g;
	struct mp_consolidation *c;
	int err;

	if (!out)
		return mp_err(-EINVAL, "mp_consolidation_build: NULL argument");
	*out = NULL;
	err = check_inputs(models, n, capacity);
	if (err)
		return err;
	g = mp_store_geometry(models[0]);
	c = calloc(1, sizeof(*c));
	if (!c)
		return mp_err(-ENOMEM, "out of memory for a map");
	*c = (struct mp_consolidation){
		.n = n, .n_pairs = n * (n - 1) / 2, .layers = g->layers, .experts = g->experts,
		.n_positions = g->layers * g->experts, .capacity = capacity, .hidden = g->hidden,
		.ffn = g->ffn, .dtype = (uint32_t)g->dtype,
		.expert_bytes = mp_store_expert_bytes(models[0]),
	};
	err = mpc_alloc_tables(c);
	if (!err) {
		describe_models(c, models);
		err = compute_distances(c, models, progress, arg);
	}
	if (!err)
		err = assign_owners(c);
	if (err) {
		mp_consolidation_close(c);
		return err;
	}
	*out = c;
	return 0;
}

void mp_consolidation_close(struct mp_consolidation *c)
{
	if (!c)
		return;
	free(c->models);
	free(c->pos);
	free(c->pairs);
	free(c);
}

/*
 * Checking a map against the models a server opened
 */

/* "'name' (file F, identity X)" of map model i, in buf. */
static const char *describe(const struct mp_consolidation *c, uint32_t i, char *buf, size_t len)
{
	snprintf(buf, len, "'%s' (file %s, identity %016llx)", c->models[i].name,
		 c->models[i].file, (unsigned long long)c->models[i].identity);
	return buf;
}

int mp_consolidation_check(const struct mp_consolidation *c, struct mp_store *const *models,
			   uint32_t n)
{
	char want[256];

	if (n != c->n)
		return mp_err(-EMEDIUMTYPE, "the map consolidates %u models, %u were given", c->n,
			      n);
	for (uint32_t i = 0; i < n; i++) {
		uint64_t id = mp_store_identity(models[i]);

		if (id == c->models[i].identity)
			continue;
		for (uint32_t j = 0; j < n; j++)
			if (c->models[j].identity == id)
				return mp_err(-EMEDIUMTYPE, "model %u %s is model %u of the map, not "
					      "%u: give the models in the map's order", i,
					      mp_store_path(models[i]), j, i);
		return mp_err(-EMEDIUMTYPE, "model %u %s ('%s', identity %016llx) is not in the "
			      "map: its model %u is %s", i, mp_store_path(models[i]),
			      mp_store_name(models[i]), (unsigned long long)id, i,
			      describe(c, i, want, sizeof(want)));
	}
	return 0;
}

/*
 * Accessors
 */

static bool in_range(const struct mp_consolidation *c, uint32_t layer, uint32_t expert)
{
	return layer < c->layers && expert < c->experts;
}

int mp_consolidation_owner(const struct mp_consolidation *c, uint32_t layer, uint32_t expert)
{
	return in_range(c, layer, expert) ? c->pos[layer * c->experts + expert].owner :
	       MP_CONSOL_NONE;
}

uint32_t mp_consolidation_rank(const struct mp_consolidation *c, uint32_t layer, uint32_t expert)
{
	return in_range(c, layer, expert) ? c->pos[layer * c->experts + expert].rank : 0;
}

double mp_consolidation_distance(const struct mp_consolidation *c, uint32_t layer,
				 uint32_t expert)
{
	return in_range(c, layer, expert) ? c->pos[layer * c->experts + expert].distance : NAN;
}

double mp_consolidation_pair_distance(const struct mp_consolidation *c, uint32_t i, uint32_t j,
				      uint32_t layer, uint32_t expert)
{
	if (!in_range(c, layer, expert) || i >= c->n || j >= c->n)
		return NAN;
	if (i == j)
		return 0;
	if (i > j) {
		uint32_t t = i;

		i = j;
		j = t;
	}
	return c->pairs[(size_t)mpc_pair_index(c->n, i, j) * c->n_positions +
			layer * c->experts + expert];
}

uint32_t mp_consolidation_models(const struct mp_consolidation *c)
{
	return c->n;
}

uint32_t mp_consolidation_layers(const struct mp_consolidation *c)
{
	return c->layers;
}

uint32_t mp_consolidation_experts(const struct mp_consolidation *c)
{
	return c->experts;
}

uint32_t mp_consolidation_capacity(const struct mp_consolidation *c)
{
	return c->capacity;
}

uint32_t mp_consolidation_owned(const struct mp_consolidation *c, uint32_t i)
{
	return i < c->n ? c->models[i].owned : 0;
}

uint64_t mp_consolidation_model_identity(const struct mp_consolidation *c, uint32_t i)
{
	return i < c->n ? c->models[i].identity : 0;
}

const char *mp_consolidation_model_name(const struct mp_consolidation *c, uint32_t i)
{
	return i < c->n ? c->models[i].name : NULL;
}

const char *mp_consolidation_model_file(const struct mp_consolidation *c, uint32_t i)
{
	return i < c->n ? c->models[i].file : NULL;
}

/*
 * Distances across positions (the report's Fig. 2 analogue)
 */

int mp_consolidation_cross_distances(struct mp_store *a, struct mp_store *b, uint32_t layer,
				     uint32_t max, double *out)
{
	const struct mp_geometry *g = mp_store_geometry(a);
	uint64_t total = (uint64_t)g->experts * (g->experts - 1), count, last_e1 = UINT64_MAX;
	struct dist_work w;
	int err = a == b ? 0 : check_geometry(a, b);

	if (err)
		return err;
	if (layer >= g->layers)
		return mp_err(-EINVAL, "%s: layer %u of %u", mp_store_path(a), layer, g->layers);
	count = MP_MIN((uint64_t)max, total);
	if (!count)
		return 0;
	err = work_init(&w, a, 2);
	if (err)
		return err;
	for (uint64_t s = 0; s < count && !err; s++) {
		/* sample s of count spread over the total pairs; pair q is (e1, the q%(E-1)-th other) */
		uint64_t q = s * total / count, e1 = q / (g->experts - 1), e2 = q % (g->experts - 1);

		e2 += e2 >= e1;
		if (e1 != last_e1)
			err = mp_store_read_expert(a, layer, (uint32_t)e1, w.raw[0]);
		last_e1 = err ? UINT64_MAX : e1;
		if (!err)
			err = mp_store_read_expert(b, layer, (uint32_t)e2, w.raw[1]);
		if (!err) {
			pair_sums(&w);
			out[s] = sqrt(w.acc[0]);
		}
	}
	work_free(&w);
	return err ? err : (int)count;
}

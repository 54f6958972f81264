/* SPDX-License-Identifier: MIT */
/*
 * The expert-map store (FineMoE): one record per iteration, the per-layer
 * gate distributions and a semantic vector, searched by cosine similarity,
 * bounded by a capacity with redundancy-based replacement, persisted to a
 * file (docs/prefetch.md, "Expert-map file").
 */
#ifndef MP_EMAP_H
#define MP_EMAP_H

#include <stdbool.h>
#include <stdint.h>

struct mp_emap;

/* Longest semantic vector a store (and the prefetcher's queue) takes. */
#define MP_EMAP_MAX_SEM		(1u << 16)

struct mp_emap_config {
	uint32_t layers;
	uint32_t experts;
	uint32_t topk;		/* experts a record's row votes for (the model's top-k) */
	uint32_t sem_dim;	/* semantic vector length; 0: none (trajectory searches only) */
	uint32_t capacity;	/* records; 0: 1024 */
	uint32_t distance;	/* prefetch distance d: RDY = (d/L) sem + ((L-d)/L) traj */
};

/* Counters and memory (mp_emap_stats()). */
struct mp_emap_stats {
	uint32_t count;		/* records held */
	uint32_t capacity;
	uint64_t inserted;	/* records offered since creation (or load) */
	uint64_t replaced;	/* inserts that replaced the most redundant record */
	uint64_t searches;
	uint64_t bytes;		/* memory held by the store, all arrays included */
};

/* Creates an empty store. Returns 0, -EINVAL (a field out of range) or -ENOMEM. */
int mp_emap_create(const struct mp_emap_config *cfg, struct mp_emap **out);
void mp_emap_destroy(struct mp_emap *m);

/*
 * Adds one iteration: map is layers x experts gate values (rows need not be
 * normalised: each row is scaled to sum to 1; an all-zero row stays zero),
 * sem is sem_dim floats (NULL: zeros). When the store is full the record
 * with the highest redundancy RDY against the new one is replaced, so a
 * duplicate replaces its twin and the distinct records stay. Returns the
 * index written, or -EINVAL.
 */
int mp_emap_insert(struct mp_emap *m, const float *map, const float *sem);

/*
 * The record most similar to sem (cosine) / to the first `prefix_layers`
 * layers of map (cosine of the flattened prefixes). Returns the index and
 * sets *score (in [-1, 1]; 0 for zero vectors), or -ENOENT when the store
 * is empty.
 */
int mp_emap_search_sem(struct mp_emap *m, const float *sem, float *score);
int mp_emap_search_traj(struct mp_emap *m, const float *map, uint32_t prefix_layers,
			float *score);

/*
 * A trajectory's running similarity to every record, for
 * mp_emap_predict_traj(): the dot products of its prefix with each record's,
 * kept between calls so that each call adds only the layers gated since
 * (one pass over the store per token instead of one per layer). Each record's
 * product is recomputed when the record was written since, so a store that
 * other requests' iterations change is followed. A zeroed struct is an empty
 * query; one per request followed (it belongs to the request's iteration).
 */
struct mp_emap_query {
	uint64_t store;		/* the store the products belong to (0: none) */
	uint32_t cap;
	uint32_t layers;	/* prefix layers folded in */
	double vsq;		/* the prefix's squared norm */
	double *dot;		/* [cap] */
	uint32_t *gen;		/* [cap]: the record write each product belongs to */
};

/* A new trajectory: the next search starts from its first layer. */
void mp_emap_query_reset(struct mp_emap_query *q);
/* Frees what the query holds and empties it. */
void mp_emap_query_fini(struct mp_emap_query *q);

/*
 * Probabilities of use: for each expert of a layer, how likely it is to be
 * among the layer's top-k, estimated from several records at once rather
 * than the one best match (whose rows are zero but for the top-k). Each
 * record votes for its row's k largest experts (k = the store's topk,
 * computed once when the record is written) with a weight; one uniform
 * pseudo-record of weight 1 (k/J each) keeps every probability above zero
 * and is all there is for an empty store or a context no record shares.
 * Both write experts floats in [0, 1] summing to k into out and return 0,
 * or -EINVAL (bad arguments; experts above MP_MAX_PREDICT_EXPERTS).
 *
 * mp_emap_predict_layer(): weights ctx . c_y, where c_y is the `experts`
 * floats of record y's semantic vector from `offset` on. With the previous
 * iteration's map as the semantic vector and offset = layer * experts, this
 * is the layer's learnt iteration-to-iteration transition: where the layer
 * goes at its next pass, given the experts it used at its last.
 *
 * mp_emap_predict_traj(): the MP_EMAP_NEIGHBOURS records whose first
 * prefix_layers layers are most similar (cosine, positive only) vote for
 * layer `target`, weighted by that cosine; *score is the best cosine (0:
 * no record shares anything). With a query q (may be NULL: computed from
 * scratch) map must be the trajectory q followed so far, its rows below the
 * last call's prefix unchanged unless the prefix does not grow.
 *
 * mp_emap_predict_sem(): the same vote by the records whose semantic vectors
 * are nearest sem, for every layer at once (out: layers x experts floats):
 * FineMoE's semantic search, before an iteration has any gate.
 */
#define MP_MAX_PREDICT_EXPERTS	256u
/* Enough votes for a probability within about +-0.12 (binomial), few enough to stay local. */
#define MP_EMAP_NEIGHBOURS	16u
int mp_emap_predict_layer(struct mp_emap *m, uint32_t layer, const float *ctx, uint32_t offset,
			  float *out);
int mp_emap_predict_traj(struct mp_emap *m, struct mp_emap_query *q, const float *map,
			 uint32_t prefix_layers, uint32_t target, float *out, float *score);
int mp_emap_predict_sem(struct mp_emap *m, const float *sem, float *out, float *score);

/*
 * Copies record idx's map (layers x experts floats, rows summing to 1 or 0)
 * and semantic vector (sem_dim floats) to map and sem (either may be NULL).
 * Returns 0 or -ENOENT.
 */
int mp_emap_record(const struct mp_emap *m, uint32_t idx, float *map, float *sem);

void mp_emap_stats(const struct mp_emap *m, struct mp_emap_stats *out);
const struct mp_emap_config *mp_emap_config(const struct mp_emap *m);

/* Cosine of two vectors of n floats; 0 when either is zero. */
float mp_cosine(const float *a, const float *b, uint32_t n);

/*
 * Writes the store to path (a temporary renamed into place after fsync).
 * Returns 0 or the write error with a message.
 */
int mp_emap_save(const struct mp_emap *m, const char *path);

/*
 * Reads a store written by mp_emap_save(). The file's layers, experts and
 * sem_dim must equal cfg's; capacity and distance come from cfg (a file
 * with more records than the capacity keeps the first ones, with a
 * warning). Returns 0 and sets *out, or -ENOENT/-EACCES (open), -EPROTO
 * (not an expert-map file), -EPROTONOSUPPORT (version), -EINVAL (geometry
 * differs), -ENODATA (truncated), -EBADMSG (checksum), -ENOMEM; the message
 * names the file and the offset.
 */
int mp_emap_load(const char *path, const struct mp_emap_config *cfg, struct mp_emap **out);

#endif /* MP_EMAP_H */

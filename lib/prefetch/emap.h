/* SPDX-License-Identifier: MIT */
/*
 * The expert-map store (FineMoE): one record per iteration, the per-layer
 * gate distributions and a semantic vector, searched by cosine similarity,
 * bounded by a capacity with redundancy-based replacement, persisted to a
 * file (docs/prefetch.md, "Expert-map file").
 *
 * A record's map keeps, of each layer's row, its MP_EMAP_ROW_KEEP x topk
 * largest gate values (all of them when no more are non-zero, as with top-k
 * weights), scaled to keep the row's sum: what a router's top-k decision
 * depends on, and what makes a search cost records x layers x kept values
 * however many experts the model has (docs/prefetch.md, "Policy cost").
 * Queries are cut the same way, so a record still scores 1 against itself.
 */
#ifndef MP_EMAP_H
#define MP_EMAP_H

#include <stdbool.h>
#include <stdint.h>

struct mp_emap;

/* Longest semantic vector a store (and the prefetcher's queue) takes. */
#define MP_EMAP_MAX_SEM		(1u << 16)
/*
 * Searches compare semantic vectors longer than this by their sketches of
 * this many floats (feature hashing): cosines within about 1/sqrt of it,
 * and a search's cost no longer grows with the model's hidden size.
 */
#define MP_EMAP_SKETCH_DIM	128u
/* A map row keeps its ROW_KEEP x topk largest values. */
#define MP_EMAP_ROW_KEEP	2u
/* Enough votes for a probability within about +-0.12 (binomial), few enough to stay local. */
#define MP_EMAP_NEIGHBOURS	16u

struct mp_emap_config {
	uint32_t layers;
	uint32_t experts;
	uint32_t topk;		/* experts a record's row votes for (the model's top-k) */
	uint32_t sem_dim;	/* semantic vector length; 0: none (trajectory searches only) */
	/*
	 * The semantic vector is a layers x experts map (the previous
	 * iteration's, when the engine gives no embedding): kept and compared
	 * as maps are. sem_dim must then be layers x experts.
	 */
	bool sem_is_map;
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
	/*
	 * Memory held by the store and its own query, all arrays included;
	 * the queries of the requests followed are their holders'
	 * (mp_emap_query_bytes()).
	 */
	uint64_t bytes;
};

/*
 * One iteration's view of the store: its trajectory's and its semantic
 * vector's dot products with every record, kept between calls so that a
 * search adds only the layers gated since the last one (one pass over the
 * store per token instead of one per layer) and the insert at the
 * iteration's end reuses the semantic products of its begin. A product is
 * recomputed when its record was written since (another request's map), so
 * a store that other requests change is followed. A zeroed struct is an
 * empty query; one per request followed (it lives in the request's iter).
 */
struct mp_emap_query {
	uint64_t store;		/* the store the trajectory products belong to (0: none) */
	uint32_t cap;		/* records the arrays hold */
	uint32_t layers;	/* trajectory prefix layers folded in */
	/*
	 * The store's write count when gen[] was last brought up to date:
	 * while it has not moved no record was written, and a search need
	 * not look for one.
	 */
	uint32_t writes;
	double vsq;		/* the prefix's squared norm */
	uint32_t row_cap;	/* floats rows holds */
	float *rows;		/* [layers][experts]: the prefix's rows folded in */
	/* Those rows as kept ([layers][kept]) and vsq after each ([layers]): an insert's. */
	uint16_t *kid;
	float *kval;
	double *ksq;
	double *dot;		/* [cap] */
	uint32_t *gen;		/* [cap]: the record write each product belongs to */
	/* The last trajectory search's neighbours: the next one starts from them. */
	uint32_t nb_n;
	uint32_t nb_y[MP_EMAP_NEIGHBOURS];
	uint64_t sem_store;	/* the store the semantic products belong to (0: none) */
	double snorm;
	double *sdot;		/* [cap] */
	uint32_t *sgen;		/* [cap] */
	/* sem_is_map: the next iteration's (its map is this trajectory), summed layer by layer */
	uint64_t next_store;
	uint32_t next_layers;	/* of next_full */
	uint32_t next_full;
	double next_sq;
	double *ndot;		/* [cap] */
	uint32_t *ngen;		/* [cap] */
};

/*
 * A new iteration (or trajectory): the next searches start over, and its
 * semantic vector is the one they are next given. With a semantic map, the
 * products mp_emap_predict_layer() summed over the last iteration's rows,
 * when it was given all of them in order, become the new iteration's: its
 * map must then be those rows.
 */
void mp_emap_query_reset(struct mp_emap_query *q);
/* Frees what the query holds and empties it. */
void mp_emap_query_fini(struct mp_emap_query *q);
/* The memory q's arrays hold (for m's geometry; 0 for a query never used). */
uint64_t mp_emap_query_bytes(const struct mp_emap *m, const struct mp_emap_query *q);

/* Creates an empty store. Returns 0, -EINVAL (a field out of range) or -ENOMEM. */
int mp_emap_create(const struct mp_emap_config *cfg, struct mp_emap **out);
void mp_emap_destroy(struct mp_emap *m);

/*
 * Adds one iteration: map is layers x experts gate values (rows need not be
 * normalised: each row is scaled to sum to 1; an all-zero row stays zero),
 * sem is sem_dim floats (NULL: zeros). When the store is full the record
 * with the highest redundancy RDY against the new one is replaced, so a
 * duplicate replaces its twin and the distinct records stay. q (may be
 * NULL) is the iteration's query: its semantic products, when it has them
 * for this sem, are not computed again. Returns the index written, or
 * -EINVAL.
 */
int mp_emap_insert(struct mp_emap *m, struct mp_emap_query *q, const float *map,
		   const float *sem);

/*
 * The record most similar to sem (cosine) / to the first `prefix_layers`
 * layers of map (cosine of the flattened prefixes). Returns the index and
 * sets *score (in [-1, 1]; 0 for zero vectors), or -ENOENT when the store
 * is empty. q as for the predictions below.
 */
int mp_emap_search_sem(struct mp_emap *m, struct mp_emap_query *q, const float *sem,
		       float *score);
int mp_emap_search_traj(struct mp_emap *m, const float *map, uint32_t prefix_layers,
			float *score);

/*
 * Probabilities of use: for each expert of a layer, how likely it is to be
 * among the layer's top-k, estimated from several records at once rather
 * than the one best match. Each record votes for its row's k largest
 * experts (k = the store's topk) with a weight; one uniform pseudo-record of
 * weight 1 (k/J each) keeps every probability above zero and is all there
 * is for an empty store or a context no record shares. Each writes experts
 * floats in [0, 1] summing to k into out and returns 0, or -EINVAL (bad
 * arguments; experts above MP_MAX_PREDICT_EXPERTS).
 *
 * mp_emap_predict_layer(): weights ctx . c_y, where c_y is layer's row of
 * record y's semantic map (sem_is_map only): with the previous iteration's
 * map as the semantic vector this is the layer's learnt
 * iteration-to-iteration transition: where the layer goes at its next pass,
 * given the experts it used at its last (ctx, experts floats). With a query
 * q, ctx is row `layer` of q's iteration's map, and its products with every
 * record's whole semantic map are summed as the rows come, for the next
 * iteration's mp_emap_search_sem() (see mp_emap_query_reset()).
 *
 * mp_emap_predict_traj(): the MP_EMAP_NEIGHBOURS records whose first
 * prefix_layers layers are most similar (cosine, positive only) vote for
 * layer `target`, weighted by that cosine; *score is the best cosine (0:
 * no record shares anything). With a query q (NULL: from scratch) map is
 * the trajectory q follows, its rows below the last call's prefix
 * unchanged unless the prefix does not grow (then q starts over).
 *
 * mp_emap_predict_sem(): the same vote by the records whose semantic vectors
 * are nearest sem, for every layer at once (out: layers x experts floats):
 * FineMoE's semantic search, before an iteration has any gate. With a
 * query q, sem is its iteration's vector.
 */
#define MP_MAX_PREDICT_EXPERTS	256u
int mp_emap_predict_layer(struct mp_emap *m, struct mp_emap_query *q, uint32_t layer,
			  const float *ctx, float *out);
int mp_emap_predict_traj(struct mp_emap *m, struct mp_emap_query *q, const float *map,
			 uint32_t prefix_layers, uint32_t target, float *out, float *score);
int mp_emap_predict_sem(struct mp_emap *m, struct mp_emap_query *q, const float *sem,
			float *out, float *score);
/* mp_emap_predict_traj() for layers target..target+n-1 at once, one search: out n x experts. */
int mp_emap_predict_traj_n(struct mp_emap *m, struct mp_emap_query *q, const float *map,
			   uint32_t prefix_layers, uint32_t target, uint32_t n, float *out,
			   float *score);

/*
 * Copies record idx's map (layers x experts floats: each row's kept values,
 * zeros elsewhere) and semantic vector (sem_dim floats) to map and sem
 * (either may be NULL). Returns 0 or -ENOENT.
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

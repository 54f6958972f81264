/* SPDX-License-Identifier: MIT */
/*
 * Consolidation of several fine-tuned variants of one MoE model (Multi-MoE,
 * its Algorithm 1): the L2 distance between the variants' experts at every
 * (layer, expert) position, the positions ranked by it, and the map (.mpc)
 * saying which model's expert serves every model at a position (its owner)
 * or that each model uses its own there. docs/consolidate-format.md is the
 * specification of the file.
 */
#ifndef MOEPAGER_CONSOLIDATE_H
#define MOEPAGER_CONSOLIDATE_H

#include <moepager/store.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MP_MPC_VERSION		1u
/* Most models one map consolidates. */
#define MP_CONSOL_MAX_MODELS	64u
/* mp_consolidation_owner() of a position no model owns. */
#define MP_CONSOL_NONE		(-1)

struct mp_consolidation;

/*
 * Builds the map of models[0..n) (1 <= n <= MP_CONSOL_MAX_MODELS, each a
 * different model of one geometry): for every position, the L2 distance
 * between every pair of models' experts (converted to f32, the squares
 * summed in double), summed over the pairs; the positions ranked by that
 * sum ascending (ties: lower layer, then lower expert, first); the first
 * capacity ranks owned by model (rank - 1) mod n, the rest by none. Experts
 * are read one position at a time (n experts in memory) and checked
 * against their checksums. progress (may be NULL) gets positions done and
 * their total. Returns 0 and sets *out; -EINVAL naming the geometry field
 * and both files that differ, two copies of one model, a capacity above
 * layers x experts or a non-finite distance (naming the position); or a
 * read error.
 */
MP_API int mp_consolidation_build(struct mp_store *const *models, uint32_t n, uint32_t capacity,
				  void (*progress)(uint64_t done, uint64_t total, void *arg),
				  void *arg, struct mp_consolidation **out);

/* Writes the map to path (a temporary file renamed into place). 0 or -errno. */
MP_API int mp_consolidation_write(const struct mp_consolidation *c, const char *path);

/*
 * Opens and checks a map file: header, the three tables and their
 * checksums, and that its ranks and owners are Algorithm 1's for its
 * distances. Returns 0 and sets *out, or -errno with a message naming the
 * field and its offset: -EPROTO (not a map), -EPROTONOSUPPORT (version,
 * flags), -EBADMSG (checksum), -EINVAL (bad field), -ENODATA (truncated).
 */
MP_API int mp_consolidation_open(const char *path, struct mp_consolidation **out);
/* Frees the map. NULL is allowed. */
MP_API void mp_consolidation_close(struct mp_consolidation *c);

/*
 * 0 when models[0..n) are the map's models in its order (same identities);
 * -EMEDIUMTYPE naming the first model that is not (and where it is in the
 * map, if it is there in another place) or the count that differs.
 */
MP_API int mp_consolidation_check(const struct mp_consolidation *c,
				  struct mp_store *const *models, uint32_t n);

/* Index of the model whose expert serves (layer, expert), or MP_CONSOL_NONE (also out of range). */
MP_API int mp_consolidation_owner(const struct mp_consolidation *c, uint32_t layer,
				  uint32_t expert);
/* Rank of (layer, expert), 1 = the most similar position; 0 out of range. */
MP_API uint32_t mp_consolidation_rank(const struct mp_consolidation *c, uint32_t layer,
				      uint32_t expert);
/* Distance at (layer, expert) summed over model pairs; NAN out of range. */
MP_API double mp_consolidation_distance(const struct mp_consolidation *c, uint32_t layer,
					uint32_t expert);
/* Distance at (layer, expert) between models i and j (0 when i == j); NAN out of range. */
MP_API double mp_consolidation_pair_distance(const struct mp_consolidation *c, uint32_t i,
					     uint32_t j, uint32_t layer, uint32_t expert);

MP_API uint32_t mp_consolidation_models(const struct mp_consolidation *c);
MP_API uint32_t mp_consolidation_layers(const struct mp_consolidation *c);
MP_API uint32_t mp_consolidation_experts(const struct mp_consolidation *c);
/* Positions owned by some model (the C of Algorithm 1). */
MP_API uint32_t mp_consolidation_capacity(const struct mp_consolidation *c);
/* Positions model i owns (0 for a bad i). */
MP_API uint32_t mp_consolidation_owned(const struct mp_consolidation *c, uint32_t i);
/* Model i's identity (mp_store_identity()), name and file name; 0 / NULL for a bad i. */
MP_API uint64_t mp_consolidation_model_identity(const struct mp_consolidation *c, uint32_t i);
MP_API const char *mp_consolidation_model_name(const struct mp_consolidation *c, uint32_t i);
MP_API const char *mp_consolidation_model_file(const struct mp_consolidation *c, uint32_t i);

/*
 * Distances across positions (the paper's Fig. 2 off the diagonal): a's
 * expert e1 against b's expert e2 != e1 of one layer, for up to max of the
 * experts x (experts - 1) ordered pairs, evenly spread over them in (e1, e2)
 * order (all of them when max is at least that). a and b have one geometry;
 * they may be the same model. Writes the distances to out[] and returns
 * their count, or -errno (-EINVAL for another geometry or a bad layer).
 */
MP_API int mp_consolidation_cross_distances(struct mp_store *a, struct mp_store *b,
					    uint32_t layer, uint32_t max, double *out);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_CONSOLIDATE_H */

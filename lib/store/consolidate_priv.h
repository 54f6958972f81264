/* SPDX-License-Identifier: MIT */
/* Private: the consolidation map in memory, shared by its builder and its file (mpc.c). */
#ifndef MP_STORE_CONSOLIDATE_PRIV_H
#define MP_STORE_CONSOLIDATE_PRIV_H

#include <stdint.h>

#include <moepager/consolidate.h>

#include "store/format.h"

/* The tables are the file's, so writing is a copy and reading a check. */
struct mp_consolidation {
	uint32_t n;			/* models */
	uint32_t n_pairs;		/* n * (n - 1) / 2 */
	uint32_t layers;
	uint32_t experts;
	uint32_t n_positions;		/* layers * experts */
	uint32_t capacity;
	uint32_t hidden;
	uint32_t ffn;
	uint32_t dtype;
	uint64_t expert_bytes;
	struct mpc_model_entry *models;		/* [n] */
	struct mpc_position_entry *pos;		/* [n_positions], layer-major */
	double *pairs;			/* [n_pairs][n_positions]: pair (i < j) in (i, j) order */
};

/* Allocates the three tables for the counts set in c. 0 or -ENOMEM (logged). */
int mpc_alloc_tables(struct mp_consolidation *c);

/* Index of the pair (i < j) among n models' pairs, in (i, j) order. */
static inline uint32_t mpc_pair_index(uint32_t n, uint32_t i, uint32_t j)
{
	return i * n - i * (i + 1) / 2 + (j - i - 1);
}

/* Position p's distance summed over the pair table, pairs in order (the stored sum). */
double mpc_pair_sum(const struct mp_consolidation *c, uint32_t p);

/*
 * Algorithm 1 for the distances in c->pos[]: rank[p] (1 = smallest distance;
 * ties to the lower position index) and owner[p] ((rank - 1) mod n for the
 * first capacity ranks, -1 after). 0 or -ENOMEM (logged).
 */
int mpc_rank(const struct mp_consolidation *c, uint32_t *rank, int32_t *owner);

#endif /* MP_STORE_CONSOLIDATE_PRIV_H */

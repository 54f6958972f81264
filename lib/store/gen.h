/* SPDX-License-Identifier: MIT */
/* Private: the generator's per-piece fills, so tests can rebuild any piece in any order. */
#ifndef MP_GEN_H
#define MP_GEN_H

#include <stdint.h>

#include <moepager/store.h>

/* Fills buf (t->bytes) with tensor number index of a model generated from seed. */
void mpk_gen_tensor(const struct mp_tensor_info *t, uint32_t index, uint64_t seed, void *buf);
/* Fills buf (mp_geometry_expert_bytes(g)) with one expert of a model generated from seed. */
void mpk_gen_expert(const struct mp_geometry *g, uint32_t layer, uint32_t expert, uint64_t seed,
		    void *buf);

/* A generated model: the base of seed (variant 0), or a variant of it (mp_gen_variant()). */
struct mpk_gen_spec {
	uint64_t seed;
	uint32_t variant;
	float spread;
};

void mpk_gen_tensor_spec(const struct mp_tensor_info *t, uint32_t index,
			 const struct mpk_gen_spec *sp, void *buf);
void mpk_gen_expert_spec(const struct mp_geometry *g, uint32_t layer, uint32_t expert,
			 const struct mpk_gen_spec *sp, void *buf);

#endif /* MP_GEN_H */

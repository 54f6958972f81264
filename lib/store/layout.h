/* SPDX-License-Identifier: MIT */
/* The architecture's tensor list and the canonical file layout derived from a geometry. */
#ifndef MP_STORE_LAYOUT_H
#define MP_STORE_LAYOUT_H

#include <stdint.h>

#include <moepager/store.h>

/*
 * Where everything goes in a file the writer produces. The reader accepts
 * any placement that passes its checks, but the tensor set (names, order,
 * types, shapes) must be exactly `tensors`.
 */
struct mpk_layout {
	uint32_t n_tensors;
	struct mp_tensor_info *tensors;	/* canonical offsets; checksums 0 */
	uint32_t n_experts;		/* layers * experts */
	uint64_t tensor_table_off;
	uint64_t expert_table_off;
	uint64_t tables_end;
	uint64_t expert_bytes;		/* mp_geometry_expert_bytes() */
	uint64_t expert_base;		/* offset of layer 0 expert 0 */
	uint64_t expert_stride;		/* expert_bytes rounded up to MP_EXPERT_ALIGN */
	uint64_t tensor_data_bytes;	/* sum of tensor bytes */
	uint64_t file_bytes;
};

/*
 * Fills *l for a checked geometry. Returns 0, -EINVAL when a size overflows
 * 64 bits or 32-bit counts, or -ENOMEM.
 */
int mpk_layout_build(const struct mp_geometry *g, struct mpk_layout *l);
void mpk_layout_free(struct mpk_layout *l);

/* Index of layer/expert in the expert table (layer-major). */
static inline uint32_t mpk_expert_index(const struct mp_geometry *g, uint32_t layer,
					uint32_t expert)
{
	return layer * g->experts + expert;
}

/* Offset of an expert in the canonical layout. */
static inline uint64_t mpk_layout_expert_offset(const struct mpk_layout *l, uint32_t index)
{
	return l->expert_base + (uint64_t)index * l->expert_stride;
}

/*
 * Bytes of a shape, or 0 (with *overflow set) when it does not fit 64 bits or
 * its rows (the last dimension) are not whole blocks of a block type.
 */
uint64_t mpk_shape_bytes(enum mp_dtype t, uint32_t ndim, const uint64_t *dims, bool *overflow);

#endif /* MP_STORE_LAYOUT_H */

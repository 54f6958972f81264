// SPDX-License-Identifier: MIT
/* Model geometry: range and consistency checks, derived sizes. */
#include "base/base.h"

static int check_range(const char *field, uint32_t v, uint32_t lo, uint32_t hi)
{
	if (v < lo || v > hi)
		return mp_err(-EINVAL, "geometry: %s = %u is outside [%u, %u]", field, v, lo, hi);
	return 0;
}

/* Every matrix row (hidden, ffn or heads x head_dim long) must be whole blocks of the weight type. */
static int check_blocks(const struct mp_geometry *g)
{
	const uint32_t b = mp_dtype_block(g->dtype);
	const uint64_t qdim = (uint64_t)g->heads * g->head_dim;

	if (g->hidden % b || g->ffn % b || qdim % b)
		return mp_err(-EINVAL, "geometry: %s rows are blocks of %u: hidden (%u), ffn (%u) and "
			      "heads x head_dim (%llu) must be multiples of %u",
			      mp_dtype_name(g->dtype), b, g->hidden, g->ffn,
			      (unsigned long long)qdim, b);
	return 0;
}

int mp_geometry_check(const struct mp_geometry *g)
{
	int err;

	if (!g)
		return mp_err(-EINVAL, "geometry: NULL");
	if ((err = check_range("layers", g->layers, 1, MP_MAX_LAYERS)) ||
	    (err = check_range("experts", g->experts, 1, MP_MAX_EXPERTS)) ||
	    (err = check_range("topk", g->topk, 1, MP_MIN(g->experts, MP_MAX_TOPK))) ||
	    (err = check_range("hidden", g->hidden, 1, MP_MAX_DIM)) ||
	    (err = check_range("ffn", g->ffn, 1, MP_MAX_DIM)) ||
	    (err = check_range("heads", g->heads, 1, 4096)) ||
	    (err = check_range("kv_heads", g->kv_heads, 1, g->heads)) ||
	    (err = check_range("head_dim", g->head_dim, 2, 4096)) ||
	    (err = check_range("vocab", g->vocab, 1, MP_MAX_VOCAB)) ||
	    (err = check_range("max_seq", g->max_seq, 1, MP_MAX_SEQ)))
		return err;
	if (!mp_dtype_block(g->dtype))
		return mp_err(-EINVAL, "geometry: unknown weight type %d", (int)g->dtype);
	if (g->heads % g->kv_heads)
		return mp_err(-EINVAL, "geometry: heads (%u) is not a multiple of kv_heads (%u)",
			      g->heads, g->kv_heads);
	if (g->head_dim % 2)
		return mp_err(-EINVAL, "geometry: head_dim (%u) must be even for RoPE", g->head_dim);
	if ((uint64_t)g->heads * g->head_dim > MP_MAX_DIM)
		return mp_err(-EINVAL, "geometry: heads x head_dim (%u x %u) is too large",
			      g->heads, g->head_dim);
	err = check_blocks(g);
	if (err)
		return err;
	if (!(g->rope_theta > 0.0f) || !(g->norm_eps > 0.0f) || g->norm_eps > 1.0f)
		return mp_err(-EINVAL, "geometry: rope_theta (%g) and norm_eps (%g) must be positive",
			      (double)g->rope_theta, (double)g->norm_eps);
	return 0;
}

uint64_t mp_geometry_expert_bytes(const struct mp_geometry *g)
{
	return mp_dtype_bytes(g->dtype, 3ull * g->hidden * g->ffn);
}

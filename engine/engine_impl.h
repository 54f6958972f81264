/* SPDX-License-Identifier: MIT */
/* The library's side of an engine instance, shared by engine.c and the reference engine. */
#ifndef MP_ENGINE_IMPL_H
#define MP_ENGINE_IMPL_H

#include <stdbool.h>

#include <moepager/engine.h>

#include "engine/kernels.h"
#include "engine/pool.h"

#define MP_ENGINE_NAME_MAX 64

struct engine_impl {
	struct mp_engine pub;
	char name[MP_ENGINE_NAME_MAX];
	const struct mp_kernels *kern;	/* the reference kernels every engine can fall back to */
	struct mp_pool *pool;
	void *dl;			/* dlopen() handle of a plug-in, or NULL */
	bool broken;			/* the plug-in's init failed twice (mp_engine_set_threads) */
	/* Per-worker scratch (weights widened to f32, attention scores), grown by the caller. */
	float **wbuf;
	size_t *wbuf_len;
	/* Caller-side scratch of an op (expert intermediate activations). */
	float *buf;
	size_t buf_len;
	/*
	 * RoPE's cos and sin of positions [0, rope_npos) for one theta and
	 * head_dim, [pos][j] as (cos, sin) pairs: the same floats as computed
	 * per call, made once (double pow/cos/sin per element cost ~2 % of a
	 * batch-16 step of mixtral-mini).
	 */
	float *rope_cs;
	uint32_t rope_npos;
	uint32_t rope_head_dim;
	float rope_theta;
};

static inline struct engine_impl *engine_impl(struct mp_engine *e)
{
	return (struct engine_impl *)((char *)e - offsetof(struct engine_impl, pub));
}

/* The reference engine's ops (the fallback of every NULL op) and its ISA-forcing variants. */
extern const struct mp_engine_ops mp_ref_ops;
extern const struct mp_engine_ops mp_ref_scalar_ops;
extern const struct mp_engine_ops mp_ref_avx2_ops;
extern const struct mp_engine_ops mp_ref_avx512_ops;
extern const struct mp_engine_ops mp_ref_amx_ops;
extern const struct mp_engine_ops mp_ref_bf16_ops;

/*
 * The reference engine's matmul and expert_ffn over row-major weights, or
 * (packed) over weights in the kernels' packed layout (kernels.h), which
 * only a table with gemm_packed[dt] reads: mp_engine_matmul_packed() and
 * mp_engine_expert_ffn_packed() check that.
 */
int ref_matmul_as(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
		  const void *w, uint32_t rows, uint32_t cols, const float *x, uint32_t n,
		  float *y, bool packed);
/*
 * count experts of one layer (w[i]: expert i's gate | up | down) over their
 * vectors, expert after expert at x (m[i] each), into out the same way: the
 * bits of one expert's FFN over each, in two pool runs for all of them
 * (every gate/up chunk, then every down chunk) instead of two each, so the
 * workers wait for each other twice a layer rather than twice an expert.
 */
int ref_experts_ffn_as(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
		       const void *const *w, uint32_t count, uint32_t hidden, uint32_t ffn,
		       const float *x, const uint32_t *m, float *out, bool packed);
/* ref_experts_ffn_as(packed) after mp_engine_expert_ffn_packed()'s checks of each expert: the runner's call. */
int mp_engine_experts_ffn_packed(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
				 const void *const *w, uint32_t count, uint32_t hidden,
				 uint32_t ffn, const float *x, const uint32_t *m, float *out);

/*
 * Makes every worker's scratch hold at least floats values (call before
 * mp_pool_run(), never from a chunk). Returns 0 or -ENOMEM.
 */
int engine_worker_scratch(struct engine_impl *ei, size_t floats);
/* The caller-side scratch, at least floats long, or NULL (-ENOMEM logged). */
float *engine_scratch(struct engine_impl *ei, size_t floats);

#endif /* MP_ENGINE_IMPL_H */

/* SPDX-License-Identifier: MIT */
/*
 * Matmul engines: an ops table chosen by name (built in, or a dlopen()ed
 * plug-in), the instance that runs it, and the thread pool it runs on.
 */
#ifndef MOEPAGER_ENGINE_H
#define MOEPAGER_ENGINE_H

#include <moepager/common.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Guards
 *
 * A caller that hands the engine weights which may fault (an expert in a
 * paged region) passes a guard: every chunk of work that reads those weights
 * runs as wrap(wctx, fn, arg) on the thread that does it. The guard returns
 * fn(arg), or a negative errno when fn could not finish (a SIGBUS on a
 * poisoned page); chunk code holds no locks and allocates nothing, so a
 * guard may leave it with siglongjmp(). The first error of any chunk is what
 * the op returns.
 */
typedef int (*mp_wrap_fn)(void *wctx, int (*fn)(void *arg), void *arg);

struct mp_guard {
	mp_wrap_fn wrap;
	void *wctx;
};

/*
 * Engine instances
 *
 * An instance is used by one calling thread at a time; its ops fan out over
 * a persistent pool of `threads` threads (the caller is one of them).
 */
struct mp_engine_ops;
struct mp_engine_host;

/* The part of an instance a plug-in sees; the library's state follows it. */
struct mp_engine {
	const struct mp_engine_ops *ops;
	const struct mp_engine_host *host;
	void *priv;			/* the plug-in's state, set by its init */
	uint32_t threads;		/* threads an op may use, the caller included */
};

struct mp_engine_config {
	uint32_t threads;		/* 0: one per online CPU */
	/* Extra directory searched first for plug-ins (may be NULL). */
	const char *plugin_dir;
	MP_RESERVED(4);
};

/*
 * Opens the engine called name: a built-in ("ref" picks the widest ISA this
 * CPU has; "ref-scalar", "ref-avx2" and "ref-avx512" force one; "ref-amx"
 * is ref-avx512 with bf16 weights' products on AMX tiles over activations
 * rounded to bf16, opt-in: not the same bits; "ref-bf16" the same on
 * AVX512-BF16's vdpbf16ps, not AMX's bits either), else the
 * plug-in name.so searched in cfg->plugin_dir, each directory of
 * $MOEPAGER_ENGINE_PATH (colon-separated), then the install's
 * <libdir>/moepager/engines; a name containing '/' is a plug-in path.
 * cfg may be NULL. Returns 0 and sets *out, -ENOENT (no such engine),
 * -EOPNOTSUPP (this CPU or kernel lacks the forced ISA), -ENOEXEC (a
 * plug-in that does not load or lacks mp_engine_plugin_ops, or has another ABI),
 * -EINVAL or -ENOMEM.
 */
MP_API int mp_engine_open(const char *name, const struct mp_engine_config *cfg,
			  struct mp_engine **out);
/* Stops the pool and frees the instance. NULL is allowed. */
MP_API void mp_engine_close(struct mp_engine *e);
/*
 * Changes how many threads e's ops use (the caller included), in place:
 * the pool is replaced and a plug-in's fini and init run again with the new
 * count. No op may run on e meanwhile (the single-caller rule of an
 * instance: call it from the thread that calls the ops, between two). On an
 * error e keeps its threads. Returns 0, -EINVAL (0 or above 1024 threads),
 * -ENOMEM, a pthread error or the plug-in's init error; should the plug-in's
 * init then fail for the old count too, e is unusable: its ops and this call
 * fail with -EIO, and only mp_engine_close() (which skips fini) is left.
 */
MP_API int mp_engine_set_threads(struct mp_engine *e, uint32_t threads);

MP_API const char *mp_engine_name(const struct mp_engine *e);
/* The ISA the reference kernels use: "avx512", "avx2" or "scalar". */
MP_API const char *mp_engine_isa(const struct mp_engine *e);
/* The built-in engine names, NULL-terminated. */
MP_API const char *const *mp_engine_builtin_names(void);

/*
 * Ops
 *
 * Weights are row-major with dims[0] = rows, of type dt; activations are
 * f32, rows of a batch contiguous. A row of a block type (q8_0, q4_0) is
 * whole blocks of MP_QBLOCK elements, so cols (and an expert's hidden and
 * ffn) must be multiples of it: -EINVAL otherwise. Every call returns 0 or a negative errno
 * (-EINVAL for bad arguments, -ENOMEM, or the guard's error). Weights are
 * read only inside guarded chunks when g is not NULL.
 */

/* y[rows] = W[rows x cols] . x[cols] */
MP_API int mp_engine_matvec(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
			    const void *w, uint32_t rows, uint32_t cols, const float *x, float *y);

/* y[n x rows] = x[n x cols] . W^T: the same product for n vectors, W read once. */
MP_API int mp_engine_matmul(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
			    const void *w, uint32_t rows, uint32_t cols, const float *x, uint32_t n,
			    float *y);

/*
 * One SwiGLU expert over n vectors: out = down . (silu(gate . x) * (up . x)),
 * with w pointing at the expert's bytes as the .mpk lays them out: gate
 * [ffn x hidden], up [ffn x hidden], down [hidden x ffn], contiguous.
 * x is [n x hidden], out is [n x hidden].
 */
MP_API int mp_engine_expert_ffn(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
				const void *w, uint32_t hidden, uint32_t ffn, const float *x,
				uint32_t n, float *out);

/*
 * Packed weights
 *
 * Weights a caller keeps for the engine (a runner's resident experts) may
 * be stored in the engine's own layout, in which its kernels read each
 * tile's rows as one stream instead of several side by side. Only the
 * built-in reference engines have one, for bf16 on AVX-512 (ref,
 * ref-avx512, ref-bf16); the products over packed weights are the bits of
 * the same products over the row-major ones.
 */
/* Whether e has a packed layout for dt weights (then the calls below accept them). */
MP_API bool mp_engine_packs(const struct mp_engine *e, enum mp_dtype dt);
/*
 * Writes the rows x cols matrix w (row-major, as the .mpk holds it) to out
 * in e's packed layout: as many bytes, which no engine but one whose
 * mp_engine_packs(dt) is true may read. out must not overlap w. Returns 0,
 * -EINVAL or -EOPNOTSUPP (no packed layout: out untouched).
 */
MP_API int mp_engine_pack(struct mp_engine *e, enum mp_dtype dt, const void *w, uint32_t rows,
			  uint32_t cols, void *out);
/* The same for an expert's gate | up | down bytes (mp_engine_expert_ffn()'s w). */
MP_API int mp_engine_pack_expert(struct mp_engine *e, enum mp_dtype dt, const void *w,
				 uint32_t hidden, uint32_t ffn, void *out);
/* mp_engine_matmul() and mp_engine_expert_ffn() over packed weights (-EOPNOTSUPP: no layout). */
MP_API int mp_engine_matmul_packed(struct mp_engine *e, const struct mp_guard *g,
				   enum mp_dtype dt, const void *w, uint32_t rows, uint32_t cols,
				   const float *x, uint32_t n, float *y);
MP_API int mp_engine_expert_ffn_packed(struct mp_engine *e, const struct mp_guard *g,
				       enum mp_dtype dt, const void *w, uint32_t hidden,
				       uint32_t ffn, const float *x, uint32_t n, float *out);

/* y[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i], for n rows of dim (y may be x). */
MP_API int mp_engine_rmsnorm(struct mp_engine *e, const float *x, const float *weight,
			     uint32_t dim, uint32_t n, float eps, float *y);

/*
 * Router top-k, Mixtral style: the k largest logits (ties: the lower id
 * first), in descending order, and weights = softmax over those k only.
 */
MP_API int mp_engine_topk(struct mp_engine *e, const float *logits, uint32_t experts, uint32_t k,
			  uint32_t *ids, float *weights);

/*
 * RoPE in place on x[n x heads x head_dim], row i at position pos0 + i.
 * Pairs are (j, j + head_dim/2) (the "rotate half" / NeoX convention) with
 * angle pos * theta^(-2j/head_dim).
 */
MP_API int mp_engine_rope(struct mp_engine *e, float *x, uint32_t n, uint32_t heads,
			  uint32_t head_dim, uint32_t pos0, float theta);

/*
 * Causal grouped-query attention for n query rows at positions pos0..pos0+n-1.
 * The caches hold positions 0..pos0+n-1 already (RoPE applied to k), one
 * row of kv_heads x head_dim per position. Query head h reads kv head
 * h / (heads / kv_heads); scores are scaled by 1/sqrt(head_dim).
 */
struct mp_attention {
	const float *q;			/* [n x heads x head_dim] */
	const float *k_cache;		/* [pos0 + n x kv_heads x head_dim] */
	const float *v_cache;
	float *out;			/* [n x heads x head_dim] */
	uint32_t n;
	uint32_t pos0;
	uint32_t heads;
	uint32_t kv_heads;
	uint32_t head_dim;
};

MP_API int mp_engine_attention(struct mp_engine *e, const struct mp_attention *a);

/*
 * Runs fn(ctx, chunk, worker) for chunk in [0, nchunks) over the pool; each
 * chunk under g when g is not NULL; worker (< e->threads) says which thread
 * runs it, for per-thread scratch. Returns 0 or the first chunk error.
 */
typedef int (*mp_chunk_fn)(void *ctx, uint32_t chunk, uint32_t worker);

MP_API int mp_engine_parallel(struct mp_engine *e, const struct mp_guard *g, uint32_t nchunks,
			      mp_chunk_fn fn, void *ctx);

/*
 * Writing an engine
 *
 * An ops table fills what it implements; a NULL op falls back to the
 * reference engine's, so a plug-in can start with one op. A plug-in is a
 * shared object exporting `const struct mp_engine_ops mp_engine_plugin_ops`
 * with abi = MP_ENGINE_ABI. It need not link libmoepager: what it may call
 * comes in e->host.
 */
#define MP_ENGINE_ABI		1u
#define MP_ENGINE_PLUGIN_SYMBOL	"mp_engine_plugin_ops"

struct mp_engine_ops {
	uint32_t abi;			/* MP_ENGINE_ABI */
	const char *name;
	const char *description;
	/*
	 * Sets up e->priv; e->host and e->threads are valid. Returns 0 or
	 * -errno. mp_engine_set_threads() runs fini then init again, with the
	 * new e->threads and its pool and scratch already in place.
	 */
	int (*init)(struct mp_engine *e);
	void (*fini)(struct mp_engine *e);

	int (*matvec)(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
		      const void *w, uint32_t rows, uint32_t cols, const float *x, float *y);
	int (*matmul)(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
		      const void *w, uint32_t rows, uint32_t cols, const float *x, uint32_t n,
		      float *y);
	int (*expert_ffn)(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
			  const void *w, uint32_t hidden, uint32_t ffn, const float *x, uint32_t n,
			  float *out);
	int (*rmsnorm)(struct mp_engine *e, const float *x, const float *weight, uint32_t dim,
		       uint32_t n, float eps, float *y);
	int (*topk)(struct mp_engine *e, const float *logits, uint32_t experts, uint32_t k,
		    uint32_t *ids, float *weights);
	int (*rope)(struct mp_engine *e, float *x, uint32_t n, uint32_t heads, uint32_t head_dim,
		    uint32_t pos0, float theta);
	int (*attention)(struct mp_engine *e, const struct mp_attention *a);
};

/* What the library offers an engine (arguments are checked before an op is called). */
struct mp_engine_host {
	uint32_t abi;			/* MP_ENGINE_ABI */
	/* The reference engine's ops, to call for cases an engine leaves to it. */
	const struct mp_engine_ops *ref;
	/* mp_engine_parallel(). */
	int (*parallel)(struct mp_engine *e, const struct mp_guard *g, uint32_t nchunks,
			mp_chunk_fn fn, void *ctx);
	/* Logs an error line and returns err (a negative errno). */
	int (*err)(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
	/*
	 * Widens n elements of type dt to f32 with the reference engine's fastest
	 * kernel; for a block type (q8_0, q4_0) n is whole blocks, as every row is.
	 */
	void (*to_f32)(struct mp_engine *e, enum mp_dtype dt, const void *src, float *dst,
		       size_t n);
};

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_ENGINE_H */

// SPDX-License-Identifier: MIT
/* The reference engine: every op over the ISA kernels, split by output rows over the pool. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/engine.h>

#include "engine/engine_impl.h"
#include "base/base.h"

/* Work below this many weight bytes runs on the caller: a wake-up would cost more. */
#define INLINE_BYTES		(48u << 10)
/* Chunks per thread: enough to even out a thread that the machine slows down. */
#define CHUNKS_PER_THREAD	4u
/*
 * Past this many bytes of input vectors, a product runs in blocks: rows
 * whose weights fit in L2 against vectors that fit there too, so a long
 * prefill reads its weights from memory once and its vectors from L2 (the
 * kernels stream each weight once per call, over all of its vectors).
 */
#define X_BLOCK_BYTES		(256u << 10)
#define W_BLOCK_BYTES		(256u << 10)

/* A product over a row range of W: y[t * ystride + r] for t < n. */
struct rows_job {
	const struct mp_kernels *k;
	enum mp_dtype dt;
	const void *w;
	uint32_t rows;
	uint32_t cols;
	const float *x;
	uint32_t n;
	float *y;
	size_t ystride;
	uint32_t nchunks;
	bool packed;		/* w in the packed layout (kernels.h): gemm_packed */
	/* Expert gate/up phase only: the up matrix, its output and silu(gate) * up. */
	const void *w_up;
	float *y_up;
	float *h;
};

static uint32_t chunk_count(struct engine_impl *ei, uint32_t rows, uint64_t bytes)
{
	uint32_t groups = (rows + MP_KERN_ROWS - 1) / MP_KERN_ROWS;
	uint32_t n = ei->pub.threads * CHUNKS_PER_THREAD;

	if (bytes < INLINE_BYTES || ei->pub.threads == 1)
		return 1;
	return MP_MIN(n, groups);
}

/* First row of chunk c: an even split rounded to the kernels' row blocks. */
static uint32_t chunk_start(uint32_t rows, uint32_t nchunks, uint32_t c)
{
	uint64_t r;

	if (c >= nchunks)
		return rows;
	r = (uint64_t)rows * c / nchunks;
	return (uint32_t)(r & ~(uint64_t)(MP_KERN_ROWS - 1));
}

static void rows_product(const struct rows_job *j, const void *w, float *y, uint32_t r0,
			 uint32_t r1)
{
	const struct mp_kernels *k = j->k;
	const mp_gemm_fn gemm = j->packed ? k->gemm_packed[j->dt] : k->gemm[j->dt];
	const size_t rowb = mp_dtype_bytes(j->dt, j->cols);
	const size_t xrow = (size_t)j->cols * sizeof(float);
	uint32_t rblock = r1 - r0, tblock = j->n;

	if (j->n * xrow > X_BLOCK_BYTES) {
		tblock = MP_MAX(1u, (uint32_t)(X_BLOCK_BYTES / xrow));
		/* Whole groups of the kernels' vector order (xgroup). */
		if (k->xgroup)
			tblock = MP_MAX(k->xgroup, tblock / k->xgroup * k->xgroup);
		rblock = MP_MAX(MP_KERN_ROWS, (uint32_t)(W_BLOCK_BYTES / rowb) &
					      ~(MP_KERN_ROWS - 1));
	}
	/*
	 * Each product is one kernel call's, whatever the blocks: the same bits.
	 * Blocks start at multiples of 4 rows, so a packed matrix's blocks are
	 * packed matrices.
	 */
	for (uint32_t r = r0; r < r1; r += rblock) {
		const uint32_t rr = MP_MIN(rblock, r1 - r);

		for (uint32_t t = 0; t < j->n; t += tblock)
			gemm((const char *)w + r * rowb, rr, j->cols, j->x + (size_t)t * j->cols,
			     MP_MIN(tblock, j->n - t), y + t * j->ystride + r, j->ystride);
	}
}

static int rows_chunk(void *arg, uint32_t chunk, uint32_t worker)
{
	const struct rows_job *j = arg;
	uint32_t r0 = chunk_start(j->rows, j->nchunks, chunk);
	uint32_t r1 = chunk_start(j->rows, j->nchunks, chunk + 1);

	(void)worker;
	if (r1 > r0)
		rows_product(j, j->w, j->y, r0, r1);
	return 0;
}

/* Floats of scratch the vectors of a product need in the kernels' order (0: none). */
static size_t xprep_floats(const struct engine_impl *ei, enum mp_dtype dt, uint32_t n,
			   uint32_t cols)
{
	return ei->kern->xprep[dt] ? (size_t)n * cols : 0;
}

/*
 * Experts a layer run takes at most, and the floats of scratch past which it
 * stops adding more (one expert always goes, whatever it needs): a long
 * prefill's experts then run a few at a time, as large as one did alone.
 */
#define LAYER_EXPERTS		16u
#define LAYER_SCRATCH_FLOATS	(4u << 20)

/* Products run together: each job's chunks, job after job. */
struct job_set {
	struct rows_job *jobs;
	uint32_t cfirst[LAYER_EXPERTS + 1];	/* job i's first chunk; [count]: all */
	uint32_t count;
	mp_chunk_fn fn;
};

static int set_chunk(void *arg, uint32_t chunk, uint32_t worker)
{
	const struct job_set *js = arg;
	uint32_t lo = 0, hi = js->count;

	while (hi - lo > 1) {
		const uint32_t mid = (lo + hi) / 2;

		if (js->cfirst[mid] <= chunk)
			lo = mid;
		else
			hi = mid;
	}
	return js->fn(&js->jobs[lo], chunk - js->cfirst[lo], worker);
}

/*
 * Runs count products over the pool in one run, each job's chunks its own
 * (as it would alone), its vectors first put in the kernels' order at xp[i].
 */
static int run_jobs(struct engine_impl *ei, const struct mp_guard *g, struct rows_job *jobs,
		     uint32_t count, mp_chunk_fn fn, float *const *xp)
{
	struct job_set js = { .jobs = jobs, .count = count, .fn = fn };

	for (uint32_t i = 0; i < count; i++) {
		struct rows_job *j = &jobs[i];
		uint64_t bytes = j->rows * mp_dtype_bytes(j->dt, j->cols) * (j->w_up ? 2 : 1);

		j->k = ei->kern;
		if (j->k->xprep[j->dt]) {
			j->k->xprep[j->dt](j->x, j->n, j->cols, xp[i]);
			j->x = xp[i];
		}
		j->nchunks = chunk_count(ei, j->rows, bytes);
		js.cfirst[i + 1] = js.cfirst[i] + j->nchunks;
	}
	return mp_pool_run(ei->pool, g, js.cfirst[count], set_chunk, &js);
}

int ref_matmul_as(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
		  const void *w, uint32_t rows, uint32_t cols, const float *x, uint32_t n,
		  float *y, bool packed)
{
	struct engine_impl *ei = engine_impl(e);
	size_t xn = xprep_floats(ei, dt, n, cols);
	float *xp = xn ? engine_scratch(ei, xn) : NULL;
	struct rows_job j = {
		.dt = dt, .w = w, .rows = rows, .cols = cols, .x = x, .n = n, .y = y,
		.ystride = rows, .packed = packed,
	};

	if (xn && !xp)
		return -ENOMEM;
	return run_jobs(ei, g, &j, 1, rows_chunk, &xp);
}

static int ref_matmul(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
		      const void *w, uint32_t rows, uint32_t cols, const float *x, uint32_t n,
		      float *y)
{
	return ref_matmul_as(e, g, dt, w, rows, cols, x, n, y, false);
}

static int ref_matvec(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
		      const void *w, uint32_t rows, uint32_t cols, const float *x, float *y)
{
	return ref_matmul(e, g, dt, w, rows, cols, x, 1, y);
}

/* Gate and up rows of one chunk for every vector, then h = silu(gate) * up there. */
static int gate_up_chunk(void *arg, uint32_t chunk, uint32_t worker)
{
	const struct rows_job *j = arg;
	uint32_t r0 = chunk_start(j->rows, j->nchunks, chunk);
	uint32_t r1 = chunk_start(j->rows, j->nchunks, chunk + 1);

	(void)worker;
	if (r1 <= r0)
		return 0;
	rows_product(j, j->w, j->y, r0, r1);
	rows_product(j, j->w_up, j->y_up, r0, r1);
	for (uint32_t t = 0; t < j->n; t++) {
		const size_t o = t * j->ystride + r0;

		j->k->silu_mul(j->y + o, j->y_up + o, j->h + o, r1 - r0);
	}
	return 0;
}

/* Experts [0, count) of a layer run (count <= LAYER_EXPERTS), vectors and outputs from x, out. */
static int experts_run(struct engine_impl *ei, const struct mp_guard *g, enum mp_dtype dt,
		       const void *const *w, uint32_t count, uint32_t hidden, uint32_t ffn,
		       const float *x, const uint32_t *m, uint32_t vectors, float *out,
		       bool packed)
{
	const size_t mat = ffn * mp_dtype_bytes(dt, hidden), act = (size_t)vectors * ffn;
	const bool prep = xprep_floats(ei, dt, 1, 1);
	float *buf = engine_scratch(ei, 3 * act + (prep ? (size_t)vectors * MP_MAX(hidden, ffn) : 0));
	struct rows_job up[LAYER_EXPERTS], down[LAYER_EXPERTS];
	float *xp[LAYER_EXPERTS];
	int err;

	if (!buf)
		return -ENOMEM;
	for (uint32_t i = 0, t = 0; i < count; t += m[i++]) {
		float *gate = buf + (size_t)t * ffn;

		xp[i] = buf + 3 * act + (size_t)t * MP_MAX(hidden, ffn);
		up[i] = (struct rows_job){
			.dt = dt, .w = w[i], .rows = ffn, .cols = hidden, .x = x + (size_t)t * hidden,
			.n = m[i], .y = gate, .ystride = ffn, .w_up = (const char *)w[i] + mat,
			.y_up = gate + act, .h = gate + 2 * act, .packed = packed,
		};
		down[i] = (struct rows_job){
			.dt = dt, .w = (const char *)w[i] + 2 * mat, .rows = hidden, .cols = ffn,
			.x = gate + 2 * act, .n = m[i], .y = out + (size_t)t * hidden,
			.ystride = hidden, .packed = packed,
		};
	}
	err = run_jobs(ei, g, up, count, gate_up_chunk, xp);
	return err ? err : run_jobs(ei, g, down, count, rows_chunk, xp);
}

int ref_experts_ffn_as(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
		       const void *const *w, uint32_t count, uint32_t hidden, uint32_t ffn,
		       const float *x, const uint32_t *m, float *out, bool packed)
{
	struct engine_impl *ei = engine_impl(e);
	const size_t per_vector = 3 * (size_t)ffn + (xprep_floats(ei, dt, 1, 1) ?
						     MP_MAX(hidden, ffn) : 0);

	for (uint32_t i = 0; i < count;) {
		uint32_t c = 0, vectors = 0;
		int err;

		/* As many experts as fit the run's caps, one at least. */
		while (i + c < count && c < LAYER_EXPERTS &&
		       (!c || (vectors + m[i + c]) * per_vector <= LAYER_SCRATCH_FLOATS))
			vectors += m[i + c++];
		err = experts_run(ei, g, dt, w + i, c, hidden, ffn, x, m + i, vectors, out,
				  packed);
		if (err)
			return err;
		x += (size_t)vectors * hidden;
		out += (size_t)vectors * hidden;
		i += c;
	}
	return 0;
}

static int ref_expert_ffn(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
			  const void *w, uint32_t hidden, uint32_t ffn, const float *x, uint32_t n,
			  float *out)
{
	return ref_experts_ffn_as(e, g, dt, &w, 1, hidden, ffn, x, &n, out, false);
}

static int ref_rmsnorm(struct mp_engine *e, const float *x, const float *weight, uint32_t dim,
		       uint32_t n, float eps, float *y)
{
	const struct mp_kernels *k = engine_impl(e)->kern;

	for (uint32_t t = 0; t < n; t++) {
		const float *xt = x + (size_t)t * dim;
		float *yt = y + (size_t)t * dim;
		float scale = 1.0f / sqrtf(k->dot(xt, xt, dim) / (float)dim + eps);

		for (uint32_t i = 0; i < dim; i++)
			yt[i] = xt[i] * scale * weight[i];
	}
	return 0;
}

static int ref_topk(struct mp_engine *e, const float *logits, uint32_t experts, uint32_t k,
		    uint32_t *ids, float *weights)
{
	float max, sum = 0.0f;

	(void)e;
	for (uint32_t i = 0; i < k; i++) {
		uint32_t best = UINT32_MAX;

		for (uint32_t x = 0; x < experts; x++) {
			bool taken = false;

			for (uint32_t p = 0; p < i && !taken; p++)
				taken = ids[p] == x;
			/* Strictly greater keeps the lower id on ties. */
			if (!taken && (best == UINT32_MAX || logits[x] > logits[best]))
				best = x;
		}
		ids[i] = best;
	}
	max = logits[ids[0]];
	for (uint32_t i = 0; i < k; i++) {
		weights[i] = expf(logits[ids[i]] - max);
		sum += weights[i];
	}
	for (uint32_t i = 0; i < k; i++)
		weights[i] /= sum;
	return 0;
}

/* Positions the RoPE table grows to at most: 16 MiB at head_dim 128. */
#define ROPE_TABLE_MAX_POS	(1u << 15)

/* The angle's cos and sin as floats. In double: an f32 angle is off by ~pos * 2^-24 rad. */
static void rope_cs(double pos, uint32_t j, uint32_t head_dim, float theta, float *cs)
{
	double angle = pos * pow((double)theta, -2.0 * j / head_dim);

	cs[0] = (float)cos(angle);
	cs[1] = (float)sin(angle);
}

/*
 * The table's cos and sin of positions [pos0, pos0 + n), grown to cover
 * them, or NULL when they lie past its cap or memory is short (the caller
 * then computes them per call: the same floats).
 */
static const float *rope_table(struct engine_impl *ei, uint32_t pos0, uint32_t n,
			       uint32_t head_dim, float theta)
{
	const uint32_t half = head_dim / 2;
	uint64_t end = (uint64_t)pos0 + n;
	uint32_t npos;
	float *t;

	if (ei->rope_head_dim != head_dim || ei->rope_theta != theta) {
		free(ei->rope_cs);
		ei->rope_cs = NULL;
		ei->rope_npos = 0;
		ei->rope_head_dim = head_dim;
		ei->rope_theta = theta;
	}
	if (end <= ei->rope_npos)
		return ei->rope_cs + (size_t)pos0 * half * 2;
	if (end > ROPE_TABLE_MAX_POS)
		return NULL;
	npos = (uint32_t)MP_MIN(MP_MAX(end, 2ull * ei->rope_npos), ROPE_TABLE_MAX_POS);
	npos = MP_MAX(npos, 256u);
	t = realloc(ei->rope_cs, (size_t)npos * half * 2 * sizeof(float));
	if (!t)
		return NULL;
	for (uint32_t p = ei->rope_npos; p < npos; p++)
		for (uint32_t j = 0; j < half; j++)
			rope_cs(p, j, head_dim, theta, t + ((size_t)p * half + j) * 2);
	ei->rope_cs = t;
	ei->rope_npos = npos;
	return t + (size_t)pos0 * half * 2;
}

static int ref_rope(struct mp_engine *e, float *x, uint32_t n, uint32_t heads, uint32_t head_dim,
		    uint32_t pos0, float theta)
{
	const uint32_t half = head_dim / 2;
	const float *table = rope_table(engine_impl(e), pos0, n, head_dim, theta);

	for (uint32_t t = 0; t < n; t++) {
		float *xt = x + (size_t)t * heads * head_dim;

		for (uint32_t j = 0; j < half; j++) {
			float cs[2];
			const float *p = cs;

			if (table)
				p = table + ((size_t)t * half + j) * 2;
			else
				rope_cs((double)pos0 + t, j, head_dim, theta, cs);
			for (uint32_t h = 0; h < heads; h++) {
				float *xh = xt + (size_t)h * head_dim;
				float a = xh[j], b = xh[j + half];

				xh[j] = a * p[0] - b * p[1];
				xh[j + half] = a * p[1] + b * p[0];
			}
		}
	}
	return 0;
}

struct attn_job {
	const struct mp_attention *a;
	struct engine_impl *ei;
	uint32_t items;		/* n x heads */
	uint32_t nchunks;
};

static void attend(const struct attn_job *j, uint32_t item, float *scores)
{
	const struct mp_attention *a = j->a;
	const struct mp_kernels *k = j->ei->kern;
	const uint32_t t = item / a->heads, h = item % a->heads;
	const uint32_t kvh = h / (a->heads / a->kv_heads);
	const size_t kv_row = (size_t)a->kv_heads * a->head_dim;
	const uint32_t len = a->pos0 + t + 1;
	const float *q = a->q + ((size_t)t * a->heads + h) * a->head_dim;
	float *out = a->out + ((size_t)t * a->heads + h) * a->head_dim;
	const float scale = 1.0f / sqrtf((float)a->head_dim);
	float max = -INFINITY, sum = 0.0f;

	for (uint32_t p = 0; p < len; p++) {
		scores[p] = k->dot(q, a->k_cache + p * kv_row + (size_t)kvh * a->head_dim,
				   a->head_dim) * scale;
		max = fmaxf(max, scores[p]);
	}
	for (uint32_t p = 0; p < len; p++) {
		scores[p] = expf(scores[p] - max);
		sum += scores[p];
	}
	memset(out, 0, a->head_dim * sizeof(float));
	for (uint32_t p = 0; p < len; p++)
		k->axpy(scores[p] / sum, a->v_cache + p * kv_row + (size_t)kvh * a->head_dim, out,
			a->head_dim);
}

static int attn_chunk(void *arg, uint32_t chunk, uint32_t worker)
{
	const struct attn_job *j = arg;
	uint32_t i0 = (uint32_t)((uint64_t)j->items * chunk / j->nchunks);
	uint32_t i1 = (uint32_t)((uint64_t)j->items * (chunk + 1) / j->nchunks);

	for (uint32_t i = i0; i < i1; i++)
		attend(j, i, j->ei->wbuf[worker]);
	return 0;
}

static int ref_attention(struct mp_engine *e, const struct mp_attention *a)
{
	struct engine_impl *ei = engine_impl(e);
	struct attn_job j = { .a = a, .ei = ei, .items = a->n * a->heads };
	uint64_t bytes = 2ull * (a->pos0 + a->n) * a->kv_heads * a->head_dim * sizeof(float) *
			 (a->heads / a->kv_heads);
	int err = engine_worker_scratch(ei, (size_t)a->pos0 + a->n);

	if (err)
		return err;
	j.nchunks = bytes < INLINE_BYTES ? 1 : MP_MIN(j.items, e->threads * CHUNKS_PER_THREAD);
	return mp_pool_run(ei->pool, NULL, j.nchunks, attn_chunk, &j);
}

static int init_isa(struct mp_engine *e, enum mp_isa isa, const char *what)
{
	const struct mp_kernels *k = mp_kernels_for(isa);

	if (!k)
		return mp_err(-EOPNOTSUPP, "engine %s: this CPU (or build) has no %s", e->ops->name,
			      what);
	engine_impl(e)->kern = k;
	return 0;
}

static int ref_init(struct mp_engine *e)
{
	return init_isa(e, mp_isa_best(), "vector unit");
}

static int ref_scalar_init(struct mp_engine *e)
{
	return init_isa(e, MP_ISA_SCALAR, "scalar path");
}

static int ref_avx2_init(struct mp_engine *e)
{
	return init_isa(e, MP_ISA_AVX2, "AVX2+FMA+F16C");
}

static int ref_avx512_init(struct mp_engine *e)
{
	return init_isa(e, MP_ISA_AVX512, "AVX-512 F+BW+VL");
}

static int ref_amx_init(struct mp_engine *e)
{
	int why = mp_isa_amx_check();

	/* The CPU has it and the kernel said no: say why (a filter's EPERM, say). */
	if (why && why != -ENODEV)
		return mp_err(-EOPNOTSUPP, "engine %s: this CPU has AMX-BF16, but the kernel "
			      "refused this process the tile data state (arch_prctl "
			      "ARCH_REQ_XCOMP_PERM: %s)", e->ops->name, strerror(-why));
	return init_isa(e, MP_ISA_AMX,
			"AMX-BF16 (cpuid amx_tile and amx_bf16, and the kernel's permission "
			"for tile data: arch_prctl ARCH_REQ_XCOMP_PERM)");
}

static int ref_bf16_init(struct mp_engine *e)
{
	return init_isa(e, MP_ISA_BF16, "AVX512-BF16 (cpuid avx512_bf16, leaf 7 subleaf 1 "
			"EAX bit 5, with AVX-512 F+BW+VL)");
}

#define REF_OPS(sym, nm, desc, initfn)						\
const struct mp_engine_ops sym = {						\
	.abi = MP_ENGINE_ABI,							\
	.name = nm,								\
	.description = desc,							\
	.init = initfn,								\
	.matvec = ref_matvec,							\
	.matmul = ref_matmul,							\
	.expert_ffn = ref_expert_ffn,						\
	.rmsnorm = ref_rmsnorm,							\
	.topk = ref_topk,							\
	.rope = ref_rope,							\
	.attention = ref_attention,						\
}

REF_OPS(mp_ref_ops, "ref", "reference CPU engine, widest ISA of this CPU", ref_init);
REF_OPS(mp_ref_scalar_ops, "ref-scalar", "reference CPU engine, portable C", ref_scalar_init);
REF_OPS(mp_ref_avx2_ops, "ref-avx2", "reference CPU engine, AVX2+FMA", ref_avx2_init);
REF_OPS(mp_ref_avx512_ops, "ref-avx512", "reference CPU engine, AVX-512", ref_avx512_init);
REF_OPS(mp_ref_amx_ops, "ref-amx",
	"reference CPU engine, AVX-512 with bf16 weights' products on AMX over bf16-rounded "
	"activations (not the bits of ref)", ref_amx_init);
REF_OPS(mp_ref_bf16_ops, "ref-bf16",
	"reference CPU engine, AVX-512 with bf16 weights' products on AVX512-BF16 (vdpbf16ps) "
	"over bf16-rounded activations (not the bits of ref)", ref_bf16_init);

// SPDX-License-Identifier: MIT
/*
 * The OpenBLAS engine plug-in: products by cblas_sgemv over weight blocks widened to f32
 * (a proof of the plug-in interface); the other ops fall back to the reference engine.
 */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/engine.h>

/* Widened weights per block: small enough to stay in L2 next to the activations. */
#define BLOCK_FLOATS	(64u << 10)
#define CHUNKS_PER_THREAD 4u
/* Products smaller than this run as one chunk on the caller. */
#define INLINE_BYTES	(48u << 10)

struct blas_state {
	uint32_t threads;
	float **wbuf;		/* one widened block per worker */
	size_t wbuf_len;
	float *act;		/* expert activations (gate, up, h) */
	size_t act_len;
};

struct product {
	struct mp_engine *e;
	struct blas_state *bs;
	enum mp_dtype dt;
	const void *w;
	uint32_t rows, cols, n, nchunks, block_rows;
	const float *x;
	float *y;
	size_t ldy;
};

/*
 * Bytes of a row of cols elements. The plug-in does not link libmoepager
 * (mp_dtype_bytes()); the engine checked that block types' rows are whole
 * blocks of MP_QBLOCK. Block types are widened by host->to_f32 like f16 and
 * bf16: the widened floats are exactly the reference engine's.
 */
static size_t row_bytes(enum mp_dtype dt, uint32_t cols)
{
	switch (dt) {
	case MP_DTYPE_F32:
		return (size_t)cols * 4;
	case MP_DTYPE_Q8_0:
		return (size_t)cols / MP_QBLOCK * (2 + MP_QBLOCK);
	case MP_DTYPE_Q4_0:
		return (size_t)cols / MP_QBLOCK * (2 + MP_QBLOCK / 2);
	default:
		return (size_t)cols * 2;
	}
}

static int product_chunk(void *arg, uint32_t chunk, uint32_t worker)
{
	const struct product *p = arg;
	const size_t rowb = row_bytes(p->dt, p->cols);
	uint32_t r0 = (uint32_t)((uint64_t)p->rows * chunk / p->nchunks);
	uint32_t r1 = (uint32_t)((uint64_t)p->rows * (chunk + 1) / p->nchunks);

	for (uint32_t r = r0; r < r1; r += p->block_rows) {
		uint32_t br = r1 - r < p->block_rows ? r1 - r : p->block_rows;
		const void *src = (const char *)p->w + r * rowb;
		const float *wf = src;

		if (p->dt != MP_DTYPE_F32) {
			p->e->host->to_f32(p->e, p->dt, src, p->bs->wbuf[worker],
					   (size_t)br * p->cols);
			wf = p->bs->wbuf[worker];
		}
		/*
		 * One sgemv per vector over the block (in L2 after the first):
		 * sgemm's result for a vector depends on how many come with it,
		 * and a batched decode must give each sequence its lone bits.
		 */
		for (uint32_t t = 0; t < p->n; t++)
			cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)br, (int)p->cols, 1.0f, wf,
				    (int)p->cols, p->x + (size_t)t * p->cols, 1, 0.0f,
				    p->y + (size_t)t * p->ldy + r, 1);
	}
	return 0;
}

static int grow(float **buf, size_t *len, size_t floats)
{
	float *b;

	if (*len >= floats)
		return 0;
	b = malloc(floats * sizeof(float));
	if (!b)
		return -ENOMEM;
	free(*buf);
	*buf = b;
	*len = floats;
	return 0;
}

static int product(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
		   const void *w, uint32_t rows, uint32_t cols, const float *x, uint32_t n,
		   float *y, size_t ldy)
{
	struct blas_state *bs = e->priv;
	struct product p = {
		.e = e, .bs = bs, .dt = dt, .w = w, .rows = rows, .cols = cols, .n = n, .x = x,
		.y = y, .ldy = ldy,
	};
	uint64_t bytes = (uint64_t)rows * row_bytes(dt, cols);

	p.block_rows = cols >= BLOCK_FLOATS ? 1 : BLOCK_FLOATS / cols;
	p.nchunks = bytes < INLINE_BYTES ? 1 : bs->threads * CHUNKS_PER_THREAD;
	if (p.nchunks > rows)
		p.nchunks = rows;
	if (dt != MP_DTYPE_F32) {
		size_t need = (size_t)(p.block_rows < rows ? p.block_rows : rows) * cols;

		for (uint32_t i = 0; i < bs->threads; i++) {
			size_t len = bs->wbuf_len;

			if (grow(&bs->wbuf[i], &len, need))
				return e->host->err(-ENOMEM, "engine openblas: out of memory");
		}
		if (need > bs->wbuf_len)
			bs->wbuf_len = need;
	}
	return e->host->parallel(e, g, p.nchunks, product_chunk, &p);
}

static int blas_matmul(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
		       const void *w, uint32_t rows, uint32_t cols, const float *x, uint32_t n,
		       float *y)
{
	return product(e, g, dt, w, rows, cols, x, n, y, rows);
}

static int blas_matvec(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
		       const void *w, uint32_t rows, uint32_t cols, const float *x, float *y)
{
	return product(e, g, dt, w, rows, cols, x, 1, y, rows);
}

static int blas_expert_ffn(struct mp_engine *e, const struct mp_guard *g, enum mp_dtype dt,
			   const void *w, uint32_t hidden, uint32_t ffn, const float *x,
			   uint32_t n, float *out)
{
	struct blas_state *bs = e->priv;
	const size_t mat = ffn * row_bytes(dt, hidden), act = (size_t)n * ffn;
	float *gate, *up;
	int err;

	if (grow(&bs->act, &bs->act_len, 2 * act))
		return e->host->err(-ENOMEM, "engine openblas: out of memory");
	gate = bs->act;
	up = bs->act + act;
	err = product(e, g, dt, w, ffn, hidden, x, n, gate, ffn);
	if (!err)
		err = product(e, g, dt, (const char *)w + mat, ffn, hidden, x, n, up, ffn);
	if (err)
		return err;
	for (size_t i = 0; i < act; i++)
		gate[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
	return product(e, g, dt, (const char *)w + 2 * mat, hidden, ffn, gate, n, out, hidden);
}

static void blas_fini(struct mp_engine *e)
{
	struct blas_state *bs = e->priv;

	if (!bs)
		return;
	for (uint32_t i = 0; bs->wbuf && i < bs->threads; i++)
		free(bs->wbuf[i]);
	free(bs->wbuf);
	free(bs->act);
	free(bs);
	e->priv = NULL;
}

static int blas_init(struct mp_engine *e)
{
	struct blas_state *bs = calloc(1, sizeof(*bs));

	if (!bs)
		return e->host->err(-ENOMEM, "engine openblas: out of memory");
	bs->threads = e->threads;
	bs->wbuf = calloc(e->threads, sizeof(*bs->wbuf));
	if (!bs->wbuf) {
		free(bs);
		return e->host->err(-ENOMEM, "engine openblas: out of memory");
	}
	e->priv = bs;
	/* The engine's pool splits the rows; OpenBLAS threads on top would oversubscribe. */
	openblas_set_num_threads(1);
	return 0;
}

MP_API const struct mp_engine_ops mp_engine_plugin_ops = {
	.abi = MP_ENGINE_ABI,
	.name = "openblas",
	.description = "OpenBLAS sgemv/sgemm over f32-widened weight blocks",
	.init = blas_init,
	.fini = blas_fini,
	.matvec = blas_matvec,
	.matmul = blas_matmul,
	.expert_ffn = blas_expert_ffn,
};

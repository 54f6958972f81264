// SPDX-License-Identifier: MIT
/*
 * bf16 products on AMX (TDPBF16PS) over activations rounded to bf16: the
 * opt-in kernels of engine ref-amx. At 8-16 vectors the f32-activation bf16
 * gemm is compute-bound on one 512-bit FMA unit; a tile product does 16 x 16
 * x 32 multiply-adds in one instruction.
 */
#include <immintrin.h>
#include <stdalign.h>
#include <string.h>

#include "engine/kernels.h"
#include "engine/kern_bf16r.h"
#include "base/base.h"

#define TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")))
/* The tile intrinsics are asm without a memory operand: order our stores before their loads. */
#define MEM_BARRIER() __asm__ volatile("" ::: "memory")

/* The 64-byte operand of LDTILECFG (palette 1). */
struct tilecfg {
	uint8_t palette;
	uint8_t start_row;
	uint8_t reserved[14];
	uint16_t colsb[16];
	uint8_t rows[16];
};

/*
 * Tiles: C accumulates 16 (or the last mt) weight rows x a group of
 * vectors; A is 16 (mt) rows x 32 columns of weights, loaded straight from
 * the row-major matrix; B the group's activations for those 32 columns as
 * 16 column pairs x vectors x 2. "P" tiles are for the last, partial group
 * of np vectors, "T" ones for the last mt rows: every shape of a call has its
 * tiles, so one LDTILECFG per call. Macros: the intrinsics paste the number into a register name.
 */
#define T_C	0
#define T_CP	1
#define T_A	2
#define T_B	3
#define T_BP	4
#define T_AT	5
#define T_CT	6
#define T_CTP	7

static void tile_set(struct tilecfg *cfg, int t, uint32_t rows, uint32_t colsb)
{
	if (!rows || !colsb)
		rows = colsb = 0;	/* an unused tile */
	cfg->rows[t] = (uint8_t)rows;
	cfg->colsb[t] = (uint16_t)colsb;
}

/*
 * Up to 32 columns of one vector (left of them, the rest zero) as 16 bf16
 * pairs, scattered to pair k's word of the vector: out[k * ng].
 */
static inline TARGET void pairs_out(const float *xt, uint32_t left, uint32_t ng, uint32_t *out)
{
	const uint32_t lo = left < 16 ? left : 16, hi = left - lo;
	const __m512 a = _mm512_maskz_loadu_ps((__mmask16)((1u << lo) - 1), xt);
	const __m512 b = _mm512_maskz_loadu_ps((__mmask16)((1u << hi) - 1), xt + 16);
	const __m512i h = _mm512_inserti64x4(_mm512_castsi256_si512(
						     _mm512_cvtepi32_epi16(mp_round_bf16(a))),
					     _mm512_cvtepi32_epi16(mp_round_bf16(b)), 1);
	const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
								 10, 11, 12, 13, 14, 15),
					       _mm512_set1_epi32((int)ng));
	const uint32_t pairs = (left + 1) / 2;

	_mm512_mask_i32scatter_epi32(out, (__mmask16)((1u << pairs) - 1), idx, h, 4);
}

/*
 * Vectors t = g * 16 .. of a group of ng (16, the last one n % 16) go to
 * out + g * 16 * cols as bf16 pairs, word [k][j] = (x[j][2k], x[j][2k + 1])
 * for k < cols / 2 rounded up (an odd last column pairs with zero): B tiles
 * of 16 rows of ng words. A group takes at most the floats its vectors had.
 */
TARGET void mp_amx_xprep_bf16(const float *x, uint32_t n, uint32_t cols, float *out)
{
	for (uint32_t t0 = 0; t0 < n; t0 += MP_AMX_GROUP) {
		const uint32_t ng = n - t0 < MP_AMX_GROUP ? n - t0 : MP_AMX_GROUP;
		uint32_t *g = (uint32_t *)(out + (size_t)t0 * cols);

		for (uint32_t j = 0; j < ng; j++) {
			const float *xt = x + (size_t)(t0 + j) * cols;

			for (uint32_t c = 0; c < cols; c += 32)
				pairs_out(xt + c, cols - c < 32 ? cols - c : 32, ng,
					  g + (size_t)c / 2 * ng + j);
		}
	}
}

/*
 * Where a row block prefetches: each of its 16 rows PF_ROW bytes ahead of
 * the column it reads, and past a row's end the same offset into the next
 * 16-row block's rows, so the block's 16 streams run MP_PF_AHEAD bytes
 * ahead in all, as the AVX-512 kernel's 4 do. Prefetches never fault, so
 * those past the last row need no bound.
 */
#define PF_ROW	(MP_PF_AHEAD / 16)

struct pf {
	const char *blk;	/* the 16-row block prefetched into */
	size_t off;		/* the byte offset in its rows */
};

static inline struct pf pf_start(const char *wr, size_t rs)
{
	struct pf p = { wr, PF_ROW };

	while (rs && p.off >= rs) {
		p.off -= rs;
		p.blk += 16 * rs;
	}
	return p;
}

static inline TARGET void pf_step(struct pf *p, size_t rs)
{
	for (uint32_t r = 0; r < 16; r++)
		_mm_prefetch(p->blk + r * rs + p->off, _MM_HINT_T1);
	p->off += 64;
	if (p->off >= rs) {
		p->off -= rs;
		p->blk += 16 * rs;
	}
}

/*
 * C = A x B over all columns of one row block and one group, 32 at a time
 * in order (the last, short block zero-padded), then C to out[16][16]. Each
 * C element is its own row's and vector's sum: the same bits whatever the
 * other rows and vectors of the tile. pf: where to prefetch (first group).
 */
#define DEFINE_BLOCK(name, TC, TA, TB)							\
static TARGET void name(const char *w, size_t rs, uint32_t m, uint32_t cols,		\
			const uint32_t *xg, uint32_t ng, struct pf *pf, float *out)	\
{											\
	alignas(64) uint16_t a[16][32];							\
	alignas(64) uint32_t b[16 * 16];						\
	uint32_t c = 0;									\
											\
	_tile_zero(TC);									\
	for (; c + 32 <= cols; c += 32) {						\
		if (pf)									\
			pf_step(pf, rs);						\
		_tile_loadd(TA, w + (size_t)c * 2, rs);					\
		_tile_loadd(TB, xg + (size_t)c / 2 * ng, ng * 4);			\
		_tile_dpbf16ps(TC, TA, TB);						\
	}										\
	if (c < cols) {									\
		memset(a, 0, sizeof(a));						\
		memset(b, 0, sizeof(b));						\
		for (uint32_t r = 0; r < m; r++)					\
			memcpy(a[r], w + r * rs + (size_t)c * 2, (size_t)(cols - c) * 2); \
		memcpy(b, xg + (size_t)c / 2 * ng, (size_t)(cols - c + 1) / 2 * ng * 4); \
		MEM_BARRIER();								\
		_tile_loadd(TA, a, 64);							\
		_tile_loadd(TB, b, ng * 4);						\
		_tile_dpbf16ps(TC, TA, TB);						\
	}										\
	_tile_stored(TC, out, 64);							\
}

DEFINE_BLOCK(block_full, T_C, T_A, T_B)
DEFINE_BLOCK(block_part, T_CP, T_A, T_BP)
DEFINE_BLOCK(block_tail_full, T_CT, T_AT, T_B)
DEFINE_BLOCK(block_tail_part, T_CTP, T_AT, T_BP)

/*
 * What a call's first row blocks read before their prefetches (from
 * pf_start() of the first block on) reach it: the whole blocks before p.blk
 * and the first p.off bytes of its rows.
 */
static void pf_head(const char *w, size_t rs, uint32_t rows, struct pf p)
{
	const char *end = w + (size_t)rows * rs;

	mp_pf_head(w, MP_MIN((size_t)(p.blk - w), (size_t)(end - w)));
	for (uint32_t r = 0; r < 16 && p.blk + r * rs < end; r++)
		mp_pf_head(p.blk + r * rs, p.off);
}

static TARGET void load_config(uint32_t rows, uint32_t n)
{
	const uint32_t np = n % MP_AMX_GROUP, mt = rows % 16;
	alignas(64) struct tilecfg cfg = { .palette = 1 };

	tile_set(&cfg, T_C, 16, 64);
	tile_set(&cfg, T_CP, 16, np * 4);
	tile_set(&cfg, T_A, 16, 64);
	tile_set(&cfg, T_B, 16, 64);
	tile_set(&cfg, T_BP, 16, np * 4);
	tile_set(&cfg, T_AT, mt, 64);
	tile_set(&cfg, T_CT, mt, 64);
	tile_set(&cfg, T_CTP, mt, np * 4);
	MEM_BARRIER();
	_tile_loadconfig(&cfg);
}

/*
 * y[t * ystride + r] for the n vectors mp_amx_xprep_bf16() laid out at x:
 * 16-row blocks in order, each against every group. The tile configuration
 * is this thread's (each pool worker loads its own) and released at the end,
 * so the thread carries no tile state between calls.
 */
TARGET void mp_amx_gemm_bf16(const void *w, uint32_t rows, uint32_t cols, const float *x,
			     uint32_t n, float *y, size_t ystride)
{
	const size_t rs = MP_ROW_bf16(cols);
	alignas(64) float out[16 * 16];

	if (!rows || !n)
		return;
	load_config(rows, n);
	pf_head(w, rs, rows, pf_start(w, rs));
	for (uint32_t r = 0; r < rows; r += 16) {
		const uint32_t m = rows - r < 16 ? rows - r : 16;
		const char *wr = (const char *)w + r * rs;
		struct pf pf = pf_start(wr, rs);

		for (uint32_t t = 0; t < n; t += MP_AMX_GROUP) {
			const uint32_t ng = n - t < MP_AMX_GROUP ? n - t : MP_AMX_GROUP;
			const uint32_t *xg = (const uint32_t *)(x + (size_t)t * cols);
			struct pf *p = t == 0 ? &pf : NULL;

			if (m == 16)
				(ng == MP_AMX_GROUP ? block_full : block_part)(wr, rs, m, cols, xg,
									       ng, p, out);
			else
				(ng == MP_AMX_GROUP ? block_tail_full : block_tail_part)(
					wr, rs, m, cols, xg, ng, p, out);
			for (uint32_t i = 0; i < m; i++)
				for (uint32_t j = 0; j < ng; j++)
					y[(t + j) * ystride + r + i] = out[i * 16 + j];
		}
	}
	_tile_release();
}

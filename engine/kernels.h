/* SPDX-License-Identifier: MIT */
/* Inner loops of the reference engine, one table per ISA, picked at run time. */
#ifndef MP_KERNELS_H
#define MP_KERNELS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include <moepager/common.h>

/* Weight rows the kernels process together (the dot kernels' register blocking). */
#define MP_KERN_ROWS	4u

/* Bytes of a block of the block types. */
#define MP_Q8_0_BYTES	(2 + MP_QBLOCK)
#define MP_Q4_0_BYTES	(2 + MP_QBLOCK / 2)

/* Bytes of a row of cols elements of each type (cols whole blocks for q8_0, q4_0). */
#define MP_ROW_f32(cols)	((size_t)(cols) * 4)
#define MP_ROW_f16(cols)	((size_t)(cols) * 2)
#define MP_ROW_bf16(cols)	((size_t)(cols) * 2)
#define MP_ROW_q8_0(cols)	((size_t)(cols) / MP_QBLOCK * MP_Q8_0_BYTES)
#define MP_ROW_q4_0(cols)	((size_t)(cols) / MP_QBLOCK * MP_Q4_0_BYTES)
/* The offset of column c in a block of 4 rows, for the vector GEMVs' prefetches. */
#define MP_PF_OFF(type, c)	((size_t)(c) * 4 * MP_ROW_##type(MP_QBLOCK) / MP_QBLOCK)
/*
 * How far ahead of its reads a gemm prefetches its weights, into L2: a
 * 4-row block is read as four interleaved streams of short rows, on which
 * the hardware prefetcher ramps up too late. Measured on the 2-core VM
 * (bf16, 3584 x 1024 and 1024 x 3584, one vector, 2 threads), of a
 * read-sum's bandwidth: no prefetch 0.70, the next 4-row block into L1
 * 0.63, 8 to 32 KiB ahead into L2 0.86-0.89.
 */
#define MP_PF_AHEAD		(16u << 10)
/*
 * The packed kernels' prefetch by the vectors' count (kernels.h's layout:
 * each 4-row group one stream). One vector: none, the hardware's prefetcher
 * follows the stream best. Two: every line MP_PF_AHEAD on; ref-bf16's
 * VDPBF16PS, whose step is short, only a block's first line (the
 * hardware's fetches the rest). Three or more: every line MP_PF_AHEAD on,
 * and every line again MP_PF_NEAR on into L1, where the vectors of a long
 * row (ffn's 3584 columns: 7 KiB each) evict what the far prefetch brought
 * before it is read. Experts of mixtral-mini's shape from memory, one
 * thread, GB/s (docs/engine.md "Session 36"): ref-bf16 2 vectors 18.5 ->
 * 26.7 against every line prefetched, 4 18.4 -> 19.5, 8 12.2 -> 14.7; ref
 * 3 vectors 19.0 -> 22.6, 4 20.1 -> 21.5 (2 vectors: 18.6 -> 15.3 with the
 * first line only, so ref keeps every line). ref-bf16 at three or more on
 * Zen 5: the near lead only, MP_PF_NEAR_BF16 on (below).
 */
#define MP_PF_NEAR		2048u
/*
 * ref-bf16's packed kernel at three or more vectors on Zen 5 (docs/engine.md
 * "Session 38"): only the L1 lead, this far on (the far one into L2 lost
 * 10-25 % there at 3-16 vectors, two threads from memory).
 */
#define MP_PF_NEAR_BF16		4096u

/*
 * Prefetches (into L2) the first bytes of a gemm call's weights: those its
 * first row blocks read before their own prefetches, MP_PF_AHEAD or more on,
 * reach. Each engine chunk is a call, so without this every chunk would start
 * with them read on demand.
 */
static inline void mp_pf_head(const void *w, size_t bytes)
{
	for (size_t o = 0; o < bytes; o += 64)
		__builtin_prefetch((const char *)w + o, 0, 2);
}

/*
 * Element i of a block-type row as f32: (float)q * d, the value
 * mp_dtype_to_f32() gives (a row is whole blocks, so i counts blocks from
 * the row's start). The scalar kernels' loads and the vector ones' tails.
 */
static inline float mp_block_scale(const uint8_t *b)
{
	return mp_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
}

static inline float mp_q8_0_at(const void *w, size_t i)
{
	const uint8_t *b = (const uint8_t *)w + i / MP_QBLOCK * MP_Q8_0_BYTES;

	return (float)(int8_t)b[2 + i % MP_QBLOCK] * mp_block_scale(b);
}

static inline float mp_q4_0_at(const void *w, size_t i)
{
	const uint8_t *b = (const uint8_t *)w + i / MP_QBLOCK * MP_Q4_0_BYTES;
	const uint32_t j = i % MP_QBLOCK;
	const int q = j < MP_QBLOCK / 2 ? b[2 + j] & 15 : b[2 + j - MP_QBLOCK / 2] >> 4;

	return (float)(q - 8) * mp_block_scale(b);
}

/*
 * The packed layout of a bf16 matrix: the kernels' register tile reads
 * MP_KERN_ROWS rows side by side, 32 columns (64 bytes) of each a step, so
 * row-major weights reach it as several streams a page (a 2 KiB row: two
 * in each 4 KiB page), which the hardware prefetcher follows badly
 * (docs/engine.md "Session 33"). Packed, each group of MP_KERN_ROWS rows
 * (the last group: what is left) keeps its bytes in place as a whole, but
 * lays each 32-column block of its R rows side by side, row 0's 64 bytes
 * first, in one R x 64-byte stretch, the blocks in column order, then the
 * columns past the last whole block (cols % 32) row after row. A group is
 * then one stream, read front to back, and it starts where it does
 * row-major (row r of a group of 4 is at r * rowbytes either way), so
 * chunks and blocks of 4-row-aligned rows are packed matrices themselves.
 * The same size as the row-major matrix.
 */
void mp_pack_bf16(const void *src, uint32_t rows, uint32_t cols, void *dst);

/*
 * The expert FFN's SwiGLU for one element: silu(g) * u, g / (1 + expf(-g))
 * * u in float. Every table's silu_mul gives these bits.
 */
static inline float mp_silu_mul1(float g, float u)
{
	return g / (1.0f + expf(-g)) * u;
}

/* The argmax kernel's semantics as one plain scan: the tests' reference. */
static inline uint32_t mp_argmax_scan(const float *x, uint32_t n)
{
	uint32_t best = 0;

	for (uint32_t i = 1; i < n; i++)
		if (x[i] > x[best])
			best = i;
	return best;
}

/* h[i] = mp_silu_mul1(g[i], u[i]) for i < n: the scalar loop. */
void mp_silu_mul_scalar(const float *g, const float *u, float *h, uint32_t n);

typedef void (*mp_gemm_fn)(const void *w, uint32_t rows, uint32_t cols, const float *x,
			   uint32_t n, float *y, size_t ystride);

struct mp_kernels {
	const char *isa;
	/*
	 * y[t * ystride + r] = <w row r, x + t * cols> for r < rows, t < n; w
	 * holds rows x cols elements of one type. Each weight is read from
	 * memory once for all n vectors, and each product adds its terms in
	 * one order whatever n is: a vector's products are the same bits alone
	 * (n = 1, the GEMV) and in a batch. The vectors are in the order
	 * xprep[type] puts them in, when it is not NULL.
	 */
	mp_gemm_fn gemm[MP_DTYPE_COUNT];
	/*
	 * The same products, the same bits, over w in the packed layout
	 * (mp_pack_bf16() below) instead of row-major; NULL: no packed kernel
	 * for the type (the engine keeps such weights row-major).
	 */
	mp_gemm_fn gemm_packed[MP_DTYPE_COUNT];
	/*
	 * Rearranges n vectors of cols floats (x to out, the same size) into
	 * the order gemm[type] reads them in; NULL: as they are.
	 */
	void (*xprep[MP_DTYPE_COUNT])(const float *x, uint32_t n, uint32_t cols, float *out);
	/*
	 * Vectors the xprep order lays out together (0: each on its own). A
	 * gemm call's vectors then start at a multiple of it: x + t * cols of
	 * the prepared vectors is vector t's group only when t is one.
	 */
	uint32_t xgroup;
	/* dst[i] = (float)src[i] */
	void (*widen[MP_DTYPE_COUNT])(const void *src, float *dst, size_t n);
	float (*dot)(const float *a, const float *b, uint32_t n);
	/* y += a * x */
	void (*axpy)(float a, const float *x, float *y, uint32_t n);
	/* Sum of a buffer's 32-bit words as floats (bytes a multiple of 64), to measure reads. */
	float (*read_sum)(const void *buf, size_t bytes);
	/*
	 * h[i] = mp_silu_mul1(g[i], u[i]) for i < n, the same bits on every
	 * ISA: AVX-512 computes expf 16 lanes at a time (kern_avx512.c) with
	 * glibc's bits.
	 */
	void (*silu_mul)(const float *g, const float *u, float *h, uint32_t n);
	/*
	 * The lowest i whose x[i] is greater than every x[j], j < i, and not
	 * less than any after: the first index of the largest value, the one
	 * a scan keeping the first strictly greater value returns. A NaN is
	 * never greater (x[0] NaN: 0), -0 equals +0; n = 0: 0. Greedy
	 * decoding's next token (mp_logits_argmax()).
	 */
	uint32_t (*argmax)(const float *x, uint32_t n);
};

/*
 * Defines an ISA's table from the static functions every kern_*.c file
 * names alike (gemm_f32, widen_bf16, dot, axpy, read_sum, silu_mul), so the
 * three tables cannot drift apart; xprep_bf16 is the file's bf16 vector
 * order (or NULL). The block types' gemm takes cols, and widen n, in whole
 * blocks of MP_QBLOCK: the engine's entry points refuse other shapes.
 */
#define MP_KERNELS_DEFINE(sym, isa_name, xprep_bf16, gemm_packed_bf16)			\
	MP_KERNELS_DEFINE_BF16(sym, isa_name, xprep_bf16, gemm_bf16, 0, gemm_packed_bf16)
/*
 * The same with another bf16 product (its own vector order and groups), and
 * its packed kernel (or NULL).
 */
#define MP_KERNELS_DEFINE_BF16(sym, isa_name, xprep_bf16, gemm_bf16_fn, xgroup_bf16,	\
			       gemm_packed_bf16_fn)					\
	const struct mp_kernels sym = {							\
		.isa = isa_name,							\
		.xprep = { [MP_DTYPE_BF16] = xprep_bf16 },				\
		.xgroup = xgroup_bf16,							\
		.gemm = { [MP_DTYPE_F32] = gemm_f32, [MP_DTYPE_F16] = gemm_f16,		\
			  [MP_DTYPE_BF16] = gemm_bf16_fn, [MP_DTYPE_Q8_0] = gemm_q8_0,	\
			  [MP_DTYPE_Q4_0] = gemm_q4_0 },				\
		.gemm_packed = { [MP_DTYPE_BF16] = gemm_packed_bf16_fn },		\
		.widen = { [MP_DTYPE_F32] = widen_f32, [MP_DTYPE_F16] = widen_f16,	\
			   [MP_DTYPE_BF16] = widen_bf16, [MP_DTYPE_Q8_0] = widen_q8_0,	\
			   [MP_DTYPE_Q4_0] = widen_q4_0 },				\
		.dot = dot,								\
		.axpy = axpy,								\
		.read_sum = read_sum,							\
		.silu_mul = silu_mul,							\
		.argmax = argmax,							\
	}

extern const struct mp_kernels mp_kernels_scalar;
#if defined(__x86_64__)
#define MP_HAVE_X86_KERNELS 1
extern const struct mp_kernels mp_kernels_avx2;
extern const struct mp_kernels mp_kernels_avx512;
extern const struct mp_kernels mp_kernels_amx;

/*
 * AMX-BF16 (kern_amx.c): activations rounded to bf16 (mp_f32_to_bf16())
 * and laid out for TDPBF16PS in groups of MP_AMX_GROUP vectors; the
 * products of bf16 weights with them, summed by the tile unit in f32.
 */
#define MP_AMX_GROUP	16u
void mp_amx_xprep_bf16(const float *x, uint32_t n, uint32_t cols, float *out);
void mp_amx_gemm_bf16(const void *w, uint32_t rows, uint32_t cols, const float *x, uint32_t n,
		      float *y, size_t ystride);

/*
 * AVX512-BF16 (kern_bf16.c): activations rounded to bf16 as for AMX, each
 * vector's in column order in the first half of its floats; the products
 * by VDPBF16PS, 32 columns an instruction.
 */
void mp_bf16_xprep(const float *x, uint32_t n, uint32_t cols, float *out);
void mp_bf16_gemm(const void *w, uint32_t rows, uint32_t cols, const float *x, uint32_t n,
		  float *y, size_t ystride);
/* The same over packed weights (mp_pack_bf16()). */
void mp_bf16_gemm_packed(const void *w, uint32_t rows, uint32_t cols, const float *x,
			 uint32_t n, float *y, size_t ystride);
extern const struct mp_kernels mp_kernels_bf16;
#endif

enum mp_isa {
	MP_ISA_SCALAR,
	MP_ISA_AVX2,
	MP_ISA_AVX512,
	/* AVX-512 with bf16 products on AMX over bf16-rounded activations: not the same bits */
	MP_ISA_AMX,
	/* The same with them on AVX512-BF16 (VDPBF16PS): not ref's bits, nor AMX's */
	MP_ISA_BF16,
};

/* The widest ISA this CPU (and OS) supports whose products are the f32 ones (never AMX, BF16). */
enum mp_isa mp_isa_best(void);
/*
 * Whether AMX may be used: 0, -ENODEV when this build or CPU lacks AMX-TILE,
 * AMX-BF16 or AVX-512, else the -errno of the kernel's refusal of the tile
 * data state (arch_prctl ARCH_REQ_XCOMP_PERM).
 */
int mp_isa_amx_check(void);
/*
 * What cpuid says of AVX512-BF16: leaf 7.0 EAX (its last subleaf) and
 * 7.1 EAX (bit 5). Apart from the cpuid calls so that it can be tested.
 */
bool mp_isa_bf16_cpuid(unsigned leaf7_sub_max, unsigned leaf7_1_eax);
/* The kernels of an ISA, or NULL when this build or CPU lacks it. */
const struct mp_kernels *mp_kernels_for(enum mp_isa isa);

#endif /* MP_KERNELS_H */

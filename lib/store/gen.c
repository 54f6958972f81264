// SPDX-License-Identifier: MIT
/* Model generator: preset geometries and deterministic random weights streamed to an .mpk. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <moepager/store.h>

#include "base/base.h"
#include "store/gen.h"
#include "store/layout.h"

static const struct {
	const char *name;
	struct mp_geometry g;
} presets[] = {
	/* 12.6 MB of experts; each is padded to 2 MiB by a hole (a 67 MB sparse file). */
	{ "tiny", {
		.layers = 4, .experts = 8, .topk = 2, .hidden = 128, .ffn = 256,
		.heads = 4, .kv_heads = 2, .head_dim = 32, .vocab = 512, .max_seq = 256,
		.dtype = MP_DTYPE_F32, .rope_theta = 10000.0f, .norm_eps = 1e-5f } },
	/* The geometry of the Mixtral traces, narrowed: ~5.6 GB of experts. */
	{ "mixtral-mini", {
		.layers = 32, .experts = 8, .topk = 2, .hidden = 1024, .ffn = 3584,
		.heads = 16, .kv_heads = 4, .head_dim = 64, .vocab = 32000, .max_seq = 4096,
		.dtype = MP_DTYPE_BF16, .rope_theta = 1e6f, .norm_eps = 1e-5f } },
	/* Many fine-grained experts (6 MiB each, no padding): ~4.8 GB of experts. */
	{ "deepseek-lite-mini", {
		.layers = 12, .experts = 64, .topk = 6, .hidden = 1024, .ffn = 1024,
		.heads = 16, .kv_heads = 4, .head_dim = 64, .vocab = 32000, .max_seq = 4096,
		.dtype = MP_DTYPE_BF16, .rope_theta = 10000.0f, .norm_eps = 1e-5f } },
	/*
	 * Fine-grained models with their routing (layers x experts, top-k) and
	 * their expert-to-hidden ratio, narrowed so the experts total a few GB
	 * (a 50% budget pages on a 24 GiB machine). DeepSeek-V2-Lite: 26 MoE
	 * layers x 64 routed experts, top-6, FFN 1408 / hidden 2048 (no shared
	 * experts here): 2.3 MiB experts, ~4.0 GB.
	 */
	{ "deepseek-v2-lite-mini", {
		.layers = 26, .experts = 64, .topk = 6, .hidden = 768, .ffn = 528,
		.heads = 12, .kv_heads = 4, .head_dim = 64, .vocab = 32000, .max_seq = 4096,
		.dtype = MP_DTYPE_BF16, .rope_theta = 10000.0f, .norm_eps = 1e-6f } },
	/* Qwen3-MoE (30B-A3B): 48 x 128, top-8, FFN 768 / hidden 2048: 0.56 MiB experts, ~3.6 GB. */
	{ "qwen3-moe-mini", {
		.layers = 48, .experts = 128, .topk = 8, .hidden = 512, .ffn = 192,
		.heads = 8, .kv_heads = 2, .head_dim = 64, .vocab = 32000, .max_seq = 4096,
		.dtype = MP_DTYPE_BF16, .rope_theta = 1e6f, .norm_eps = 1e-6f } },
	/* OLMoE (1B-7B): 16 x 64, top-8, FFN 1024 / hidden 2048: 3 MiB experts, ~3.2 GB. */
	{ "olmoe-mini", {
		.layers = 16, .experts = 64, .topk = 8, .hidden = 1024, .ffn = 512,
		.heads = 16, .kv_heads = 16, .head_dim = 64, .vocab = 32000, .max_seq = 4096,
		.dtype = MP_DTYPE_BF16, .rope_theta = 10000.0f, .norm_eps = 1e-5f } },
};

static const char *const preset_names[] = {
	"tiny", "mixtral-mini", "deepseek-lite-mini", "deepseek-v2-lite-mini", "qwen3-moe-mini",
	"olmoe-mini", NULL,
};

_Static_assert(MP_ARRAY_SIZE(preset_names) == MP_ARRAY_SIZE(presets) + 1, "preset names");

const char *const *mp_gen_preset_names(void)
{
	return preset_names;
}

int mp_gen_preset(const char *name, struct mp_geometry *out)
{
	for (size_t i = 0; name && i < MP_ARRAY_SIZE(presets); i++) {
		if (!strcmp(presets[i].name, name)) {
			*out = presets[i].g;
			return 0;
		}
	}
	return mp_err(-ENOENT, "unknown preset '%s' (tiny, mixtral-mini, deepseek-lite-mini, "
		      "deepseek-v2-lite-mini, qwen3-moe-mini, olmoe-mini)", name ? name : "(null)");
}

/*
 * Random numbers: LANES independent xoshiro256** streams stepped together,
 * so the loops below vectorise. Each tensor and each expert projection gets
 * its own generator seeded from (seed, stream id) through splitmix64, so the
 * bytes do not depend on the order pieces are generated in.
 */
#define LANES		8
#define BLOCK		(2 * LANES)	/* floats per step: two per 64-bit output */

struct rng {
	uint64_t s[4][LANES];
};

static uint64_t splitmix64(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void rng_seed(struct rng *r, uint64_t seed, uint64_t stream)
{
	uint64_t x = seed;

	x = splitmix64(&x) ^ stream;
	(void)splitmix64(&x);
	for (int w = 0; w < 4; w++)
		for (int l = 0; l < LANES; l++)
			r->s[w][l] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* One step of every lane; out gets BLOCK values uniform in [-scale, scale). */
static inline void rng_block(struct rng *r, float scale, float *out)
{
	/* (int32)bits * 2^-31 is uniform in [-1, 1) */
	const float k = scale * (1.0f / 2147483648.0f);
	uint64_t v[LANES];

	for (int l = 0; l < LANES; l++) {
		uint64_t s0 = r->s[0][l], s1 = r->s[1][l], s2 = r->s[2][l], s3 = r->s[3][l];
		uint64_t t = s1 << 17;

		v[l] = rotl(s1 * 5, 7) * 9;
		s2 ^= s0;
		s3 ^= s1;
		s1 ^= s2;
		s0 ^= s3;
		s2 ^= t;
		s3 = rotl(s3, 45);
		r->s[0][l] = s0;
		r->s[1][l] = s1;
		r->s[2][l] = s2;
		r->s[3][l] = s3;
	}
	for (int l = 0; l < LANES; l++) {
		out[l] = (float)(int32_t)(uint32_t)v[l] * k;
		out[LANES + l] = (float)(int32_t)(uint32_t)(v[l] >> 32) * k;
	}
}

/* Round-to-nearest-even f32 -> bf16 for finite values (what the generator makes). */
static inline uint16_t bf16_finite(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

/*
 * A variant's values: the base's plus noise uniform in [-spread x scale,
 * spread x scale] from the variant's own stream, converted a chunk (one
 * quantization block) at a time. Relative to the weights' own spread, two
 * variants are then sqrt(2) x spread apart at one position and sqrt(2)
 * apart across positions: spread is their ratio (fine-tunes: 0.02-0.03).
 */
static void fill_noisy(struct rng *r, struct rng *nz, float spread, enum mp_dtype t,
		       float scale, void *dst, uint64_t n)
{
	float v[MP_QBLOCK], d[BLOCK];

	for (uint64_t i = 0; i < n; i += MP_QBLOCK) {
		size_t m = (size_t)MP_MIN((uint64_t)MP_QBLOCK, n - i);

		for (uint32_t j = 0; j < MP_QBLOCK; j += BLOCK) {
			rng_block(r, scale, v + j);
			rng_block(nz, scale * spread, d);
			for (uint32_t k = 0; k < BLOCK; k++)
				v[j + k] += d[k];
		}
		mp_dtype_from_f32(t, v, (char *)dst + mp_dtype_bytes(t, i), m);
	}
}

/*
 * Fills n values of type t at dst, uniform in [-scale, scale]. The AVX2 clone
 * doubles the rate (~2 GB/s); both clones do the same integer and
 * single-rounding float operations, so the bytes are identical.
 */
#ifndef __SANITIZE_THREAD__	/* TSan instruments ifunc resolvers, which run before it is up */
__attribute__((target_clones("avx2", "default")))
#endif
static void fill_uniform(struct rng *r, enum mp_dtype t, float scale, void *dst, uint64_t n)
{
	float blk[BLOCK];
	uint64_t i = 0;

	switch (t) {
	case MP_DTYPE_F32: {
		float *d = dst;

		for (; i + BLOCK <= n; i += BLOCK)
			rng_block(r, scale, d + i);
		break;
	}
	case MP_DTYPE_BF16: {
		uint16_t *d = dst;

		for (; i + BLOCK <= n; i += BLOCK) {
			rng_block(r, scale, blk);
			for (int j = 0; j < BLOCK; j++)
				d[i + j] = bf16_finite(blk[j]);
		}
		break;
	}
	case MP_DTYPE_Q8_0:
	case MP_DTYPE_Q4_0:
		/* the same values as f32, quantized a block at a time (n is whole blocks) */
		for (; i + MP_QBLOCK <= n; i += MP_QBLOCK) {
			float q[MP_QBLOCK];

			for (uint32_t j = 0; j < MP_QBLOCK; j += BLOCK)
				rng_block(r, scale, q + j);
			mp_dtype_from_f32(t, q, (char *)dst + mp_dtype_bytes(t, i), MP_QBLOCK);
		}
		break;
	default: {
		uint16_t *d = dst;

		for (; i + BLOCK <= n; i += BLOCK) {
			rng_block(r, scale, blk);
			for (int j = 0; j < BLOCK; j++)
				d[i + j] = mp_f32_to_f16(blk[j]);
		}
		break;
	}
	}
	if (i < n) {
		rng_block(r, scale, blk);
		mp_dtype_from_f32(t, blk, (char *)dst + mp_dtype_bytes(t, i), (size_t)(n - i));
	}
}

static void fill_ones(enum mp_dtype t, void *dst, uint64_t n)
{
	float one = 1.0f;
	size_t sz = mp_dtype_size(t);
	unsigned char v[4];

	mp_dtype_from_f32(t, &one, v, 1);
	for (uint64_t i = 0; i < n; i++)
		memcpy((char *)dst + i * sz, v, sz);
}

/* Stream ids: tensors are their index; expert projections set the top bit. */
static uint64_t expert_stream(uint32_t layer, uint32_t expert, uint32_t proj)
{
	return (1ull << 63) | ((uint64_t)layer << 34) | ((uint64_t)expert << 2) | proj;
}

static float uniform_scale(uint64_t fan_in)
{
	return sqrtf(3.0f / (float)fan_in);
}

/* A stream's values: the base model's, or a variant's (the base's plus its noise). */
static void fill_stream(const struct mpk_gen_spec *sp, uint64_t stream, enum mp_dtype t,
			float scale, void *dst, uint64_t n)
{
	struct rng r, nz;

	rng_seed(&r, sp->seed, stream);
	if (!sp->variant) {
		fill_uniform(&r, t, scale, dst, n);
		return;
	}
	/* The variant's noise: its own stream, unrelated to any seed's base. */
	rng_seed(&nz, sp->seed ^ (0xa0761d6478bd642full * sp->variant), ~stream);
	fill_noisy(&r, &nz, sp->spread, t, scale, dst, n);
}

void mpk_gen_tensor_spec(const struct mp_tensor_info *t, uint32_t index,
			 const struct mpk_gen_spec *sp, void *buf)
{
	uint64_t n = mp_dtype_elems(t->dtype, t->bytes);

	if (t->ndim == 1)
		fill_ones(t->dtype, buf, n);
	else
		fill_stream(sp, index, t->dtype, uniform_scale(t->dims[t->ndim - 1]), buf, n);
}

void mpk_gen_expert_spec(const struct mp_geometry *g, uint32_t layer, uint32_t expert,
			 const struct mpk_gen_spec *sp, void *buf)
{
	uint64_t n = (uint64_t)g->ffn * g->hidden;

	for (uint32_t p = 0; p < 3; p++)
		fill_stream(sp, expert_stream(layer, expert, p), g->dtype,
			    uniform_scale(p < 2 ? g->hidden : g->ffn),
			    (char *)buf + mp_dtype_bytes(g->dtype, p * n), n);
}

/* A tensor's bytes: norms (1-D) are ones, matrices uniform with variance 1/fan_in. */
void mpk_gen_tensor(const struct mp_tensor_info *t, uint32_t index, uint64_t seed, void *buf)
{
	mpk_gen_tensor_spec(t, index, &(struct mpk_gen_spec){ .seed = seed }, buf);
}

/* gate [ffn x hidden] | up [ffn x hidden] | down [hidden x ffn]. */
void mpk_gen_expert(const struct mp_geometry *g, uint32_t layer, uint32_t expert,
		       uint64_t seed, void *buf)
{
	mpk_gen_expert_spec(g, layer, expert, &(struct mpk_gen_spec){ .seed = seed }, buf);
}

/*
 * Experts go through a two-stage pipeline: a helper thread makes the next
 * expert while this thread writes the previous one, so the CPU work and the
 * disk overlap (each alone is about half of the time). Writes stay on the
 * calling thread so their errors land in its mp_last_error(). Memory: two
 * expert buffers.
 */
struct gen_pipe {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	const struct mp_geometry *g;
	const struct mpk_gen_spec *sp;
	void *buf[2];
	bool full[2];		/* slot holds an expert not yet written */
	bool stop;		/* the writer failed: make no more */
};

static void *pipe_maker(void *arg)
{
	struct gen_pipe *p = arg;
	uint32_t n = p->g->layers * p->g->experts;

	for (uint32_t i = 0; i < n; i++) {
		int slot = i & 1;

		pthread_mutex_lock(&p->lock);
		while (p->full[slot] && !p->stop)
			pthread_cond_wait(&p->cond, &p->lock);
		if (p->stop) {
			pthread_mutex_unlock(&p->lock);
			break;
		}
		pthread_mutex_unlock(&p->lock);
		mpk_gen_expert_spec(p->g, i / p->g->experts, i % p->g->experts, p->sp, p->buf[slot]);
		pthread_mutex_lock(&p->lock);
		p->full[slot] = true;
		pthread_cond_broadcast(&p->cond);
		pthread_mutex_unlock(&p->lock);
	}
	return NULL;
}

static int put_experts(struct mp_store_writer *w, struct gen_pipe *p, uint64_t done,
		       uint64_t total, void (*progress)(uint64_t, uint64_t, void *), void *arg)
{
	const struct mp_geometry *g = p->g;
	uint32_t n = g->layers * g->experts;
	pthread_t maker;
	bool threaded;
	int err = 0;

	threaded = pthread_create(&maker, NULL, pipe_maker, p) == 0;
	for (uint32_t i = 0; i < n && !err; i++) {
		int slot = threaded ? i & 1 : 0;

		if (threaded) {
			pthread_mutex_lock(&p->lock);
			while (!p->full[slot])
				pthread_cond_wait(&p->cond, &p->lock);
			pthread_mutex_unlock(&p->lock);
		} else {
			mpk_gen_expert_spec(g, i / g->experts, i % g->experts, p->sp, p->buf[0]);
		}
		err = mp_store_writer_put_expert(w, i / g->experts, i % g->experts, p->buf[slot]);
		if (threaded) {
			pthread_mutex_lock(&p->lock);
			p->full[slot] = false;
			p->stop = err != 0;
			pthread_cond_broadcast(&p->cond);
			pthread_mutex_unlock(&p->lock);
		}
		done += mp_geometry_expert_bytes(g);
		if (!err && progress)
			progress(done, total, arg);
	}
	if (threaded)
		pthread_join(maker, NULL);
	return err;
}

int mp_gen_model(const char *path, const struct mp_geometry *g, uint64_t seed, const char *name,
		 void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg)
{
	return mp_gen_variant(path, g, seed, 0, 0, name, progress, arg);
}

int mp_gen_variant(const char *path, const struct mp_geometry *g, uint64_t seed,
		   uint32_t variant, float spread, const char *name,
		   void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg)
{
	const struct mpk_gen_spec sp = { .seed = seed, .variant = variant, .spread = spread };
	struct gen_pipe pipe = {
		.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER,
		.g = g, .sp = &sp,
	};
	struct mp_store_writer *w;
	uint64_t buf_bytes, done = 0, total;
	uint32_t n_tensors;
	int err;

	if (!path || !g)
		return mp_err(-EINVAL, "mp_gen_model: NULL argument");
	if (variant && !(spread > 0 && spread <= 1))
		return mp_err(-EINVAL, "mp_gen_variant: variant %u wants a spread in (0, 1], not %g",
			      variant, (double)spread);
	err = mp_store_writer_create(path, g, name, &w);
	if (err)
		return err;
	n_tensors = mp_store_writer_tensor_count(w);
	buf_bytes = mp_geometry_expert_bytes(g);
	total = (uint64_t)g->layers * g->experts * buf_bytes;
	for (uint32_t i = 0; i < n_tensors; i++) {
		uint64_t b = mp_store_writer_tensor_at(w, i)->bytes;

		buf_bytes = MP_MAX(buf_bytes, b);
		total += b;
	}
	/* page-aligned so the writer can hand experts to O_DIRECT without a copy */
	if (posix_memalign(&pipe.buf[0], 4096, buf_bytes))
		pipe.buf[0] = NULL;
	if (posix_memalign(&pipe.buf[1], 4096, mp_geometry_expert_bytes(g)))
		pipe.buf[1] = NULL;
	if (!pipe.buf[0] || !pipe.buf[1]) {
		err = mp_err(-ENOMEM, "%s: out of memory for %llu-byte buffers", path,
			     (unsigned long long)buf_bytes);
		goto free_buf;
	}
	for (uint32_t i = 0; i < n_tensors; i++) {
		const struct mp_tensor_info *t = mp_store_writer_tensor_at(w, i);

		mpk_gen_tensor_spec(t, i, &sp, pipe.buf[0]);
		err = mp_store_writer_put_tensor(w, t->name, pipe.buf[0]);
		if (err)
			goto free_buf;
		done += t->bytes;
		if (progress)
			progress(done, total, arg);
	}
	err = put_experts(w, &pipe, done, total, progress, arg);
	if (err)
		goto free_buf;
	free(pipe.buf[0]);
	free(pipe.buf[1]);
	return mp_store_writer_finish(w);
free_buf:
	free(pipe.buf[0]);
	free(pipe.buf[1]);
	mp_store_writer_abort(w);
	return err;
}

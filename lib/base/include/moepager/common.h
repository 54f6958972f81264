/* SPDX-License-Identifier: MIT */
/* Versions, logging, weight types and model geometry shared by every area. */
#ifndef MOEPAGER_COMMON_H
#define MOEPAGER_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MP_API __attribute__((visibility("default")))

/*
 * Structs that grow
 *
 * Config and statistics structs end in reserved words, so a later release
 * can add fields there without changing their size or moving the fields
 * before them: a binary built against this header keeps working with a
 * newer library. Leave a config's reserved words zero (a zeroed struct or a
 * designated initialiser does): a call given a non-zero one fails with
 * -EINVAL, as the field set there is one this library does not know.
 * Statistics calls write zeros there.
 */
#define MP_RESERVED(words) uint64_t reserved[words]

/*
 * The same for a table of operations a caller may write
 * (mp_expert_source_ops, mp_row_ops): it ends in NULL slots, an op added
 * later takes one, and a table built against an older header reads as
 * "op absent" there. A call given a table whose reserved slot is set fails
 * with -EINVAL: that op is one this library does not know.
 */
#define MP_RESERVED_OPS(slots) void (*reserved[slots])(void)

/*
 * Library version
 */

/* Version of the loaded library (may differ from the headers'). */
MP_API int mp_version_major(void);
MP_API int mp_version_minor(void);
MP_API const char *mp_version_string(void);

/*
 * Logging and errors
 */

enum mp_log_level {
	MP_LOG_ERROR = 0,
	MP_LOG_WARN = 1,
	MP_LOG_INFO = 2,
	MP_LOG_DEBUG = 3,
};

typedef void (*mp_log_fn)(enum mp_log_level level, const char *msg, void *arg);

/*
 * Install the handler that receives every log line (without a trailing
 * newline) up to the level mp_set_log_level() sets. The library never
 * writes to stderr itself; with no handler, lines are dropped. Passing NULL
 * removes the handler. Not thread-safe against concurrent logging: install
 * it before opening anything.
 */
MP_API void mp_set_log_handler(mp_log_fn fn, void *arg);

/*
 * The most detailed level the handler wants (MP_LOG_DEBUG, every line, by
 * default). Lines past it are dropped before they are formatted: the fill
 * path says a debug line per read, which costs its thread a formatted
 * string whether the handler prints it or not. Errors are always formatted,
 * for mp_last_error(). Any thread, any time.
 */
MP_API void mp_set_log_level(enum mp_log_level max);

/*
 * The message of the last error logged by this thread ("" if none). Valid
 * until this thread's next library call that fails.
 */
MP_API const char *mp_last_error(void);

/*
 * Weight types
 */

enum mp_dtype {
	MP_DTYPE_F32 = 0,
	MP_DTYPE_F16 = 1,
	MP_DTYPE_BF16 = 2,
	/*
	 * Block types (llama.cpp's): a row is blocks of MP_QBLOCK elements,
	 * each an f16 scale d then the quants. Q8_0: 32 int8 q, value d * q
	 * (34 bytes). Q4_0: 16 bytes of nibbles, element j < 16 the low nibble
	 * of byte j, element 16 + j its high nibble, value d * (q - 8) (18
	 * bytes). A row's length must be a multiple of MP_QBLOCK.
	 */
	MP_DTYPE_Q8_0 = 3,
	MP_DTYPE_Q4_0 = 4,
	MP_DTYPE_COUNT
};

/* Elements per block of the block types. */
#define MP_QBLOCK	32u

/*
 * Bytes per element of a type whose elements have a whole size (f32, f16,
 * bf16); 0 for the block types, whose elements do not (use mp_dtype_bytes()),
 * and for an unknown type.
 */
MP_API size_t mp_dtype_size(enum mp_dtype t);
/* Elements per block: 1 for f32/f16/bf16, MP_QBLOCK for q8_0/q4_0, 0 for an unknown type. */
MP_API uint32_t mp_dtype_block(enum mp_dtype t);
/*
 * Bytes of n elements of type t, n a multiple of mp_dtype_block(t); 0 for an
 * unknown type, an n that is not whole blocks, or a size that overflows.
 */
MP_API uint64_t mp_dtype_bytes(enum mp_dtype t, uint64_t n);
/* Elements held by bytes bytes of type t (whole blocks only); 0 for an unknown type. */
MP_API uint64_t mp_dtype_elems(enum mp_dtype t, uint64_t bytes);
/* "f32", "f16", "bf16", "q8_0", "q4_0", or NULL for an unknown type. */
MP_API const char *mp_dtype_name(enum mp_dtype t);
/* Parses a name as printed by mp_dtype_name(); returns 0 or -EINVAL. */
MP_API int mp_dtype_parse(const char *name, enum mp_dtype *out);

/* Scalar conversions (round to nearest even when narrowing). */
MP_API float mp_f16_to_f32(uint16_t h);
MP_API uint16_t mp_f32_to_f16(float f);
MP_API float mp_bf16_to_f32(uint16_t b);
MP_API uint16_t mp_f32_to_bf16(float f);
/*
 * Converts n elements of type t at src to f32. For a block type n is a
 * multiple of MP_QBLOCK (the elements of a partial last block are left alone).
 */
MP_API void mp_dtype_to_f32(enum mp_dtype t, const void *src, float *dst, size_t n);
/*
 * Converts n f32 values to type t at dst. Block types are quantized as
 * llama.cpp's reference quantizers do (quantize_row_q8_0_ref and _q4_0_ref:
 * round to nearest, scale from the block's largest magnitude); n is a
 * multiple of MP_QBLOCK (a partial last block is not written).
 */
MP_API void mp_dtype_from_f32(enum mp_dtype t, const float *src, void *dst, size_t n);

/*
 * Checksums
 */

/* XXH3-64 of a buffer: the checksum of every .mpk extent and of the other file formats. */
MP_API uint64_t mp_checksum(const void *buf, size_t len);

/*
 * Model geometry
 *
 * The architecture is Mixtral-style: token embedding; per layer RMSNorm,
 * GQA attention with RoPE, RMSNorm, a router over `experts` SwiGLU experts
 * of which `topk` are used; final RMSNorm and LM head.
 */
struct mp_geometry {
	uint32_t layers;	/* MoE decoder layers */
	uint32_t experts;	/* experts per layer */
	uint32_t topk;		/* experts used per token and layer */
	uint32_t hidden;	/* model width */
	uint32_t ffn;		/* expert intermediate width */
	uint32_t heads;		/* attention query heads */
	uint32_t kv_heads;	/* attention key/value heads (GQA) */
	uint32_t head_dim;	/* width of one head */
	uint32_t vocab;		/* vocabulary size */
	uint32_t max_seq;	/* longest sequence the KV cache must hold */
	enum mp_dtype dtype;	/* type of the weight matrices */
	float rope_theta;	/* RoPE base */
	float norm_eps;		/* RMSNorm epsilon */
};

/* Upper bounds a geometry must respect (catch absurd headers early). */
#define MP_MAX_LAYERS	1024u
#define MP_MAX_EXPERTS	4096u
#define MP_MAX_TOPK	64u
#define MP_MAX_DIM	(1u << 20)
#define MP_MAX_VOCAB	(1u << 24)
#define MP_MAX_SEQ	(1u << 20)

/*
 * Checks that every field is in range and consistent (topk <= experts,
 * heads a multiple of kv_heads, ...). Returns 0, or -EINVAL with a message
 * naming the field.
 */
MP_API int mp_geometry_check(const struct mp_geometry *g);

/* Bytes of one expert: gate, up and down projections, in that order. */
MP_API uint64_t mp_geometry_expert_bytes(const struct mp_geometry *g);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_COMMON_H */

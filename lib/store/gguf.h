/* SPDX-License-Identifier: MIT */
/* GGUF v3 files (llama.cpp's format): the parsed header, metadata and tensor infos; the writer. */
#ifndef MP_STORE_GGUF_H
#define MP_STORE_GGUF_H

#include <stdbool.h>
#include <stdint.h>

#include <moepager/common.h>

#define GGUF_MAGIC		0x46554747u	/* "GGUF" read as a little-endian u32 */
#define GGUF_VERSION		3u
#define GGUF_DEFAULT_ALIGN	32u
#define GGUF_MAX_DIMS		4u
/* A tensor name is shorter than this (ggml's GGML_MAX_NAME, NUL included). */
#define GGUF_NAME_MAX		64u
#define GGUF_KEY_ALIGNMENT	"general.alignment"

/* Metadata value types. */
enum gguf_type {
	GGUF_U8, GGUF_I8, GGUF_U16, GGUF_I16, GGUF_U32, GGUF_I32, GGUF_F32, GGUF_BOOL,
	GGUF_STRING, GGUF_ARRAY, GGUF_U64, GGUF_I64, GGUF_F64, GGUF_TYPE_COUNT
};

/* The ggml tensor types that are also moepager weight types (the same bytes). */
enum {
	GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q8_0 = 8, GGML_BF16 = 30,
	GGML_TYPE_COUNT = 43,
};

struct gguf_kv {
	char *key;
	uint32_t type;			/* enum gguf_type */
	uint32_t elem;			/* arrays: the elements' type */
	uint64_t n;			/* arrays: the element count */
	uint64_t at;			/* file offset of the entry (its key) */
	uint64_t off;			/* file offset of the value (of an array's first element) */
	union {
		uint64_t u;		/* unsigned integers, bool */
		int64_t i;		/* signed integers */
		double f;		/* f32, f64 */
	} v;
	char *str;			/* strings: the value, NUL-terminated */
};

struct gguf_tensor {
	char name[GGUF_NAME_MAX];
	uint32_t n_dims;
	uint64_t ne[GGUF_MAX_DIMS];	/* ne[0] varies fastest (a row); unused dims are 1 */
	uint32_t type;			/* ggml type */
	uint64_t off;			/* file offset of the data */
	uint64_t bytes;
	uint64_t info_off;		/* file offset of its tensor info, for messages */
};

struct gguf_file {
	char *path;
	int fd;
	uint64_t size;
	uint64_t n_kv;
	uint64_t n_tensors;
	struct gguf_kv *kv;
	struct gguf_tensor *t;
	uint64_t alignment;
	uint64_t data_off;		/* where the data section starts */
};

/*
 * Opens and checks a GGUF v3 file: header, every metadata key and value
 * (arrays walked to their end), tensor infos (name, dims, type, data inside
 * the file, aligned, no overlap). Reads no tensor data. Returns 0 and sets
 * *out, or -EPROTO (not GGUF), -EPROTONOSUPPORT (version), -ENODATA
 * (truncated), -EINVAL (a bad key, value or tensor info), each with a
 * message naming the key or tensor and its file offset; or the open error.
 */
int gguf_open(const char *path, struct gguf_file **out);
void gguf_close(struct gguf_file *g);

const struct gguf_kv *gguf_find_kv(const struct gguf_file *g, const char *key);
const struct gguf_tensor *gguf_find_tensor(const struct gguf_file *g, const char *name);

/*
 * Typed values: 0 and *out, -ENOENT when the key is absent (no message), or
 * -EINVAL naming the key and offset when its type or value does not fit
 * (integers of any type in range for u32; f32 or f64 for a float).
 */
int gguf_get_u32(const struct gguf_file *g, const char *key, uint32_t *out);
int gguf_get_f32(const struct gguf_file *g, const char *key, float *out);
int gguf_get_str(const struct gguf_file *g, const char *key, const char **out);

/* Reads len bytes of tensor data at offset off of t into buf; 0, -EIO or -ENODATA (named). */
int gguf_read(struct gguf_file *g, const struct gguf_tensor *t, uint64_t off, void *buf,
	      uint64_t len);

/* ggml's name of a tensor type ("q4_K"), or "unknown". */
const char *ggml_type_name(uint32_t type);
/* Bytes of n elements of a ggml type (n whole blocks), 0 when unknown, not whole or too big. */
uint64_t ggml_type_bytes(uint32_t type, uint64_t n);
/* The weight type with the same bytes as ggml type `type`: 0, or -EOPNOTSUPP. */
int ggml_to_dtype(uint32_t type, enum mp_dtype *out);
uint32_t ggml_from_dtype(enum mp_dtype t);

/*
 * Writer
 *
 * Metadata and tensor infos are declared first, then data is written at the
 * offsets the declarations fixed (in any order), then finish checks that
 * every tensor was filled, syncs and renames the temporary file into place.
 */
struct gguf_writer;

/* alignment: a power of two (general.alignment is written unless it is 32). */
int gguf_writer_create(const char *path, uint32_t alignment, struct gguf_writer **out);
int gguf_writer_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_writer_str(struct gguf_writer *w, const char *key, const char *v);
/* Arrays: of n strings, of n f32, of n i32. */
int gguf_writer_strs(struct gguf_writer *w, const char *key, const char *const *v, uint64_t n);
int gguf_writer_f32s(struct gguf_writer *w, const char *key, const float *v, uint64_t n);
int gguf_writer_i32s(struct gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* Declares a tensor (ne[0] the row length); returns its index (>= 0) or -errno. */
int gguf_writer_tensor(struct gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
		       const uint64_t *ne);
/* Writes the header, metadata and tensor infos; no declaration may follow. */
int gguf_writer_begin_data(struct gguf_writer *w);
/* Writes len bytes of tensor i's data at offset off within it. */
int gguf_writer_data(struct gguf_writer *w, int i, uint64_t off, const void *buf, uint64_t len);
/* Bytes of tensor i. */
uint64_t gguf_writer_tensor_bytes(const struct gguf_writer *w, int i);
/* Checks every tensor was filled, syncs, renames into place, frees w. */
int gguf_writer_finish(struct gguf_writer *w);
void gguf_writer_abort(struct gguf_writer *w);

#endif /* MP_STORE_GGUF_H */

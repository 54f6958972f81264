/* SPDX-License-Identifier: MIT */
/*
 * The packed model store (.mpk): reader, writer and model generator.
 * docs/mpk-format.md is the specification of the file.
 */
#ifndef MOEPAGER_STORE_H
#define MOEPAGER_STORE_H

#include <moepager/common.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MP_MPK_VERSION		1u
/* Every expert starts on this boundary in the file and in the region. */
#define MP_EXPERT_ALIGN		(2u << 20)
#define MP_TENSOR_NAME_MAX	64

/* A non-expert tensor (embedding, norms, attention, router, LM head). */
struct mp_tensor_info {
	char name[MP_TENSOR_NAME_MAX];	/* e.g. "blk.3.attn_q" */
	enum mp_dtype dtype;
	uint32_t ndim;
	uint64_t dims[4];		/* dims[0] is the slowest (rows) */
	uint64_t offset;		/* byte offset in the file */
	uint64_t bytes;
	uint64_t checksum;		/* XXH3-64 of the bytes */
};

/* One expert: gate [ffn x hidden], up [ffn x hidden], down [hidden x ffn]. */
struct mp_expert_info {
	uint32_t layer;
	uint32_t expert;
	uint64_t offset;		/* byte offset in the file, MP_EXPERT_ALIGN-aligned */
	uint64_t bytes;			/* == mp_geometry_expert_bytes() */
	uint64_t checksum;		/* XXH3-64 of the bytes */
};

/*
 * Reader
 */

struct mp_store;

/*
 * Opens and validates an .mpk file: header, geometry, tables, every extent
 * (inside the file, no overlap, aligned) and the expected tensor set. Expert
 * data is not read (see mp_store_verify()). Returns 0 and sets *out, or a
 * negative errno with a message naming the problem and its file offset:
 * -ENOENT/-EACCES (open), -EPROTO (bad magic), -EPROTONOSUPPORT (version),
 * -EBADMSG (corrupt header or table, checksum mismatch), -EINVAL (absurd
 * geometry or extents), -ENODATA (truncated file).
 */
MP_API int mp_store_open(const char *path, struct mp_store **out);
/* Closes the store. NULL is allowed. */
MP_API void mp_store_close(struct mp_store *s);

MP_API const struct mp_geometry *mp_store_geometry(const struct mp_store *s);
MP_API const char *mp_store_path(const struct mp_store *s);
/* The model name recorded by the writer ("" if none). */
MP_API const char *mp_store_name(const struct mp_store *s);
/* A read-only fd of the file (owned by the store). */
MP_API int mp_store_fd(const struct mp_store *s);
/* Size of the file in bytes, as the header records it. */
MP_API uint64_t mp_store_file_bytes(const struct mp_store *s);
/* Bytes of one expert, and the sum over all experts. */
MP_API uint64_t mp_store_expert_bytes(const struct mp_store *s);
MP_API uint64_t mp_store_total_expert_bytes(const struct mp_store *s);

/*
 * The identity of a model's weights: XXH3-64 over its header (geometry,
 * layout, and the checksum of its tables, which hold every tensor's and
 * expert's checksum). An adapter records its base's and is refused by any
 * other model.
 */
MP_API uint64_t mp_store_identity(const struct mp_store *s);

/* The expert's entry, or NULL when layer/expert is out of range. */
MP_API const struct mp_expert_info *mp_store_expert(const struct mp_store *s,
						    uint32_t layer, uint32_t expert);

MP_API uint32_t mp_store_tensor_count(const struct mp_store *s);
/* The i-th tensor entry, or NULL when i is out of range. */
MP_API const struct mp_tensor_info *mp_store_tensor_at(const struct mp_store *s, uint32_t i);
/* The tensor with this name, or NULL. */
MP_API const struct mp_tensor_info *mp_store_tensor(const struct mp_store *s, const char *name);

/*
 * Reads a tensor's bytes into buf (t->bytes long) and checks its checksum.
 * Returns 0, -EIO/-ENODATA on a failed or short read, -EBADMSG on a
 * checksum mismatch (naming the tensor).
 */
MP_API int mp_store_read_tensor(struct mp_store *s, const struct mp_tensor_info *t, void *buf);

/*
 * Reads an expert's bytes into buf (mp_store_expert_bytes() long) with
 * pread and checks its checksum. Returns 0, -ERANGE for a bad id, -EIO or
 * -ENODATA on a failed or short read, -EBADMSG naming layer and expert on a
 * checksum mismatch.
 */
MP_API int mp_store_read_expert(struct mp_store *s, uint32_t layer, uint32_t expert, void *buf);

struct mp_verify_result {
	uint32_t layer;
	uint32_t expert;
	int err;		/* -EBADMSG (checksum) or the read error */
};

/*
 * Checks every tensor and expert checksum. bad (may be NULL) receives up to
 * max_bad failing experts. Returns the number of failing experts and
 * tensors (0 = all good), or a negative errno when the check itself could
 * not run. progress (may be NULL) is called after each expert with done
 * and total counts.
 */
MP_API int mp_store_verify(struct mp_store *s, struct mp_verify_result *bad, uint32_t max_bad,
			   void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg);

/*
 * Writer
 *
 * The layout is fixed by the geometry, so the writer streams: tensors and
 * experts may be put in any order, each exactly once, and nothing larger
 * than one tensor or expert is held in memory. The file is written under a
 * temporary name and renamed into place by mp_store_writer_finish(), so a
 * failed or abandoned write never leaves a half-written model at path.
 */

struct mp_store_writer;

/*
 * Creates a writer for path. name (may be NULL) is recorded in the header.
 * Returns 0 and sets *out, -EINVAL for a bad geometry, or the open error.
 */
MP_API int mp_store_writer_create(const char *path, const struct mp_geometry *g,
				  const char *name, struct mp_store_writer **out);

/* Number of non-expert tensors the geometry defines, and the i-th (name, dtype, shape). */
MP_API uint32_t mp_store_writer_tensor_count(const struct mp_store_writer *w);
MP_API const struct mp_tensor_info *mp_store_writer_tensor_at(const struct mp_store_writer *w,
							     uint32_t i);

/*
 * Writes a tensor's bytes (its dtype and shape from the layout; data holds
 * t->bytes). Returns 0, -ENOENT for an unknown name, -EEXIST when already
 * written, or the write error.
 */
MP_API int mp_store_writer_put_tensor(struct mp_store_writer *w, const char *name, const void *data);

/* Writes an expert's gate|up|down bytes (mp_geometry_expert_bytes() long). */
MP_API int mp_store_writer_put_expert(struct mp_store_writer *w, uint32_t layer, uint32_t expert,
				      const void *data);

/*
 * Checks that every tensor and expert was written, writes the tables and
 * the header, syncs and renames the file into place. Frees the writer
 * whatever the outcome. Returns 0, -ENODATA naming the first missing piece,
 * or the I/O error.
 */
MP_API int mp_store_writer_finish(struct mp_store_writer *w);
/* Abandons the write: removes the temporary file and frees the writer. */
MP_API void mp_store_writer_abort(struct mp_store_writer *w);

/*
 * Model generator
 */

/* The named preset's geometry: "tiny", "mixtral-mini", "deepseek-lite-mini". */
MP_API int mp_gen_preset(const char *name, struct mp_geometry *out);
/* The preset names, NULL-terminated. */
MP_API const char *const *mp_gen_preset_names(void);

/*
 * Writes a model with random weights (uniform, variance 1/fan_in; norms 1)
 * to path. The bytes depend only on the geometry and the seed. progress
 * (may be NULL) is called with bytes written so far and the total.
 */
MP_API int mp_gen_model(const char *path, const struct mp_geometry *g, uint64_t seed,
			const char *name,
			void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg);

/*
 * Writes a variant of the model mp_gen_model() writes from seed, as a
 * fine-tune of it would be: every matrix value plus noise uniform within
 * spread (0..1] times the value's own range, from the variant's stream
 * (variant >= 1; variant 0 is the base itself, spread unused). Two variants'
 * experts at one position are then spread times as far apart as two
 * experts at different positions (Multi-MoE: 0.02; fine-tunes of
 * tiny-real: 0.03). Norms stay ones. -EINVAL for a spread out of range.
 */
MP_API int mp_gen_variant(const char *path, const struct mp_geometry *g, uint64_t seed,
			  uint32_t variant, float spread, const char *name,
			  void (*progress)(uint64_t done, uint64_t total, void *arg), void *arg);

/*
 * Other tools' model files (docs/gguf.md)
 *
 * GGUF (llama.cpp) in both directions, Hugging Face safetensors in. An import writes an .mpk with the experts in the runner's layout; it refuses,
 * naming the tensor or key and its file offset, a damaged file and a model
 * the runner cannot compute (shared experts, latent attention, Q/K norms,
 * biases, ...): nothing is dropped silently.
 */

struct mp_import_config {
	/* Weight type of the .mpk (enum mp_dtype), or -1: the experts' own type. */
	int dtype;
	/* Longest sequence the model records; 0: the file's context length (at most MP_MAX_SEQ). */
	uint32_t max_seq;
	/* Model name for the header; NULL: the file's own (general.name). */
	const char *name;
	/* Called (may be NULL) with bytes written so far and the total. */
	void (*progress)(uint64_t done, uint64_t total, void *arg);
	void *arg;
	MP_RESERVED(4);
};

/*
 * Converts the GGUF file at gguf_path (architectures llama/Mixtral, and
 * qwen2moe, qwen3moe, olmoe, deepseek2 where they fit the runner) into an
 * .mpk at mpk_path. cfg may be NULL (defaults). Tensors of another type than
 * the .mpk's are converted through f32 (f32, f16, bf16, q8_0 and q4_0 are
 * read). Returns 0, or -EPROTO/-EPROTONOSUPPORT/-ENODATA/-EINVAL for a file
 * that is not a valid GGUF, -EOPNOTSUPP for a model the runner cannot run
 * or a tensor type it cannot read, or the I/O error; no partial file is
 * left at mpk_path.
 */
MP_API int mp_gguf_import(const char *gguf_path, const char *mpk_path,
			  const struct mp_import_config *cfg);

/*
 * Converts a directory of Hugging Face safetensors (config.json and every
 * *.safetensors shard; model_type mixtral, and qwen3_moe / qwen2_moe where
 * they fit the runner) into an .mpk, as mp_gguf_import() does; F32, F16 and
 * BF16 tensors are read. Returns the same errors, naming the shard, the
 * tensor and its offset, or the config.json key.
 */
MP_API int mp_safetensors_import(const char *dir, const char *mpk_path,
				 const struct mp_import_config *cfg);

/* One token of a vocabulary to export (SentencePiece / llama.cpp terms). */
struct mp_gguf_token {
	const char *text;		/* NUL-terminated UTF-8 piece, e.g. "\xe2\x96\x81the", "<0x0A>" */
	float score;
	/* llama.cpp token type: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte */
	int32_t type;
};

struct mp_export_config {
	/* Type of the expert tensors (enum mp_dtype), or -1: the model's. */
	int dtype;
	/* Type of the token embedding, attention and LM head; -1: dtype when set, else the model's. */
	int dense_dtype;
	/* general.alignment, a power of two; 0: 4096. */
	uint32_t alignment;
	/* The vocabulary (tokenizer.ggml.model "llama"), vocab_n == the model's; NULL: placeholders. */
	const struct mp_gguf_token *vocab;
	uint32_t vocab_n;
	uint32_t bos, eos, unk;		/* token ids (with vocab only) */
	void (*progress)(uint64_t done, uint64_t total, void *arg);
	void *arg;
	MP_RESERVED(4);
};

/*
 * Writes the model of s as a GGUF file llama.cpp loads (architecture llama:
 * Q and K rows permuted back to adjacent-pair RoPE, experts as
 * blk.N.ffn_{gate,up,down}_exps, norms and routers f32). cfg may be NULL.
 * Returns 0, -EINVAL for a bad option (a type whose blocks the rows do not
 * fill, a vocabulary of the wrong size), the read error of a damaged piece
 * (-EBADMSG), or the I/O error; no partial file is left at gguf_path.
 */
MP_API int mp_gguf_export(struct mp_store *s, const char *gguf_path,
			  const struct mp_export_config *cfg);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_STORE_H */

/* SPDX-License-Identifier: MIT */
/*
 * Expert adapters (.mpa): the experts an expert-specialised fine-tune
 * (ESFT) replaces in a base model, with the identity of that base.
 * docs/mpa-format.md is the specification of the file.
 */
#ifndef MOEPAGER_ADAPTER_H
#define MOEPAGER_ADAPTER_H

#include <moepager/store.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MP_MPA_VERSION		1u
#define MP_ADAPTER_NAME_MAX	64

/* One replaced expert: the base expert id (layer, expert) and where its new bytes are. */
struct mp_adapter_expert {
	uint32_t layer;
	uint32_t expert;
	uint64_t offset;		/* in the .mpa file */
	uint64_t bytes;			/* == the base's mp_store_expert_bytes() */
	uint64_t checksum;		/* XXH3-64 of the bytes */
};

/*
 * Reader
 */

struct mp_adapter;

/*
 * Opens and validates an .mpa file: header, table (entries sorted by
 * layer then expert, no duplicate), every extent (aligned, inside the file,
 * no overlap). Expert bytes are not read (see mp_adapter_verify()). Returns
 * 0 and sets *out, or a negative errno with a message naming the problem
 * and its offset: -ENOENT/-EACCES (open), -EPROTO (not an adapter),
 * -EPROTONOSUPPORT (version, flags), -EBADMSG (checksum), -EINVAL (bad
 * field), -ENODATA (truncated).
 */
MP_API int mp_adapter_open(const char *path, struct mp_adapter **out);
/* Closes the adapter. NULL is allowed. */
MP_API void mp_adapter_close(struct mp_adapter *a);

MP_API const char *mp_adapter_path(const struct mp_adapter *a);
MP_API const char *mp_adapter_name(const struct mp_adapter *a);
/* The base model name and identity the adapter was made for. */
MP_API const char *mp_adapter_base_name(const struct mp_adapter *a);
MP_API uint64_t mp_adapter_base_identity(const struct mp_adapter *a);
/* A read-only fd of the file (owned by the adapter). */
MP_API int mp_adapter_fd(const struct mp_adapter *a);

/*
 * 0 when base is the model the adapter was made for; -EMEDIUMTYPE naming
 * both models when it is another one (different weights or geometry).
 */
MP_API int mp_adapter_check_base(const struct mp_adapter *a, const struct mp_store *base);

/* Layers of the base, replaced experts in all, and the most any layer replaces (e_i). */
MP_API uint32_t mp_adapter_layers(const struct mp_adapter *a);
MP_API uint32_t mp_adapter_count(const struct mp_adapter *a);
MP_API uint32_t mp_adapter_max_per_layer(const struct mp_adapter *a);
/*
 * The experts the adapter replaces in layer, sorted by expert id; *n gets
 * their number (0 for a layer it leaves alone or out of range).
 */
MP_API const struct mp_adapter_expert *mp_adapter_layer(const struct mp_adapter *a,
							uint32_t layer, uint32_t *n);
/* The entry for base expert (layer, expert), or NULL when the adapter keeps the base's. */
MP_API const struct mp_adapter_expert *mp_adapter_find(const struct mp_adapter *a,
						       uint32_t layer, uint32_t expert);

/*
 * Reads a replaced expert's bytes into buf (its bytes long) and checks its
 * checksum. Returns 0, -ENOENT when the adapter does not replace it, -EIO
 * or -ENODATA on a failed or short read, -EBADMSG naming it on a mismatch.
 */
MP_API int mp_adapter_read_expert(struct mp_adapter *a, uint32_t layer, uint32_t expert,
				  void *buf);

/* Checks every expert's checksum. Returns the number that fail, or a negative errno. */
MP_API int mp_adapter_verify(struct mp_adapter *a);

/*
 * Writer: experts put in any order, each at most once; the file is written
 * under a temporary name and renamed into place by finish().
 */

struct mp_adapter_writer;

/*
 * Creates a writer of an adapter named name (< MP_ADAPTER_NAME_MAX bytes)
 * for base. Returns 0 and sets *out, -EINVAL for a bad name, or the error.
 */
MP_API int mp_adapter_writer_create(const char *path, const struct mp_store *base,
				    const char *name, struct mp_adapter_writer **out);
/*
 * Writes the bytes (the base's expert bytes long) replacing base expert
 * (layer, expert). Returns 0, -ERANGE for a bad id, -EEXIST when already put,
 * or the write error.
 */
MP_API int mp_adapter_writer_put(struct mp_adapter_writer *w, uint32_t layer, uint32_t expert,
				 const void *data);
/* Writes the table and header and renames the file into place; frees w. 0 or -errno. */
MP_API int mp_adapter_writer_finish(struct mp_adapter_writer *w);
/* Discards the file and frees w. NULL is allowed. */
MP_API void mp_adapter_writer_abort(struct mp_adapter_writer *w);

/*
 * Packs the difference between a base and a fine-tune of it whose only
 * changes are experts (an ESFT "merged model") into an adapter at path:
 * every expert whose checksum differs from the base's. Returns the number
 * of experts packed (>= 1), -EINVAL naming the first non-expert tensor or
 * geometry field that differs (the fine-tune is not an expert adapter),
 * -ENODATA when nothing differs, or a read/write error.
 */
MP_API int mp_adapter_pack(struct mp_store *base, struct mp_store *tuned, const char *name,
			   const char *path);

/*
 * Writes the merged model of an adapter: base with the adapter's experts in
 * place of its own, an ordinary .mpk named name (NULL: the base's name).
 * Returns 0, -EMEDIUMTYPE when the adapter is for another base, or a
 * read/write error (every byte read is checked against its checksum).
 */
MP_API int mp_adapter_merge(struct mp_store *base, struct mp_adapter *a, const char *name,
			    const char *path);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_ADAPTER_H */

/* SPDX-License-Identifier: MIT */
/* What every importer hands the .mpk writing step: a geometry and readers of its pieces. */
#ifndef MP_STORE_IMPORT_H
#define MP_STORE_IMPORT_H

#include <stdbool.h>

#include <moepager/store.h>

struct import_src {
	const char *path;		/* the file (or directory) read, for messages */
	struct mp_geometry g;		/* checked; g.dtype is the .mpk's weight type */
	char name[64];			/* model name for the header */
	/* Q and K rows come in adjacent-pair RoPE order: the writer permutes them to halves. */
	bool rope_pairs;
	void *ctx;
	/*
	 * Fills dst with the .mpk tensor t (its name, dtype, shape and bytes as
	 * the layout gives them). Returns 0 or -errno, after a message naming
	 * the source tensor.
	 */
	int (*tensor)(void *ctx, const struct mp_tensor_info *t, void *dst);
	/* Fills dst with an expert's gate | up | down in g.dtype (mp_geometry_expert_bytes()). */
	int (*expert)(void *ctx, uint32_t layer, uint32_t expert, void *dst);
};

/*
 * The checks every mp_*_import() makes of its arguments before reading:
 * paths, the config's reserved words and type. Returns 0 or -EINVAL (logged).
 */
int mpk_import_args(const char *fn, const char *src, const char *out,
		    const struct mp_import_config *cfg);

/* mp_geometry_check() of src->g, its message prefixed with the source: 0 or -EINVAL. */
int mpk_import_geometry(const struct import_src *src);

/* Writes the .mpk at path from src. Returns 0 or -errno; no partial file stays at path. */
int mpk_import_write(const char *path, const struct import_src *src,
		     const struct mp_import_config *cfg);

#endif /* MP_STORE_IMPORT_H */

/* SPDX-License-Identifier: MIT */
/* A directory of Hugging Face safetensors shards: the tensors of every shard, checked; config.json. */
#ifndef MP_STORE_SAFETENSORS_H
#define MP_STORE_SAFETENSORS_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include <moepager/common.h>

#define ST_MAX_DIMS	8u
/* The format's own bound on the JSON header (safetensors refuses larger ones). */
#define ST_MAX_HEADER	(100u << 20)

struct st_tensor {
	char *name;
	uint32_t file;			/* index in st_dir.files */
	char dtype[16];			/* "BF16", "F32", ... */
	bool readable;			/* dtype is F32, F16 or BF16 (then `type` is set) */
	enum mp_dtype type;
	uint32_t n_dims;
	uint64_t shape[ST_MAX_DIMS];	/* shape[0] the slowest */
	uint64_t off;			/* file offset of the data */
	uint64_t bytes;
};

struct st_file {
	char *path;
	int fd;
	uint64_t size;
};

struct st_dir {
	char *path;
	struct st_file *files;
	uint32_t n_files;
	struct st_tensor *t;
	uint64_t n;
	struct st_tensor **by_name;	/* t sorted by name */
	json_t *config;			/* config.json */
};

/*
 * Opens every *.safetensors file of dir and its config.json. Each shard's
 * header (an 8-byte length, then JSON) is checked: the length inside the
 * file and at most 100 MiB, the JSON an object of tensors, each with a dtype
 * string, a shape of at most 8 non-negative integers and data_offsets
 * [begin, end] inside the data section, of the shape's size when the dtype
 * is known, no two overlapping; a tensor name must not repeat across
 * shards. Returns 0 and sets *out, or -EINVAL / -ENODATA naming the file,
 * the tensor and the offset, -ENOENT when dir has no shard or no
 * config.json, or the open error.
 */
int st_open(const char *dir, struct st_dir **out);
void st_close(struct st_dir *d);

const struct st_tensor *st_find(const struct st_dir *d, const char *name);
/* Reads len bytes of t's data at offset off; 0, -EIO or -ENODATA (named). */
int st_read(struct st_dir *d, const struct st_tensor *t, uint64_t off, void *buf, uint64_t len);

#endif /* MP_STORE_SAFETENSORS_H */

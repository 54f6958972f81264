// SPDX-License-Identifier: MIT
/* Hugging Face safetensors shards: JSON headers parsed, every tensor's place checked. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "store/fileio.h"
#include "store/safetensors.h"

/* Bytes per element of the safetensors dtypes (the size check needs it), and the readable ones. */
static const struct {
	const char *name;
	uint32_t size;
	int type;		/* enum mp_dtype, or -1 */
} st_types[] = {
	{ "F32", 4, MP_DTYPE_F32 }, { "F16", 2, MP_DTYPE_F16 }, { "BF16", 2, MP_DTYPE_BF16 },
	{ "F64", 8, -1 }, { "I64", 8, -1 }, { "U64", 8, -1 }, { "I32", 4, -1 },
	{ "U32", 4, -1 }, { "I16", 2, -1 }, { "U16", 2, -1 }, { "I8", 1, -1 },
	{ "U8", 1, -1 }, { "BOOL", 1, -1 }, { "F8_E4M3", 1, -1 }, { "F8_E5M2", 1, -1 },
};

/* All len bytes at off: 0, -ENODATA when the file ends before, or -errno. */
static int pread_all(int fd, void *buf, uint64_t len, uint64_t off)
{
	ssize_t n = mpk_pread_full(fd, buf, len, off);

	return n < 0 ? (int)n : (uint64_t)n == len ? 0 : -ENODATA;
}

static bool get_u64(const json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return false;
	*out = (uint64_t)json_integer_value(v);
	return true;
}

/* The dtype, shape and data_offsets of one entry, checked against the shard's data section. */
static int parse_entry(struct st_dir *d, uint32_t fi, const char *name, json_t *e,
		       uint64_t data_off, struct st_tensor *t)
{
	const struct st_file *f = &d->files[fi];
	const char *dt = json_string_value(json_object_get(e, "dtype"));
	json_t *shape = json_object_get(e, "shape"), *offs = json_object_get(e, "data_offsets");
	uint64_t begin, end, n = 1, size = 0;

	if (!json_is_object(e) || !dt || strlen(dt) >= sizeof(t->dtype) || !json_is_array(shape) ||
	    json_array_size(shape) > ST_MAX_DIMS || !json_is_array(offs) ||
	    json_array_size(offs) != 2 || !get_u64(json_array_get(offs, 0), &begin) ||
	    !get_u64(json_array_get(offs, 1), &end) || begin > end)
		return mp_err(-EINVAL, "%s: tensor '%s': the header entry needs a dtype, a shape of "
			      "at most %u sizes and data_offsets [begin, end]", f->path, name,
			      ST_MAX_DIMS);
	t->name = strdup(name);
	if (!t->name)
		return mp_err(-ENOMEM, "%s: out of memory", f->path);
	t->file = fi;
	snprintf(t->dtype, sizeof(t->dtype), "%s", dt);
	t->n_dims = (uint32_t)json_array_size(shape);
	for (uint32_t i = 0; i < t->n_dims; i++)
		if (!get_u64(json_array_get(shape, i), &t->shape[i]) ||
		    __builtin_mul_overflow(n, t->shape[i], &n))
			return mp_err(-EINVAL, "%s: tensor '%s': size %u of its shape is not a "
				      "count (or the product overflows)", f->path, name, i);
	for (size_t i = 0; i < MP_ARRAY_SIZE(st_types); i++) {
		if (strcmp(dt, st_types[i].name))
			continue;
		if (__builtin_mul_overflow(n, (uint64_t)st_types[i].size, &size) ||
		    size != end - begin)
			return mp_err(-EINVAL, "%s: tensor '%s': data_offsets [%llu, %llu) hold %llu "
				      "bytes, its shape of %s needs %llu", f->path, name,
				      (unsigned long long)begin, (unsigned long long)end,
				      (unsigned long long)(end - begin), dt,
				      (unsigned long long)size);
		t->readable = st_types[i].type >= 0;
		t->type = t->readable ? (enum mp_dtype)st_types[i].type : MP_DTYPE_F32;
	}
	if (end > f->size - data_off)
		return mp_err(-ENODATA, "%s: tensor '%s': data [%llu, %llu) runs past the end of the "
			      "file (%llu bytes)", f->path, name,
			      (unsigned long long)(data_off + begin),
			      (unsigned long long)(data_off + end), (unsigned long long)f->size);
	t->off = data_off + begin;
	t->bytes = end - begin;
	return 0;
}

/* The 8-byte length and the JSON header of shard fi. */
static int read_header(struct st_dir *d, uint32_t fi, json_t **out, uint64_t *data_off)
{
	const struct st_file *f = &d->files[fi];
	json_error_t jerr;
	uint64_t len = 0;
	char *buf;
	int err;

	if (f->size < 8 || (err = pread_all(f->fd, &len, 8, 0)))
		return mp_err(-ENODATA, "%s: truncated: %llu bytes, no header length", f->path,
			      (unsigned long long)f->size);
	if (len > f->size - 8 || len > ST_MAX_HEADER)
		return mp_err(len > ST_MAX_HEADER ? -EINVAL : -ENODATA, "%s: a header of %llu bytes "
			      "at offset 8 %s", f->path, (unsigned long long)len,
			      len > ST_MAX_HEADER ? "is above the format's 100 MiB" :
			      "runs past the end of the file");
	buf = malloc(len ? len : 1);
	if (!buf)
		return mp_err(-ENOMEM, "%s: out of memory for a %llu-byte header", f->path,
			      (unsigned long long)len);
	err = pread_all(f->fd, buf, len, 8);
	*out = err ? NULL : json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	free(buf);
	if (err)
		return mp_err(err, "%s: reading the header: %s", f->path, strerror(-err));
	if (!json_is_object(*out)) {
		json_decref(*out);
		*out = NULL;
		return mp_err(-EINVAL, "%s: the header is not a JSON object (at offset %llu: %s)",
			      f->path, 8ull + (unsigned long long)jerr.position, jerr.text);
	}
	*data_off = 8 + len;
	return 0;
}

static int cmp_off(const void *a, const void *b)
{
	const struct st_tensor *x = *(const struct st_tensor *const *)a;
	const struct st_tensor *y = *(const struct st_tensor *const *)b;

	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->off < y->off ? -1 : x->off > y->off;
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp((*(const struct st_tensor *const *)a)->name,
		      (*(const struct st_tensor *const *)b)->name);
}

/* No two tensors share bytes, no name repeats across shards; d->by_name for st_find(). */
static int check_tensors(struct st_dir *d)
{
	struct st_tensor **v = malloc((d->n ? d->n : 1) * sizeof(*v));
	int err = 0;

	if (!v)
		return mp_err(-ENOMEM, "%s: out of memory", d->path);
	for (uint64_t i = 0; i < d->n; i++)
		v[i] = &d->t[i];
	qsort(v, d->n, sizeof(*v), cmp_off);
	for (uint64_t i = 1; i < d->n && !err; i++)
		if (v[i]->file == v[i - 1]->file && v[i]->off < v[i - 1]->off + v[i - 1]->bytes)
			err = mp_err(-EINVAL, "%s: tensor '%s' at offset %llu overlaps tensor '%s'",
				     d->files[v[i]->file].path, v[i]->name,
				     (unsigned long long)v[i]->off, v[i - 1]->name);
	qsort(v, d->n, sizeof(*v), cmp_name);
	for (uint64_t i = 1; i < d->n && !err; i++)
		if (!strcmp(v[i]->name, v[i - 1]->name))
			err = mp_err(-EINVAL, "%s: tensor '%s' is in two shards (%s and %s)", d->path,
				     v[i]->name, d->files[v[i - 1]->file].path,
				     d->files[v[i]->file].path);
	d->by_name = v;
	return err;
}

static int load_shard(struct st_dir *d, uint32_t fi)
{
	json_t *h = NULL, *e;
	uint64_t data_off = 0;
	const char *name;
	struct st_tensor *t;
	int err = read_header(d, fi, &h, &data_off);

	if (err)
		return err;
	t = realloc(d->t, (d->n + json_object_size(h) + 1) * sizeof(*t));
	if (!t) {
		json_decref(h);
		return mp_err(-ENOMEM, "%s: out of memory", d->files[fi].path);
	}
	d->t = t;
	json_object_foreach(h, name, e) {
		if (!strcmp(name, "__metadata__"))
			continue;
		memset(&d->t[d->n], 0, sizeof(d->t[d->n]));
		err = parse_entry(d, fi, name, e, data_off, &d->t[d->n]);
		d->n++;
		if (err)
			break;
	}
	json_decref(h);
	return err;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The *.safetensors files of the directory, in name order. */
static int list_shards(struct st_dir *d, char ***names, uint32_t *n)
{
	DIR *dir = opendir(d->path);
	struct dirent *de;
	size_t len;

	*names = NULL;
	*n = 0;
	if (!dir)
		return mp_err(-errno, "%s: cannot open the directory: %s", d->path, strerror(errno));
	while ((de = readdir(dir))) {
		char **v;

		len = strlen(de->d_name);
		if (len < 12 || strcmp(de->d_name + len - 12, ".safetensors"))
			continue;
		v = realloc(*names, (*n + 1) * sizeof(*v));
		if (!v || asprintf(&v[*n], "%s/%s", d->path, de->d_name) < 0) {
			*names = v ? v : *names;
			closedir(dir);
			return mp_err(-ENOMEM, "%s: out of memory", d->path);
		}
		*names = v;
		(*n)++;
	}
	closedir(dir);
	if (!*n)
		return mp_err(-ENOENT, "%s: no *.safetensors file", d->path);
	qsort(*names, *n, sizeof(**names), cmp_str);
	return 0;
}

static int open_shards(struct st_dir *d)
{
	char **names;
	uint32_t n;
	int err = list_shards(d, &names, &n);
	struct stat st;

	d->files = calloc(n ? n : 1, sizeof(*d->files));
	if (!err && !d->files)
		err = mp_err(-ENOMEM, "%s: out of memory", d->path);
	for (uint32_t i = 0; i < n; i++) {
		if (!err) {
			struct st_file *f = &d->files[d->n_files++];

			f->path = names[i];
			names[i] = NULL;
			f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
			if (f->fd < 0 || fstat(f->fd, &st))
				err = mp_err(-errno, "%s: cannot open: %s", f->path, strerror(errno));
			else
				f->size = (uint64_t)st.st_size;
			if (!err)
				err = load_shard(d, d->n_files - 1);
		}
		free(names[i]);
	}
	free(names);
	return err ? err : check_tensors(d);
}

int st_open(const char *dir, struct st_dir **out)
{
	struct st_dir *d = calloc(1, sizeof(*d));
	json_error_t jerr;
	char *config = NULL;
	int err;

	*out = NULL;
	if (!d || !(d->path = strdup(dir))) {
		free(d);
		return mp_err(-ENOMEM, "%s: out of memory", dir);
	}
	err = open_shards(d);
	if (!err && asprintf(&config, "%s/config.json", dir) < 0) {
		config = NULL;
		err = mp_err(-ENOMEM, "%s: out of memory", dir);
	}
	if (!err) {
		d->config = json_load_file(config, JSON_REJECT_DUPLICATES, &jerr);
		if (!json_is_object(d->config))
			err = mp_err(access(config, F_OK) ? -ENOENT : -EINVAL, "%s: %s (line %d)",
				     config, jerr.text, jerr.line);
	}
	free(config);
	if (err) {
		st_close(d);
		return err;
	}
	*out = d;
	return 0;
}

void st_close(struct st_dir *d)
{
	if (!d)
		return;
	for (uint32_t i = 0; i < d->n_files; i++) {
		if (d->files[i].fd >= 0)
			close(d->files[i].fd);
		free(d->files[i].path);
	}
	for (uint64_t i = 0; i < d->n; i++)
		free(d->t[i].name);
	json_decref(d->config);
	free(d->by_name);
	free(d->files);
	free(d->t);
	free(d->path);
	free(d);
}

const struct st_tensor *st_find(const struct st_dir *d, const char *name)
{
	struct st_tensor key = { .name = (char *)name }, *kp = &key, **hit;

	hit = d->by_name ? bsearch(&kp, d->by_name, d->n, sizeof(*d->by_name), cmp_name) : NULL;
	return hit ? *hit : NULL;
}

int st_read(struct st_dir *d, const struct st_tensor *t, uint64_t off, void *buf, uint64_t len)
{
	const struct st_file *f = &d->files[t->file];
	int err;

	if (off > t->bytes || len > t->bytes - off)
		return mp_err(-EINVAL, "%s: tensor '%s': read of [%llu, +%llu) outside its %llu "
			      "bytes", f->path, t->name, (unsigned long long)off,
			      (unsigned long long)len, (unsigned long long)t->bytes);
	err = pread_all(f->fd, buf, len, t->off + off);
	if (err)
		return mp_err(err, "%s: tensor '%s': read at offset %llu: %s", f->path, t->name,
			      (unsigned long long)(t->off + off),
			      err == -ENODATA ? "the file shrank" : strerror(-err));
	return 0;
}

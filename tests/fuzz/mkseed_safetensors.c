// SPDX-License-Identifier: MIT
/*
 * Writes the safetensors fuzz seeds into DIR: the shard of a small generated
 * model of the fuzzer's geometry (st_fuzz.h), in f32 and in bf16, one file each.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <moepager.h>

#include "st_fuzz.h"
#include "st_write.h"

static int write_seed(const char *dir, const char *name, enum mp_dtype dtype)
{
	struct mp_geometry g = ST_FUZZ_GEOMETRY;
	struct st_write_opts o = { .model_type = "mixtral" };
	char mpk[4096], from[4096], to[4096], config[4096];
	int err;

	g.dtype = dtype;
	snprintf(mpk, sizeof(mpk), "%s/%s.mpk", dir, name);
	snprintf(from, sizeof(from), "%s/model-00001-of-00001.safetensors", dir);
	snprintf(to, sizeof(to), "%s/%s.safetensors", dir, name);
	snprintf(config, sizeof(config), "%s/config.json", dir);
	err = mp_gen_model(mpk, &g, 1, name, NULL, NULL);
	if (!err)
		err = st_write_dir(mpk, dir, &o);
	if (!err && rename(from, to))
		err = -errno;
	unlink(mpk);
	unlink(config);
	if (err)
		fprintf(stderr, "mkseed_safetensors: %s: %s\n", to, strerror(-err));
	return err;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: mkseed_safetensors DIR\n");
		return 2;
	}
	if (mkdir(argv[1], 0755) && errno != EEXIST) {
		perror(argv[1]);
		return 1;
	}
	return write_seed(argv[1], "l1e2-f32", MP_DTYPE_F32) ||
	       write_seed(argv[1], "l1e2-bf16", MP_DTYPE_BF16) ? 1 : 0;
}

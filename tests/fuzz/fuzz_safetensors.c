// SPDX-License-Identifier: MIT
/*
 * libFuzzer target: the safetensors import on any shard. The input is the
 * only *.safetensors file of a directory whose config.json describes the
 * seeds' Mixtral geometry (st_fuzz.h); the import parses the header, checks
 * every tensor and, for what it accepts, writes an .mpk that must verify.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <moepager.h>

#include "st_fuzz.h"
#include "st_write.h"

static char dir[64], shard[128], out[128];

#define CHECK(c) do {								\
	if (!(c)) {								\
		fprintf(stderr, "fuzz_safetensors: broken promise: %s\n", #c);	\
		__builtin_trap();						\
	}									\
} while (0)

static char config[128];

static void remove_dir(void)
{
	unlink(out);
	unlink(shard);
	unlink(config);
	rmdir(dir);
}

static void setup(void)
{
	const struct mp_geometry g = ST_FUZZ_GEOMETRY;

	/* tmpfs where there is one: each accepted input writes and syncs an .mpk */
	snprintf(dir, sizeof(dir), "%s/fuzz_st.XXXXXX",
		 access("/dev/shm", W_OK) ? "/tmp" : "/dev/shm");
	if (!mkdtemp(dir) || st_write_config(dir, &g, "mixtral", NULL)) {
		perror("fuzz_safetensors setup");
		abort();
	}
	snprintf(shard, sizeof(shard), "%s/model.safetensors", dir);
	snprintf(out, sizeof(out), "%s/out.mpk", dir);
	snprintf(config, sizeof(config), "%s/config.json", dir);
	atexit(remove_dir);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	FILE *f;
	int ret;

	if (!dir[0])
		setup();
	f = fopen(shard, "wb");
	if (!f)
		return 0;
	if (fwrite(data, 1, size, f) != size) {
		fclose(f);
		return 0;
	}
	fclose(f);
	ret = mp_safetensors_import(dir, out, NULL);
	CHECK(ret <= 0);
	if (!ret) {
		struct mp_store *s;

		CHECK(mp_store_open(out, &s) == 0);
		CHECK(mp_store_verify(s, NULL, 0, NULL, NULL) == 0);
		mp_store_close(s);
		unlink(out);
	}
	return 0;
}

// SPDX-License-Identifier: MIT
/*
 * Description: a child memory cgroup for a benchmark run (v1 memory
 * controller where mounted, else v2): the mmap baselines of `moepager bench`
 * and `bench-preload` run under a memory limit.
 */
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"

int memcg_base(struct memcg *cg)
{
	char line[PATH_MAX];
	FILE *f;

	memset(cg, 0, sizeof(*cg));
	f = fopen("/proc/self/cgroup", "r");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char *nl = strchr(line, '\n');

		if (nl)
			*nl = 0;
		if (strstr(line, ":memory:")) {
			snprintf(cg->dir, sizeof(cg->dir), "/sys/fs/cgroup/memory%.*s",
				 PATH_MAX - 64, strstr(line, ":memory:") + 8);
			cg->v2 = false;
			break;
		}
		if (!strncmp(line, "0::", 3) && !cg->dir[0]) {
			snprintf(cg->dir, sizeof(cg->dir), "/sys/fs/cgroup%.*s", PATH_MAX - 64,
				 line + 3);
			cg->v2 = true;
		}
	}
	fclose(f);
	return cg->dir[0] ? 0 : -ENOENT;
}

void memcg_child_dir(const struct memcg *base, pid_t pid, char *dir, size_t len)
{
	snprintf(dir, len, "%.*s/moepager-bench-%d", PATH_MAX - 40, base->dir, (int)pid);
}

int memcg_enter(struct memcg *cg)
{
	char path[PATH_MAX + 64], dir[PATH_MAX];
	int fd, err;

	err = memcg_base(cg);
	if (err)
		return err;
	memcg_child_dir(cg, getpid(), dir, sizeof(dir));
	if (mkdir(dir, 0755) && errno != EEXIST)
		return -errno;
	snprintf(cg->dir, sizeof(cg->dir), "%s", dir);
	snprintf(path, sizeof(path), "%s/cgroup.procs", cg->dir);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || dprintf(fd, "%d\n", (int)getpid()) < 0) {
		err = -errno;
		if (fd >= 0)
			close(fd);
		rmdir(cg->dir);
		return err;
	}
	close(fd);
	return 0;
}

int memcg_write(const struct memcg *cg, const char *file, uint64_t v)
{
	char path[PATH_MAX + 64];
	int fd, err = 0;

	snprintf(path, sizeof(path), "%s/%s", cg->dir, file);
	fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (dprintf(fd, "%llu\n", (unsigned long long)v) < 0)
		err = -errno;
	close(fd);
	return err;
}

int memcg_read(const struct memcg *cg, const char *file, uint64_t *v)
{
	char path[PATH_MAX + 64];
	unsigned long long x;
	FILE *f;
	int n;

	snprintf(path, sizeof(path), "%s/%s", cg->dir, file);
	f = fopen(path, "r");
	if (!f)
		return -errno;
	n = fscanf(f, "%llu", &x);
	fclose(f);
	if (n != 1)
		return -EINVAL;
	*v = x;
	return 0;
}

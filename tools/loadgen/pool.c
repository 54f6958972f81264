// SPDX-License-Identifier: MIT
/*
 * loadgen's backends: one URL, or a pool file that whoever scales the
 * servers rewrites (a new file renamed over the old): its first line
 * "epoch N", then one URL per line. Each request goes to the current
 * epoch's backend with the fewest of loadgen's requests in flight.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "loadgen/loadgen.h"

/* The index of url among the backends ever seen, added if new; -1 when the table is full. */
static int backend_of(struct lg_pool *p, const char *url)
{
	for (uint32_t i = 0; i < p->nurl; i++)
		if (!strcmp(p->url[i], url))
			return (int)i;
	if (p->nurl == LG_POOL_MAX)
		return -1;
	p->url[p->nurl] = strdup(url);
	return p->url[p->nurl] ? (int)p->nurl++ : -1;
}

/* Parses the pool file into epoch and cur[]. Returns 0 or -EINVAL with why printed. */
static int parse(struct lg_pool *p, FILE *f)
{
	uint32_t cur[LG_POOL_MAX], ncur = 0, lineno = 0;
	unsigned long long epoch;
	char line[1024];
	bool have_epoch = false;

	while (fgets(line, sizeof(line), f)) {
		size_t len = strcspn(line, "\r\n");
		int b;

		lineno++;
		line[len] = '\0';
		if (!len || line[0] == '#')
			continue;
		if (!have_epoch) {
			char end;

			if (sscanf(line, "epoch %llu%c", &epoch, &end) != 1)
				goto bad;
			have_epoch = true;
			continue;
		}
		if (strncmp(line, "http://", 7) || ncur == LG_POOL_MAX)
			goto bad;
		b = backend_of(p, line);
		if (b < 0)
			goto bad;
		cur[ncur++] = (uint32_t)b;
	}
	if (!have_epoch)
		goto bad;
	if (p->have && epoch < p->epoch) {
		cli_say("%s: epoch %llu after %llu: ignored", p->path, epoch,
			(unsigned long long)p->epoch);
		return -EINVAL;
	}
	p->epoch = epoch;
	memcpy(p->cur, cur, sizeof(cur));
	p->ncur = ncur;
	return 0;
bad:
	cli_say("%s line %u: want \"epoch N\" first, then up to %u http:// URLs, one per line",
		p->path, lineno, LG_POOL_MAX);
	return -EINVAL;
}

int lg_pool_init(struct lg_pool *p, const char *url, const char *path)
{
	memset(p, 0, sizeof(*p));
	p->path = path;
	if (path)
		return lg_pool_refresh(p);
	if (backend_of(p, url) < 0)
		return -ENOMEM;
	p->ncur = 1;
	p->have = true;
	return 0;
}

int lg_pool_refresh(struct lg_pool *p)
{
	struct stat st;
	FILE *f;
	int err;

	if (!p->path)
		return 0;
	/* The file is replaced by rename: a new inode or time says it changed. */
	if (stat(p->path, &st)) {
		if (p->have)
			return 0;
		cli_say("%s: %s", p->path, strerror(errno));
		return -errno;
	}
	if (p->have && st.st_ino == p->st.st_ino && st.st_mtim.tv_sec == p->st.st_mtim.tv_sec &&
	    st.st_mtim.tv_nsec == p->st.st_mtim.tv_nsec && st.st_size == p->st.st_size)
		return 0;
	f = fopen(p->path, "re");
	if (!f)
		return p->have ? 0 : -errno;
	err = parse(p, f);
	fclose(f);
	/* A bad file is reported once and the last good pool kept. */
	p->st = st;
	if (!err) {
		p->have = true;
		p->epochs++;
	}
	return p->have ? 0 : err;
}

int lg_pool_pick(struct lg_pool *p)
{
	int best = -1;

	for (uint32_t k = 0; k < p->ncur; k++) {
		uint32_t b = p->cur[(k + p->rr) % p->ncur];

		if (best < 0 || p->inflight[b] < p->inflight[best])
			best = (int)b;
	}
	p->rr++;
	return best;
}

void lg_pool_free(struct lg_pool *p)
{
	for (uint32_t i = 0; i < p->nurl; i++)
		free(p->url[i]);
	p->nurl = 0;
}

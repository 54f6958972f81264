// SPDX-License-Identifier: MIT
/* moepager faultbench: expert fault service against raw io_uring and mmap baselines, in one run. */
#include <argp.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <moepager.h>

#include "cli.h"

#define NSETS 3		/* expert sets the three cold methods rotate over */
#define HOST_ROUNDS 4	/* host-tier passes per repeat: enough faults for a p99 */

static struct fb_env {
	const char *path;
	bool json;
	uint32_t experts;	/* per set */
	uint32_t repeat;
	uint32_t io_depth;
	uint64_t io_bytes;
	uint32_t fill_threads;
	bool no_drop;
	bool verbose;
	bool shared;
	const char *shared_pages;
} env;

static const char doc[] =
	"Measure, on one model file and in one run, how fast the pager serves whole-expert\n"
	"faults, against the baselines of the same machine:\n"
	"  raw    io_uring O_DIRECT reads of each expert into one reused, pre-faulted\n"
	"         buffer (the physical limit), with the pager's queue depth and request size;\n"
	"  file   first touch of an expert that is not in memory: fault, read from the file\n"
	"         tier with a cold page cache, checksum, map (steady state: the budget is\n"
	"         full, so each fill recycles an evicted expert's memory);\n"
	"  host   first touch of an expert held in host memory but unmapped;\n"
	"  mmap   a plain mmap of the file, one read per page of the same experts, after\n"
	"         dropping the page cache.\n"
	"Three sets of experts rotate over raw/file/mmap across repeats, so every method\n"
	"reads the same bytes; raw reads and file faults alternate expert by expert.\n"
	"Figures are medians over repeats; latencies are per fault, as the faulting\n"
	"thread sees them (scheduling delays on a busy machine included).\n"
	"The page cache is dropped with /proc/sys/vm/drop_caches when run as root, else\n"
	"with posix_fadvise(DONTNEED); raw and file reads use O_DIRECT either way.\n"
	"\n"
	"--json prints one object with raw_io_uring_gbps, file_fault_gbps, host_fault_gbps,\n"
	"host_fault_p50_us, host_fault_p99_us, mmap_gbps, expert_bytes, file_to_raw (the\n"
	"median of per-repeat ratios), file_fault_fresh_gbps (fills into new memory),\n"
	"file_fault_p50_us/p99_us, host_service_p50_us/p99_us (first fault message to\n"
	"mapped, from the pager's log2 histogram: the part scheduling cannot stretch),\n"
	"host_p99_to_p50, cache_mode, the parameters, and per repeat its raw, file and\n"
	"mmap GB/s and its own host-fault p50/p99 (the top-level host quantiles pool\n"
	"every repeat's faults).\n"
	"\n"
	"--shared adds the host tier shared by processes (moepager pagerd, run here as a\n"
	"child process): the same experts read through a daemon into its memfd, then\n"
	"dropped from this process's mapping only (MADV_DONTNEED) and touched again, so\n"
	"each touch is a MINOR fault the daemon serves with one UFFDIO_CONTINUE of the\n"
	"expert: what a second engine process pays. The JSON gains \"shared\" with\n"
	"host_fault_gbps, host_fault_p50_us/p99_us, file_fault_gbps/p50_us (first touch:\n"
	"the daemon's fill), samples, pages (--shared-pages), shmem_thp (the kernel's\n"
	"shmem THP setting) and continue_to_move_p50 (shared host-fault p50 over the\n"
	"MOVE path's).\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager faultbench --model mixtral-mini.mpk\n"
	"  moepager faultbench --model m.mpk --json --experts 16 --repeat 5\n";

enum {
	OPT_IO_DEPTH = 1000, OPT_IO_BYTES, OPT_THREADS, OPT_NO_DROP, OPT_VERBOSE, OPT_SHARED,
	OPT_SHARED_PAGES,
};

static const struct argp_option opts[] = {
	{ "model", 'm', "FILE", 0, "The .mpk model", 0 },
	{ "json", 'j', NULL, 0, "Print one JSON object on stdout", 0 },
	{ "experts", 'n', "N", 0, "Experts per measured set (default 16)", 0 },
	{ "repeat", 'r', "N", 0, "Repeats (default 3)", 0 },
	{ "io-depth", OPT_IO_DEPTH, "N", 0, "io_uring requests in flight (default 32)", 0 },
	{ "io-bytes", OPT_IO_BYTES, "SIZE", 0, "Bytes per request (default 512K)", 0 },
	{ "fill-threads", OPT_THREADS, "N", 0, "Pager fill threads (default 2)", 0 },
	{ "no-drop-caches", OPT_NO_DROP, NULL, 0, "Do not drop the page cache (warm mmap)", 0 },
	{ "verbose", OPT_VERBOSE, NULL, 0, "Print every fault's latency on stderr", 0 },
	{ "shared", OPT_SHARED, NULL, 0,
	  "Also measure host faults served by a pager daemon (UFFDIO_CONTINUE from its memfd)", 0 },
	{ "shared-pages", OPT_SHARED_PAGES, "KIND", 0,
	  "--shared: the daemon's pages (moepager pagerd --pages: small, thp, hugetlb)", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	int pages;

	switch (key) {
	case 'm':
		env.path = arg;
		break;
	case 'j':
		env.json = true;
		break;
	case 'n':
		cli_opt_u32(state, "--experts", arg, 1, 4096, &env.experts);
		break;
	case 'r':
		cli_opt_u32(state, "--repeat", arg, 1, 1000, &env.repeat);
		break;
	case OPT_IO_DEPTH:
		cli_opt_u32(state, "--io-depth", arg, 1, 4096, &env.io_depth);
		break;
	case OPT_IO_BYTES:
		cli_opt_size(state, "--io-bytes", arg, &env.io_bytes);
		if (env.io_bytes < 4096 || env.io_bytes % 4096 || env.io_bytes > (64u << 20)) {
			cli_error(-EINVAL, "--io-bytes: '%s' is not a multiple of 4K up to 64M", arg);
			cli_usage_error(state);
		}
		break;
	case OPT_THREADS:
		cli_opt_u32(state, "--fill-threads", arg, 1, 64, &env.fill_threads);
		break;
	case OPT_NO_DROP:
		env.no_drop = true;
		break;
	case OPT_VERBOSE:
		env.verbose = true;
		break;
	case OPT_SHARED:
		env.shared = true;
		break;
	case OPT_SHARED_PAGES:
		cli_opt_pages(state, "--shared-pages", arg, &pages);
		env.shared = true;
		env.shared_pages = arg;
		break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.path)
			argp_error(state, "--model FILE is required");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

struct expert_id {
	uint32_t layer;
	uint32_t expert;
};

/*
 * Cache control
 */

static const char *drop_caches(int fd)
{
	return env.no_drop ? "warm" : cli_drop_caches(fd);
}

/*
 * Raw baseline: io_uring O_DIRECT into one reused, pre-faulted buffer
 */

struct raw {
	struct io_uring ring;
	int fd;
	char *buf;
	uint64_t bytes;
};

static int raw_open(struct raw *r, const char *path, uint64_t bytes)
{
	int err;

	r->bytes = (bytes + 4095) & ~4095ull;
	r->fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	if (r->fd < 0)
		return cli_error(-errno, "%s: O_DIRECT: %s", path, strerror(errno));
	r->buf = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r->buf == MAP_FAILED) {
		close(r->fd);
		return -ENOMEM;
	}
	/* The same kind of memory the pager reads into: THP where the kernel gives it. */
	madvise(r->buf, r->bytes, MADV_HUGEPAGE);
	memset(r->buf, 1, r->bytes);
	err = io_uring_queue_init(env.io_depth, &r->ring, 0);
	if (err) {
		cli_error(0, "io_uring_queue_init: %s", strerror(-err));
		munmap(r->buf, r->bytes);
		close(r->fd);
	}
	return err;
}

static void raw_close(struct raw *r)
{
	io_uring_queue_exit(&r->ring);
	munmap(r->buf, r->bytes);
	close(r->fd);
}

/* Reads one expert with up to io_depth requests of io_bytes in flight. */
static int raw_read(struct raw *r, uint64_t off)
{
	uint64_t n = (r->bytes + env.io_bytes - 1) / env.io_bytes, sub = 0, done = 0;
	uint32_t inflight = 0;

	while (done < n) {
		struct io_uring_cqe *cqe;
		int ret;

		while (sub < n && inflight < env.io_depth) {
			struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
			uint64_t o = sub * env.io_bytes;
			uint32_t len = (uint32_t)(r->bytes - o < env.io_bytes ? r->bytes - o :
						  env.io_bytes);

			io_uring_prep_read(sqe, r->fd, r->buf + o, len, off + o);
			sub++;
			inflight++;
		}
		ret = io_uring_submit_and_wait(&r->ring, 1);
		if (ret < 0 && ret != -EINTR)
			return cli_error(ret, "io_uring_submit: %s",
				strerror(-ret));
		ret = io_uring_wait_cqe(&r->ring, &cqe);
		if (ret) {
			if (ret == -EINTR)
				continue;
			return cli_error(ret, "io_uring_wait_cqe: %s",
				strerror(-ret));
		}
		if (cqe->res <= 0)
			return cli_error(cqe->res ? cqe->res : -ENODATA, "raw read at %llu: %s",
				(unsigned long long)off, cqe->res ? strerror(-cqe->res) : "EOF");
		io_uring_cqe_seen(&r->ring, cqe);
		done++;
		inflight--;
	}
	return 0;
}

/*
 * The measured methods; each returns the GB/s over its set
 */

/* Reads one expert into the raw buffer; returns the ns it took, or a negative errno. */
static int64_t raw_one(struct raw *r, const struct mp_store *s, const struct expert_id *id)
{
	const struct mp_expert_info *x = mp_store_expert(s, id->layer, id->expert);
	uint64_t t0 = cli_now_ns();
	int err = raw_read(r, x->offset);

	return err ? err : (int64_t)(cli_now_ns() - t0);
}

/* Touches one byte of an expert: the fault brings the whole expert in. Returns the ns. */
static uint64_t touch_at(const volatile uint8_t *x, const struct expert_id *id, uint64_t bytes)
{
	uint64_t t0 = cli_now_ns(), dt;

	(void)x[bytes / 2];
	dt = cli_now_ns() - t0;
	if (env.verbose)
		fprintf(stderr, "fault layer %u expert %u: %.0f us\n", id->layer, id->expert,
			(double)dt / 1e3);
	return dt;
}

static uint64_t touch_one(struct mp_pager *p, const struct expert_id *id, uint64_t bytes)
{
	return touch_at(mp_pager_expert(p, id->layer, id->expert), id, bytes);
}

static void touch_each(struct mp_pager *p, const struct expert_id *set, uint64_t bytes,
		       double *lat_us, double *gbps)
{
	uint64_t total = 0;

	for (uint32_t i = 0; i < env.experts; i++) {
		uint64_t dt = touch_one(p, &set[i], bytes);

		lat_us[i] = (double)dt / 1e3;
		total += dt;
	}
	*gbps = (double)(bytes * env.experts) / (double)total;
}

static int run_mmap(int fd, uint64_t file_bytes, const struct mp_store *s,
		    const struct expert_id *set, double *gbps)
{
	const volatile uint8_t *m = mmap(NULL, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
	uint64_t t0, bytes = 0, sum = 0;

	if (m == MAP_FAILED)
		return cli_error(-errno, "mmap: %s", strerror(errno));
	t0 = cli_now_ns();
	for (uint32_t i = 0; i < env.experts; i++) {
		const struct mp_expert_info *x = mp_store_expert(s, set[i].layer, set[i].expert);

		for (uint64_t o = 0; o < x->bytes; o += 4096)
			sum += m[x->offset + o];
		bytes += x->bytes;
	}
	*gbps = (double)bytes / (double)(cli_now_ns() - t0);
	/* An impossible sum keeps the reads from being optimised away. */
	if (sum == UINT64_MAX)
		fputc(0, stderr);
	munmap((void *)m, file_bytes);
	return 0;
}

/*
 * Driver
 */

struct results {
	double *raw, *file, *mmap, *ratio;	/* per repeat */
	double *file_lat, *host_lat;		/* per fault, us */
	uint32_t nfile, nhost;
	double *sh_fill_lat, *sh_host_lat;	/* --shared: per fault, us */
	uint32_t sh_nfill, sh_nhost;
	char shmem_thp[64];
	double fresh_gbps;
	const char *cache_mode;
	bool direct;
	struct mp_pager_stats st;
	struct mp_pager_stats host_st;	/* service-time histogram of the host faults only */
};

static uint32_t gcd(uint32_t a, uint32_t b)
{
	while (b) {
		uint32_t t = a % b;

		a = b;
		b = t;
	}
	return a;
}

/* Distinct experts spread over the file: a stride coprime with the count visits each once. */
static void pick_sets(const struct mp_geometry *g, struct expert_id *ids, uint32_t n)
{
	uint32_t total = g->layers * g->experts, stride = (uint32_t)(total * 0.618) | 1;

	while (gcd(stride, total) != 1)
		stride++;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t k = (uint32_t)(((uint64_t)i * stride + 1) % total);

		ids[i].layer = k / g->experts;
		ids[i].expert = k % g->experts;
	}
}

static int bench(struct mp_store *s, struct results *res)
{
	const struct mp_geometry *g = mp_store_geometry(s);
	uint64_t xb = mp_store_expert_bytes(s);
	uint32_t n = env.experts, nsets = NSETS + 1;
	struct expert_id *ids = calloc((size_t)n * nsets, sizeof(*ids));
	struct expert_id *warm = ids, *sets[NSETS];
	struct mp_pager_stats before, after;
	struct mp_pager_config cfg;
	struct mp_pager *p = NULL;
	struct raw raw;
	double *lat = calloc(n, sizeof(*lat)), gbps;
	int fd = -1, err;

	if (!ids || !lat)
		return -ENOMEM;
	pick_sets(g, ids, n * nsets);
	for (int i = 0; i < NSETS; i++)
		sets[i] = ids + (size_t)n * (i + 1);
	fd = open(mp_store_path(s), O_RDONLY | O_CLOEXEC);
	err = fd < 0 ? -errno : raw_open(&raw, mp_store_path(s), xb);
	if (err)
		goto free_ids;

	mp_pager_config_init(&cfg);
	cfg.budget_bytes = n * xb;
	cfg.io_depth = env.io_depth;
	cfg.io_request_bytes = (uint32_t)env.io_bytes;
	cfg.fill_threads = env.fill_threads;
	cfg.no_route_fill = true;
	err = mp_pager_open(s, &cfg, &p);
	if (err) {
		cli_fail(err, "opening the pager");
		goto close_raw;
	}

	/* Fill the budget once: these fills take new memory, the measured ones recycle it. */
	res->cache_mode = drop_caches(fd);
	touch_each(p, warm, xb, lat, &res->fresh_gbps);
	mp_pager_stats_reset(p);

	for (uint32_t r = 0; r < env.repeat; r++) {
		const struct expert_id *rs = sets[r % NSETS];
		const struct expert_id *fs = sets[(r + 1) % NSETS];
		const struct expert_id *ms = sets[(r + 2) % NSETS];
		uint64_t raw_ns = 0, file_ns = 0;

		/*
		 * Raw reads and file-tier faults alternate expert by expert (and
		 * which goes first), so both see the same moments of a disk
		 * whose speed wanders.
		 */
		drop_caches(fd);
		for (uint32_t i = 0; i < n; i++) {
			int64_t dt = 0;
			uint64_t ft = 0;

			if (i & 1)
				ft = touch_one(p, &fs[i], xb);
			dt = raw_one(&raw, s, &rs[i]);
			if (dt < 0) {
				err = (int)dt;
				goto close_pager;
			}
			if (!(i & 1))
				ft = touch_one(p, &fs[i], xb);
			raw_ns += (uint64_t)dt;
			file_ns += ft;
			res->file_lat[res->nfile++] = (double)ft / 1e3;
		}
		res->raw[r] = (double)(n * xb) / (double)raw_ns;
		res->file[r] = (double)(n * xb) / (double)file_ns;
		res->ratio[r] = res->file[r] / res->raw[r];

		/* Host tier: the experts just read, unmapped but kept, then touched again. */
		mp_pager_stats(p, &before);
		for (uint32_t round = 0; round < HOST_ROUNDS; round++) {
			for (uint32_t i = 0; i < n; i++) {
				err = mp_pager_evict(p, fs[i].layer, fs[i].expert,
						     MP_EVICT_KEEP_HOST);
				if (err) {
					cli_error(0, "unmapping layer %u "
						"expert %u: %s (%s)", fs[i].layer, fs[i].expert,
						strerror(-err), mp_last_error());
					goto close_pager;
				}
			}
			touch_each(p, fs, xb, res->host_lat + res->nhost, &gbps);
			res->nhost += n;
		}
		mp_pager_stats(p, &after);
		for (int b = 0; b < MP_PAGER_HIST_BUCKETS; b++)
			res->host_st.fault_latency_hist[b] += after.fault_latency_hist[b] -
							      before.fault_latency_hist[b];

		drop_caches(fd);
		err = run_mmap(fd, mp_store_file_bytes(s), s, ms, &res->mmap[r]);
		if (err)
			goto close_pager;
	}
	mp_pager_stats(p, &res->st);
	res->direct = true;

close_pager:
	mp_pager_close(p);
close_raw:
	raw_close(&raw);
free_ids:
	if (fd >= 0)
		close(fd);
	free(ids);
	free(lat);
	return err;
}

/*
 * --shared: host faults through a pager daemon
 */

static void read_shmem_thp(char *buf, size_t len)
{
	char *sel, *end;
	ssize_t n;
	int fd = open("/sys/kernel/mm/transparent_hugepage/shmem_enabled", O_RDONLY | O_CLOEXEC);

	snprintf(buf, len, "unknown");
	if (fd < 0)
		return;
	n = read(fd, buf, len - 1);
	close(fd);
	buf[n > 0 ? n : 0] = 0;
	/* "always within_size advise [never] deny force": the bracketed one is in force. */
	sel = strchr(buf, '[');
	end = sel ? strchr(sel, ']') : NULL;
	if (sel && end) {
		memmove(buf, sel + 1, (size_t)(end - sel - 1));
		buf[end - sel - 1] = 0;
	}
}

/* The experts of set, first touched (the daemon's fill) then, round after round, refaulted. */
static int shared_touches(struct mp_attach *a, const struct expert_id *set, uint64_t xb,
			  int fd, struct results *res)
{
	uint64_t len = (xb + 4095) & ~4095ull;

	drop_caches(fd);
	for (uint32_t i = 0; i < env.experts; i++)
		res->sh_fill_lat[res->sh_nfill++] = (double)touch_at(
			mp_attach_expert(a, set[i].layer, set[i].expert), &set[i], xb) / 1e3;
	for (uint32_t round = 0; round < env.repeat * HOST_ROUNDS; round++) {
		for (uint32_t i = 0; i < env.experts; i++) {
			void *x = (void *)mp_attach_expert(a, set[i].layer, set[i].expert);

			/* Gone from this process only: the memfd keeps it, as for a new engine. */
			if (madvise(x, len, MADV_DONTNEED))
				return -errno;
		}
		for (uint32_t i = 0; i < env.experts; i++)
			res->sh_host_lat[res->sh_nhost++] = (double)touch_at(
				mp_attach_expert(a, set[i].layer, set[i].expert), &set[i], xb) / 1e3;
	}
	return 0;
}

static int shared_bench(struct mp_store *s, struct results *res)
{
	const struct mp_geometry *g = mp_store_geometry(s);
	uint64_t xb = mp_store_expert_bytes(s), budget;
	struct expert_id *ids = calloc((size_t)env.experts * 2, sizeof(*ids));
	struct mp_attach *a = NULL;
	char sock[64];
	int fd = -1, err;
	pid_t d;

	/* Whole strides: room for the set with 2 MiB (hugetlb) pages as well. */
	budget = (env.experts + 1) * ((xb + MP_EXPERT_ALIGN - 1) / MP_EXPERT_ALIGN * MP_EXPERT_ALIGN);
	read_shmem_thp(res->shmem_thp, sizeof(res->shmem_thp));
	if (!ids)
		return -ENOMEM;
	pick_sets(g, ids, env.experts * 2);
	snprintf(sock, sizeof(sock), "/tmp/moepager-faultbench-%d.sock", (int)getpid());
	d = cli_start_pagerd(mp_store_path(s), sock, budget, env.shared_pages);
	if (d < 0) {
		cli_error(0, "starting moepager pagerd failed");
		free(ids);
		return (int)d;
	}
	fd = open(mp_store_path(s), O_RDONLY | O_CLOEXEC);
	err = fd < 0 ? -errno : mp_attach_open(s, sock, &a);
	if (!err)
		err = shared_touches(a, ids + env.experts, xb, fd, res);
	if (err)
		cli_fail(err, "shared host tier");
	mp_attach_close(a);
	cli_child_stop(d);
	if (fd >= 0)
		close(fd);
	free(ids);
	return err;
}

static json_t *shared_json(const struct results *res, uint64_t xb, double move_p50)
{
	double host_us = 0, fill_us = 0, p50 = cli_quantile(res->sh_host_lat, res->sh_nhost, 0.5);

	for (uint32_t i = 0; i < res->sh_nhost; i++)
		host_us += res->sh_host_lat[i];
	for (uint32_t i = 0; i < res->sh_nfill; i++)
		fill_us += res->sh_fill_lat[i];
	return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:s, s:s, s:f}",
			 "host_fault_gbps", (double)xb * res->sh_nhost / (host_us * 1e3),
			 "host_fault_p50_us", p50,
			 "host_fault_p99_us", cli_quantile(res->sh_host_lat, res->sh_nhost, 0.99),
			 "file_fault_gbps", (double)xb * res->sh_nfill / (fill_us * 1e3),
			 "file_fault_p50_us", cli_quantile(res->sh_fill_lat, res->sh_nfill, 0.5),
			 "file_fault_p99_us", cli_quantile(res->sh_fill_lat, res->sh_nfill, 0.99),
			 "samples", (json_int_t)res->sh_nhost, "shmem_thp", res->shmem_thp,
			 "pages", env.shared_pages,
			 "continue_to_move_p50", move_p50 > 0 ? p50 / move_p50 : 0.0);
}

static int report(const struct mp_store *s, struct results *res)
{
	uint32_t R = env.repeat;
	double raw = cli_median(res->raw, R), file = cli_median(res->file, R);
	double ratio = cli_median(res->ratio, R), mm = cli_median(res->mmap, R);
	double fp50 = cli_quantile(res->file_lat, res->nfile, 0.5);
	double fp99 = cli_quantile(res->file_lat, res->nfile, 0.99);
	const struct mp_pager_stats *st = &res->st;
	uint64_t xb = mp_store_expert_bytes(s);
	double host_us = 0, hp50, hp99, host;
	int err = 0;

	for (uint32_t i = 0; i < res->nhost; i++)
		host_us += res->host_lat[i];
	host = (double)xb * res->nhost / (host_us * 1e3);
	hp50 = cli_quantile(res->host_lat, res->nhost, 0.5);
	hp99 = cli_quantile(res->host_lat, res->nhost, 0.99);

	if (env.json) {
		json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:b}",
				      "model", mp_store_path(s), "expert_bytes", (json_int_t)xb,
				      "experts", (json_int_t)env.experts,
				      "repeat", (json_int_t)R, "io_depth", (json_int_t)env.io_depth,
				      "io_request_bytes", (json_int_t)env.io_bytes,
				      "fill_threads", (json_int_t)env.fill_threads,
				      "cache_mode", res->cache_mode, "o_direct", res->direct);
		json_t *per = json_object();

		if (!o || !per) {
			json_decref(o);
			json_decref(per);
			return -ENOMEM;
		}
		json_object_set_new(o, "raw_io_uring_gbps", json_real(raw));
		json_object_set_new(o, "file_fault_gbps", json_real(file));
		json_object_set_new(o, "file_to_raw", json_real(ratio));
		json_object_set_new(o, "file_fault_fresh_gbps", json_real(res->fresh_gbps));
		json_object_set_new(o, "file_fault_p50_us", json_real(fp50));
		json_object_set_new(o, "file_fault_p99_us", json_real(fp99));
		json_object_set_new(o, "host_fault_gbps", json_real(host));
		json_object_set_new(o, "host_fault_p50_us", json_real(hp50));
		json_object_set_new(o, "host_fault_p99_us", json_real(hp99));
		json_object_set_new(o, "host_fault_samples", json_integer(res->nhost));
		json_object_set_new(o, "host_p99_to_p50", json_real(hp50 > 0 ? hp99 / hp50 : 0));
		json_object_set_new(o, "host_service_p50_us", json_real(
			(double)mp_pager_stats_quantile(&res->host_st, 0.5) / 1e3));
		json_object_set_new(o, "host_service_p99_us", json_real(
			(double)mp_pager_stats_quantile(&res->host_st, 0.99) / 1e3));
		json_object_set_new(o, "mmap_gbps", json_real(mm));
		json_object_set_new(o, "faults_file", json_integer((json_int_t)st->faults_file));
		json_object_set_new(o, "faults_host", json_integer((json_int_t)st->faults_host));
		json_object_set_new(o, "fault_waits", json_integer((json_int_t)st->fault_waits));
		json_object_set_new(o, "read_errors", json_integer((json_int_t)st->read_errors));
		for (uint32_t r = 0; r < R; r++) {
			/* Each repeat's own host faults (64 by default: its p99 is its slowest). */
			const double *hl = res->host_lat + (size_t)r * env.experts * HOST_ROUNDS;
			uint32_t hn = env.experts * HOST_ROUNDS;
			json_t *row = json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "raw_gbps",
						res->raw[r], "file_gbps", res->file[r],
						"file_to_raw", res->ratio[r], "mmap_gbps",
						res->mmap[r], "host_fault_p50_us",
						cli_quantile(hl, hn, 0.5), "host_fault_p99_us",
						cli_quantile(hl, hn, 0.99));
			char key[16];

			snprintf(key, sizeof(key), "%u", r);
			json_object_set_new(per, key, row);
		}
		json_object_set_new(o, "repeats", per);
		if (env.shared)
			json_object_set_new(o, "shared", shared_json(res, xb, hp50));
		if (json_dumpf(o, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(6)))
			err = -EIO;
		putchar('\n');
		json_decref(o);
		return err;
	}
	printf("faultbench %s: %u experts x %u repeats, expert %.1f MiB, %u x %llu KiB in "
	       "flight, cache: %s\n", mp_store_path(s), env.experts, R, xb / 1048576.0,
	       env.io_depth, (unsigned long long)(env.io_bytes >> 10), res->cache_mode);
	printf("  raw io_uring O_DIRECT     %8.2f GB/s\n", raw);
	printf("  file-tier faults          %8.2f GB/s  (%.0f%% of raw; p50 %.0f us, "
	       "p99 %.0f us)\n",
	       file, ratio * 100, fp50, fp99);
	printf("  file-tier, new memory     %8.2f GB/s\n", res->fresh_gbps);
	printf("  host-tier faults          %8.2f GB/s  (p50 %.0f us, p99 %.0f us, %u faults)\n",
	       host, hp50, hp99, res->nhost);
	printf("    handler service time    p50 %.0f us, p99 %.0f us (log2 histogram)\n",
	       (double)mp_pager_stats_quantile(&res->host_st, 0.5) / 1e3,
	       (double)mp_pager_stats_quantile(&res->host_st, 0.99) / 1e3);
	printf("  mmap, cold page cache     %8.2f GB/s\n", mm);
	if (env.shared) {
		json_t *sh = shared_json(res, xb, hp50);

		printf("  shared host tier (pagerd, UFFDIO_CONTINUE, %s pages, shmem THP %s):\n"
		       "    host faults             %8.2f GB/s  (p50 %.0f us, p99 %.0f us; "
		       "%.2fx the MOVE p50)\n"
		       "    first touch (fill)      %8.2f GB/s  (p50 %.0f us)\n", env.shared_pages,
		       res->shmem_thp,
		       json_real_value(json_object_get(sh, "host_fault_gbps")),
		       json_real_value(json_object_get(sh, "host_fault_p50_us")),
		       json_real_value(json_object_get(sh, "host_fault_p99_us")),
		       json_real_value(json_object_get(sh, "continue_to_move_p50")),
		       json_real_value(json_object_get(sh, "file_fault_gbps")),
		       json_real_value(json_object_get(sh, "file_fault_p50_us")));
		json_decref(sh);
	}
	return 0;
}

int cmd_faultbench(int argc, char **argv)
{
	static const struct argp argp = { opts, parse_arg, NULL, doc, NULL, NULL, NULL };
	struct results res;
	struct mp_store *s;
	uint32_t total;
	int err;

	memset(&env, 0, sizeof(env));
	env.experts = 16;
	env.repeat = 3;
	env.io_depth = 32;
	env.io_bytes = 512u << 10;
	env.fill_threads = 2;
	env.shared_pages = "small";
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	err = mp_store_open(env.path, &s);
	if (err) {
		cli_fail(err, "%s", env.path);
		return err;
	}
	total = mp_store_geometry(s)->layers * mp_store_geometry(s)->experts;
	if (env.experts * (NSETS + 1) > total) {
		err = cli_error(-EINVAL, "%u experts per set need %u distinct experts; "
				"the model has %u (use --experts %u)", env.experts,
				env.experts * (NSETS + 1), total, total / (NSETS + 1));
		goto close_store;
	}
	memset(&res, 0, sizeof(res));
	res.raw = calloc(env.repeat, sizeof(double));
	res.file = calloc(env.repeat, sizeof(double));
	res.mmap = calloc(env.repeat, sizeof(double));
	res.ratio = calloc(env.repeat, sizeof(double));
	res.file_lat = calloc((size_t)env.repeat * env.experts, sizeof(double));
	res.host_lat = calloc((size_t)env.repeat * env.experts * HOST_ROUNDS, sizeof(double));
	if (!res.raw || !res.file || !res.mmap || !res.ratio || !res.file_lat || !res.host_lat) {
		err = -ENOMEM;
		goto free_res;
	}
	res.sh_fill_lat = calloc(env.experts, sizeof(double));
	res.sh_host_lat = calloc((size_t)env.repeat * env.experts * HOST_ROUNDS, sizeof(double));
	if (!res.sh_fill_lat || !res.sh_host_lat) {
		err = -ENOMEM;
		goto free_res;
	}
	err = bench(s, &res);
	if (!err && env.shared)
		err = shared_bench(s, &res);
	if (!err)
		err = report(s, &res);
free_res:
	free(res.raw);
	free(res.file);
	free(res.mmap);
	free(res.ratio);
	free(res.file_lat);
	free(res.host_lat);
	free(res.sh_fill_lat);
	free(res.sh_host_lat);
close_store:
	mp_store_close(s);
	return err;
}

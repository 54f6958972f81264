// SPDX-License-Identifier: MIT
/*
 * Description: a GGUF file's image behind a userfaultfd range, experts
 * paged under a budget (docs/preload.md).
 *
 * The range is anonymous memory of the file's size. Every page that holds
 * a byte outside the expert slices (headers, attention, norms, padding) is
 * "fixed": copied in from the file at open and never evicted. Every other
 * page holds slices of one or more experts (a page at a slice boundary is
 * shared by two neighbours) and counts the resident experts that cover it:
 * it is filled (UFFDIO_COPY of the file's bytes) when the first of them is
 * read in and zapped (MADV_DONTNEED) when the last one leaves, so the
 * budget charges a shared page once. A fault reads the touched expert
 * (UFFD_FEATURE_EXACT_ADDRESS tells which of two sharing a page); the
 * bytes are always the file's, so a thread that races an eviction refaults
 * and reads them again.
 *
 * Fills run under one lock, on the handler thread (demand), the prefetch
 * thread (read-ahead learnt from fault order) or a mp_image_fetch() caller.
 * Keys are layer * experts + expert, as the eviction policies expect.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/base.h"
#include "base/probes.h"
#include "evict/evict.h"
#include "store/gguf.h"
#include "uffd/compat.h"

#include "pager/image_priv.h"
#include <moepager/pager.h>

#define PG		((uint64_t)4096)
#define PAGE_FIXED	UINT32_MAX		/* non-expert bytes: filled at open */
#define PAGE_GONE	(UINT32_MAX - 1)	/* unmapped by the application */
#define PREFETCH_QUEUE	64u
#define FILL_CHUNK	(8ull << 20)		/* fixed pages are copied in this much at a time */

struct extent {
	uint64_t off, len;
	uint32_t key;
};

struct page_run {
	uint64_t first, end;			/* page indices, end exclusive */
};

struct mp_image {
	char *path;
	struct gguf_file *g;
	uint64_t size, npages;
	char *base;
	int uffd, stop_fd;
	int direct_fd;				/* the file with O_DIRECT, or -1 */
	uint64_t features;
	uint32_t layers, experts, nkeys;
	struct extent *ext;			/* 3 per key, by key */
	struct extent *sorted;			/* the same, by offset */
	uint32_t *pages;			/* per page: resident covering experts, or PAGE_* */
	uint8_t *resident;			/* per key */
	char *buf;				/* a fill's read buffer */
	uint64_t buf_bytes;
	struct mp_evict pol;
	struct mp_image_stats st;
	pthread_mutex_t lock;
	pthread_t handler;
	bool handler_on;
	/* read-ahead learnt from fault order */
	uint32_t prefetch;
	uint32_t *succ;				/* [layer][from][to] counts, layer < layers - 1 */
	uint16_t *cur;				/* [layer][i]: the experts of its current set */
	uint32_t *cur_n;			/* per layer: experts in the current set */
	uint32_t last_layer;			/* the layer of the last use */
	uint32_t route_token;			/* routes of layer 0 seen: the moepager:route token */
	uint32_t queue[PREFETCH_QUEUE], q_head, q_len;
	pthread_cond_t q_cond;
	pthread_t prefetcher;
	bool prefetcher_on, stopping;
};

/*
 * Layout
 */

static const char *const PROJ[3] = { "gate", "up", "down" };

/* Finds layer L's three expert tensors: 1 when all are there, 0 when none, or -errno. */
static int layer_tensors(struct mp_image *img, uint32_t L, const struct gguf_tensor **t)
{
	char name[GGUF_NAME_MAX];
	int found = 0;

	for (int i = 0; i < 3; i++) {
		snprintf(name, sizeof(name), "blk.%" PRIu32 ".ffn_%s_exps.weight", L, PROJ[i]);
		t[i] = gguf_find_tensor(img->g, name);
		found += t[i] != NULL;
	}
	if (found == 0 || found == 3)
		return found / 3;
	for (int i = 0; i < 3; i++)
		if (!t[i])
			return mp_err(-EINVAL, "image %s: layer %" PRIu32 " has expert tensors "
				      "but no 'blk.%" PRIu32 ".ffn_%s_exps.weight'", img->path,
				      L, L, PROJ[i]);
	return -EINVAL;
}

/* Checks one expert tensor: 3 dimensions, the expert count, whole slices. */
static int check_tensor(struct mp_image *img, const struct gguf_tensor *t)
{
	if (t->n_dims != 3 || t->ne[2] == 0 || t->ne[2] > UINT16_MAX)
		return mp_err(-EINVAL, "image %s: tensor '%s' (info at offset %" PRIu64 "): %" PRIu32
			      " dimensions, %" PRIu64 " experts; an expert tensor has 3, the "
			      "last the experts", img->path, t->name, t->info_off, t->n_dims,
			      t->ne[2]);
	if (img->experts && t->ne[2] != img->experts)
		return mp_err(-EINVAL, "image %s: tensor '%s' (info at offset %" PRIu64 ") has "
			      "%" PRIu64 " experts, the first expert tensor %" PRIu32, img->path,
			      t->name, t->info_off, t->ne[2], img->experts);
	if (t->bytes % t->ne[2])
		return mp_err(-EINVAL, "image %s: tensor '%s' (info at offset %" PRIu64 "): %"
			      PRIu64 " bytes do not split into %" PRIu64 " experts", img->path,
			      t->name, t->info_off, t->bytes, t->ne[2]);
	img->experts = (uint32_t)t->ne[2];
	return 0;
}

static int count_layers(struct mp_image *img)
{
	const struct gguf_tensor *t[3];
	int err;

	for (uint32_t L = 0;; L++) {
		err = layer_tensors(img, L, t);
		if (err < 0)
			return err;
		if (err == 0)
			break;
		for (int i = 0; i < 3; i++)
			if ((err = check_tensor(img, t[i])))
				return err;
		img->layers = L + 1;
	}
	if (!img->layers)
		return mp_err(-EINVAL, "image %s: no expert tensors (no "
			      "'blk.0.ffn_gate_exps.weight'): not a MoE model", img->path);
	return 0;
}

static int cmp_extent(const void *a, const void *b)
{
	const struct extent *x = a, *y = b;

	return x->off < y->off ? -1 : x->off > y->off;
}

/* Every expert's three slices, by key and by offset. */
static int build_extents(struct mp_image *img)
{
	const struct gguf_tensor *t[3];

	img->nkeys = img->layers * img->experts;
	img->ext = calloc(3ull * img->nkeys, sizeof(*img->ext));
	img->sorted = calloc(3ull * img->nkeys, sizeof(*img->sorted));
	if (!img->ext || !img->sorted)
		return -ENOMEM;
	for (uint32_t L = 0; L < img->layers; L++) {
		layer_tensors(img, L, t);
		for (uint32_t e = 0; e < img->experts; e++)
			for (int i = 0; i < 3; i++) {
				uint64_t slice = t[i]->bytes / img->experts;
				uint32_t key = L * img->experts + e;

				img->ext[3 * key + i] = (struct extent){
					.off = t[i]->off + e * slice, .len = slice, .key = key };
			}
	}
	memcpy(img->sorted, img->ext, 3ull * img->nkeys * sizeof(*img->ext));
	qsort(img->sorted, 3ull * img->nkeys, sizeof(*img->sorted), cmp_extent);
	return 0;
}

static uint64_t page_len(const struct mp_image *img, uint64_t p)
{
	return MP_MIN(PG, img->size - p * PG);
}

/* A page is an expert page when expert slices cover every file byte in it. */
static int classify_pages(struct mp_image *img)
{
	img->pages = calloc(img->npages, sizeof(*img->pages));
	if (!img->pages)
		return -ENOMEM;
	for (uint64_t i = 0; i < 3ull * img->nkeys; i++) {
		uint64_t a = img->ext[i].off, b = a + img->ext[i].len;

		for (uint64_t p = a / PG; p * PG < b; p++)
			img->pages[p] += (uint32_t)(MP_MIN(b, (p + 1) * PG) - MP_MAX(a, p * PG));
	}
	for (uint64_t p = 0; p < img->npages; p++) {
		bool expert = img->pages[p] == page_len(img, p);

		img->pages[p] = expert ? 0 : PAGE_FIXED;
		if (expert)
			img->st.expert_bytes += PG;
		else
			img->st.fixed_bytes += PG;
	}
	return 0;
}

/* The pages of a key's slices, merged: returns the number of runs (1 to 3). */
static int key_runs(const struct mp_image *img, uint32_t key, struct page_run *r)
{
	struct extent e[3];
	int n = 0;

	memcpy(e, &img->ext[3 * key], sizeof(e));
	qsort(e, 3, sizeof(e[0]), cmp_extent);
	for (int i = 0; i < 3; i++) {
		uint64_t first = e[i].off / PG, end = (e[i].off + e[i].len + PG - 1) / PG;

		if (n && first <= r[n - 1].end)
			r[n - 1].end = MP_MAX(r[n - 1].end, end);
		else
			r[n++] = (struct page_run){ first, end };
	}
	return n;
}

/* Expert pages of key not in memory now (with_resident: all its expert pages). */
static uint64_t key_pages(const struct mp_image *img, uint32_t key, bool with_resident)
{
	struct page_run r[3];
	int n = key_runs(img, key, r);
	uint64_t count = 0;

	for (int i = 0; i < n; i++)
		for (uint64_t p = r[i].first; p < r[i].end; p++)
			count += img->pages[p] < PAGE_GONE && (with_resident || !img->pages[p]);
	return count;
}

static int build_layout(struct mp_image *img)
{
	uint64_t most = 0;
	int err;

	if ((err = count_layers(img)) || (err = build_extents(img)) ||
	    (err = classify_pages(img)))
		return err;
	for (uint32_t k = 0; k < img->nkeys; k++) {
		struct page_run r[3];
		int n = key_runs(img, k, r);

		img->st.expert_max_bytes = MP_MAX(img->st.expert_max_bytes,
						  key_pages(img, k, true) * PG);
		for (int i = 0; i < n; i++)
			most = MP_MAX(most, r[i].end - r[i].first);
	}
	img->buf_bytes = MP_MAX(most * PG, FILL_CHUNK);
	img->buf = aligned_alloc(PG, img->buf_bytes);
	return img->buf ? 0 : -ENOMEM;
}

/*
 * Pages in and out
 */

/* UFFDIO_COPY of n pages from src; a page already there is skipped. */
static int copy_pages(struct mp_image *img, uint64_t page, uint64_t n, const char *src)
{
	uint64_t done = 0, len = n * PG;
	int tries = 0;

	while (done < len) {
		struct uffdio_copy c = {
			.dst = (uintptr_t)(img->base + page * PG + done),
			.src = (uintptr_t)(src + done), .len = len - done,
		};

		if (!ioctl(img->uffd, UFFDIO_COPY, &c))
			return 0;
		if (c.copy > 0)
			done += (uint64_t)c.copy;
		else if (errno == EEXIST)
			done += PG;
		else if (errno == EAGAIN && ++tries < 1000)
			continue;
		else
			return mp_err(-errno, "image %s: UFFDIO_COPY at file offset %" PRIu64
				      ": %s", img->path, page * PG + done, strerror(errno));
	}
	return 0;
}

/*
 * Reads pages [page, page + n) from the file (zeros past its end) and copies
 * them in. Whole pages with O_DIRECT when the file system allows it: the
 * page cache would hold a second copy of every expert read, charged to the
 * same memory as the budget.
 */
static int fill_pages(struct mp_image *img, uint64_t page, uint64_t n)
{
	uint64_t off = page * PG, len = MP_MIN(n * PG, img->size - off);
	int fd = img->direct_fd >= 0 ? img->direct_fd : img->g->fd;
	uint64_t ask = img->direct_fd >= 0 ? n * PG : len;
	ssize_t got;

	for (uint64_t done = 0; done < len; done += (uint64_t)got) {
		got = pread(fd, img->buf + done, ask - done, (off_t)(off + done));
		if (got <= 0)
			return mp_err(got ? -errno : -ENODATA, "image %s: reading %" PRIu64
				      " bytes at offset %" PRIu64 ": %s", img->path, len - done,
				      off + done, got ? strerror(errno) : "end of file");
	}
	memset(img->buf + len, 0, n * PG - len);
	img->st.bytes_read += len;
	return copy_pages(img, page, n, img->buf);
}

/* Fills the run's expert pages no resident expert holds, in contiguous stretches. */
static int fill_run(struct mp_image *img, const struct page_run *r)
{
	uint64_t p = r->first;

	while (p < r->end) {
		uint64_t q;
		int err;

		if (img->pages[p]) {
			p++;
			continue;
		}
		for (q = p; q < r->end && !img->pages[q]; q++)
			;
		if ((err = fill_pages(img, p, q - p)))
			return err;
		p = q;
	}
	return 0;
}

/* Releases pages [p, q) that no resident expert holds any more. */
static void zap(struct mp_image *img, uint64_t p, uint64_t q)
{
	if (p < q && madvise(img->base + p * PG, (q - p) * PG, MADV_DONTNEED))
		mp_warn("image %s: MADV_DONTNEED at offset %" PRIu64 ": %s", img->path, p * PG,
			strerror(errno));
}

static void evict_key(struct mp_image *img, uint32_t key)
{
	struct page_run r[3];
	int n = key_runs(img, key, r);

	for (int i = 0; i < n; i++) {
		uint64_t start = r[i].first;

		for (uint64_t p = r[i].first; p < r[i].end; p++) {
			bool drop = img->pages[p] < PAGE_GONE && --img->pages[p] == 0;

			if (drop)
				img->st.resident_bytes -= PG;
			else {
				zap(img, start, p);
				start = p + 1;
			}
		}
		zap(img, start, r[i].end);
	}
	img->resident[key] = 0;
	img->st.evictions++;
	MP_PROBE(evict, key / img->experts, key % img->experts, key_pages(img, key, true) * PG);
	if (img->pol.ops->on_remove)
		img->pol.ops->on_remove(&img->pol, key);
}

struct victim_arg {
	struct mp_image *img;
	uint32_t incoming;
	bool prefetch;			/* a read-ahead: spares the experts in use one layer before */
};

static bool evictable(void *arg, uint32_t key)
{
	const struct victim_arg *v = arg;
	uint32_t E = v->img->experts;

	if (!v->img->resident[key] || key == v->incoming)
		return false;
	if (!v->prefetch || key / E + 1 != v->incoming / E)
		return true;
	for (uint32_t i = 0; i < v->img->cur_n[key / E]; i++)
		if (v->img->cur[(uint64_t)(key / E) * E + i] == key % E)
			return false;
	return true;
}

/* Evicts until key's missing pages fit the budget; -ENOSPC when a read-ahead may not. */
static int make_room(struct mp_image *img, uint32_t key, bool prefetch)
{
	struct victim_arg v = { img, key, prefetch };

	while (img->st.resident_bytes + key_pages(img, key, false) * PG > img->st.budget_bytes) {
		int64_t victim = img->pol.ops->pick_victim(&img->pol, evictable, &v);

		if (victim < 0)
			return prefetch ? -ENOSPC : 0;
		evict_key(img, (uint32_t)victim);
	}
	return 0;
}

/* Reads key in (lock held). Returns 0, -ENOSPC (a read-ahead without room) or -errno. */
static int make_resident(struct mp_image *img, uint32_t key, bool prefetch)
{
	struct page_run r[3];
	int n, err;

	if (img->resident[key]) {
		if (img->pol.ops->on_access)
			img->pol.ops->on_access(&img->pol, key);
		return 0;
	}
	if ((err = make_room(img, key, prefetch)))
		return err;
	n = key_runs(img, key, r);
	for (int i = 0; i < n; i++)
		if ((err = fill_run(img, &r[i])))
			goto unfill;
	for (int i = 0; i < n; i++)
		for (uint64_t p = r[i].first; p < r[i].end; p++)
			if (img->pages[p] < PAGE_GONE && img->pages[p]++ == 0)
				img->st.resident_bytes += PG;
	img->resident[key] = 1;
	img->st.fills++;
	img->st.prefetches += prefetch;
	img->st.resident_peak = MP_MAX(img->st.resident_peak, img->st.resident_bytes);
	if (img->pol.ops->on_insert)
		img->pol.ops->on_insert(&img->pol, key);
	return 0;
unfill:
	/* what was copied in holds no resident expert's bytes: give it back */
	for (int i = 0; i < n; i++)
		for (uint64_t p = r[i].first; p < r[i].end; p++)
			if (!img->pages[p])
				zap(img, p, p + 1);
	return mp_err(err, "image %s: expert %" PRIu32 " of layer %" PRIu32 " not read",
		      img->path, key % img->experts, key / img->experts);
}

/*
 * Faults and read-ahead
 */

/* The key whose slice holds file offset off (an expert page's byte: there is one). */
static uint32_t key_at(const struct mp_image *img, uint64_t off)
{
	uint64_t lo = 0, hi = 3ull * img->nkeys;

	while (hi - lo > 1) {
		uint64_t mid = (lo + hi) / 2;

		if (img->sorted[mid].off <= off)
			lo = mid;
		else
			hi = mid;
	}
	return img->sorted[lo].key;
}

/* Queues the `prefetch` experts of layer L+1 that most often followed layer L's current set. */
static void predict(struct mp_image *img, uint32_t L)
{
	uint32_t E = img->experts, n = img->cur_n[L];
	const uint16_t *set = &img->cur[(uint64_t)L * E];

	for (uint32_t k = 0; k < img->prefetch && img->q_len < PREFETCH_QUEUE; k++) {
		uint64_t best_score = 0;
		uint32_t best = UINT32_MAX;

		for (uint32_t j = 0; j < E; j++) {
			uint32_t key = (L + 1) * E + j;
			bool taken = img->resident[key];
			uint64_t score = 0;

			for (uint32_t q = 0; q < img->q_len && !taken; q++)
				taken = img->queue[(img->q_head + q) % PREFETCH_QUEUE] == key;
			for (uint32_t i = 0; i < n && !taken; i++)
				score += img->succ[((uint64_t)L * E + set[i]) * E + j];
			if (!taken && score > best_score) {
				best_score = score;
				best = j;
			}
		}
		if (best == UINT32_MAX)
			break;
		img->queue[(img->q_head + img->q_len++) % PREFETCH_QUEUE] = (L + 1) * E + best;
	}
	if (img->q_len)
		pthread_cond_signal(&img->q_cond);
}

/*
 * Expert e of layer L was used (faulted on, or routed to): it joins layer
 * L's current set (a new set starts, and stale read-aheads are dropped,
 * when the previous use was of another layer), counts as following each
 * expert of layer L-1's set, and layer L+1's likely experts are queued.
 */
static void learn(struct mp_image *img, uint32_t key)
{
	uint32_t E = img->experts, L = key / E, e = key % E;
	uint16_t *set = &img->cur[(uint64_t)L * E];

	if (img->last_layer != L) {
		/* a new layer's use: what is still queued was for this layer or one before */
		img->cur_n[L] = 0;
		img->q_len = 0;
	}
	img->last_layer = L;
	for (uint32_t i = 0; i < img->cur_n[L]; i++)
		if (set[i] == e)
			return;
	set[img->cur_n[L]++] = (uint16_t)e;
	for (uint32_t i = 0; L > 0 && i < img->cur_n[L - 1]; i++)
		img->succ[((uint64_t)(L - 1) * E + img->cur[(uint64_t)(L - 1) * E + i]) * E + e]++;
	if (L + 1 < img->layers)
		predict(img, L);
}

static void wake_page(struct mp_image *img, uint64_t page)
{
	struct uffdio_range r = { .start = (uintptr_t)(img->base + page * PG), .len = PG };

	if (ioctl(img->uffd, UFFDIO_WAKE, &r))
		mp_warn("image %s: UFFDIO_WAKE at offset %" PRIu64 ": %s", img->path, page * PG,
			strerror(errno));
}

/* A fault that cannot be served: SIGBUS for the thread rather than a hang. */
static void poison_page(struct mp_image *img, uint64_t page)
{
	struct uffdio_poison p = {
		.range = { .start = (uintptr_t)(img->base + page * PG), .len = PG } };

	if ((img->features & UFFD_FEATURE_POISON) && !ioctl(img->uffd, UFFDIO_POISON, &p))
		return;
	mp_warn("image %s: cannot poison offset %" PRIu64 ": a thread stays blocked there",
		img->path, page * PG);
}

static void serve_fault(struct mp_image *img, uint64_t addr)
{
	uint64_t off = addr - (uintptr_t)img->base, page = off / PG;
	int err = 0;

	if (off >= img->npages * PG)
		return;
	pthread_mutex_lock(&img->lock);
	img->st.faults++;
	if (img->pages[page] == PAGE_FIXED) {
		err = fill_pages(img, page, 1);		/* zapped behind our back */
	} else if (img->pages[page] != PAGE_GONE) {
		uint32_t key = key_at(img, MP_MIN(off, img->size - 1));
		uint64_t t0 = mp_now_ns();

		if (img->pol.ops->on_fault)
			img->pol.ops->on_fault(&img->pol, key);
		MP_PROBE(fault_begin, key / img->experts, key % img->experts, 1, addr);
		if (img->resident[key])		/* the page was zapped behind our back */
			err = fill_pages(img, page, 1);
		else
			err = make_resident(img, key, false);
		MP_PROBE(fault_done, key / img->experts, key % img->experts, 1,
			 mp_now_ns() - t0, err);
		if (!err && img->prefetch)
			learn(img, key);
	}
	pthread_mutex_unlock(&img->lock);
	if (err)
		poison_page(img, page);
	else
		wake_page(img, page);
}

static void *handler_main(void *arg)
{
	struct mp_image *img = arg;
	struct pollfd pfd[2] = { { .fd = img->uffd, .events = POLLIN },
				 { .fd = img->stop_fd, .events = POLLIN } };
	struct uffd_msg msg[16];

	for (;;) {
		ssize_t n;

		if (poll(pfd, 2, -1) < 0 && errno != EINTR)
			break;
		if (pfd[1].revents)
			break;
		n = read(img->uffd, msg, sizeof(msg));
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n <= 0) {
			mp_err(-errno, "image %s: reading faults: %s", img->path, strerror(errno));
			break;
		}
		for (size_t i = 0; i < (size_t)n / sizeof(msg[0]); i++)
			if (msg[i].event == UFFD_EVENT_PAGEFAULT)
				serve_fault(img, msg[i].arg.pagefault.address);
	}
	return NULL;
}

static void *prefetch_main(void *arg)
{
	struct mp_image *img = arg;

	pthread_mutex_lock(&img->lock);
	while (!img->stopping) {
		uint64_t t0 = mp_now_ns();
		uint32_t key;
		int err;

		if (!img->q_len) {
			pthread_cond_wait(&img->q_cond, &img->lock);
			continue;
		}
		key = img->queue[img->q_head];
		img->q_head = (img->q_head + 1) % PREFETCH_QUEUE;
		img->q_len--;
		if (img->resident[key])
			continue;
		MP_PROBE(prefetch_issue, key / img->experts, key % img->experts, 1);
		err = make_resident(img, key, true);
		MP_PROBE(prefetch_done, key / img->experts, key % img->experts, 1,
			 mp_now_ns() - t0, err);
	}
	pthread_mutex_unlock(&img->lock);
	return NULL;
}

int mp_image_route(struct mp_image *img, uint32_t layer, const uint32_t *experts, uint32_t n)
{
	int hits = 0, err = 0;
	bool fetch;

	if (layer >= img->layers)
		return -ERANGE;
	for (uint32_t i = 0; i < n; i++)
		if (experts[i] >= img->experts)
			return -ERANGE;
	/* more than the budget holds at once would evict what the engine reads next */
	fetch = (uint64_t)n * img->st.expert_max_bytes <= img->st.budget_bytes;
	pthread_mutex_lock(&img->lock);
	for (uint32_t i = 0; i < n && !err; i++) {
		uint32_t key = layer * img->experts + experts[i];

		hits += img->resident[key];
		if (fetch)
			err = make_resident(img, key, false);
		else if (img->resident[key] && img->pol.ops->on_access)
			img->pol.ops->on_access(&img->pol, key);
		if (!err && img->prefetch)
			learn(img, key);
	}
	img->st.routes += n;
	img->st.route_hits += (uint64_t)hits;
	/* tokens are counted by routes of layer 0 (a batch is one) */
	img->route_token += layer == 0;
	MP_PROBE(route, 0, img->route_token - 1, layer, n, experts, NULL);
	pthread_mutex_unlock(&img->lock);
	return err ? err : hits;
}

int mp_image_fetch(struct mp_image *img, uint32_t layer, uint32_t expert)
{
	int err;

	if (layer >= img->layers || expert >= img->experts)
		return -ERANGE;
	pthread_mutex_lock(&img->lock);
	err = make_resident(img, layer * img->experts + expert, false);
	pthread_mutex_unlock(&img->lock);
	return err;
}

/*
 * Open and close
 */

/* A userfaultfd: the syscall, /dev/userfaultfd, then user-mode faults only. */
static int open_uffd_fd(void)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	int dev;

	if (fd >= 0 || errno != EPERM)
		return fd >= 0 ? fd : -errno;
	dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
	if (dev >= 0) {
		fd = ioctl(dev, USERFAULTFD_IOC_NEW, O_CLOEXEC | O_NONBLOCK);
		close(dev);
		if (fd >= 0)
			return fd;
	}
	fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
	return fd >= 0 ? fd : -errno;
}

/* Opens the userfaultfd with the exact-address and poison features when the kernel has them. */
static int open_uffd(struct mp_image *img)
{
	struct uffdio_api api = { .api = UFFD_API };
	int fd = open_uffd_fd();

	if (fd < 0)
		return mp_err(fd, "image %s: no userfaultfd (%s; see vm.unprivileged_userfaultfd)",
			      img->path, strerror(-fd));
	if (ioctl(fd, UFFDIO_API, &api)) {	/* features 0: learn what the kernel has */
		close(fd);
		return mp_err(-errno, "image %s: UFFDIO_API: %s", img->path, strerror(errno));
	}
	close(fd);
	img->features = api.features & (UFFD_FEATURE_EXACT_ADDRESS | UFFD_FEATURE_POISON);
	fd = open_uffd_fd();
	api = (struct uffdio_api){ .api = UFFD_API, .features = img->features };
	if (fd < 0 || ioctl(fd, UFFDIO_API, &api)) {
		int err = fd < 0 ? fd : -errno;

		if (fd >= 0)
			close(fd);
		return mp_err(err, "image %s: UFFDIO_API: %s", img->path, strerror(-err));
	}
	img->uffd = fd;
	return 0;
}

static int map_range(struct mp_image *img)
{
	struct uffdio_register reg = { .mode = UFFDIO_REGISTER_MODE_MISSING };
	void *p = mmap(NULL, img->npages * PG, PROT_READ,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (p == MAP_FAILED)
		return mp_err(-errno, "image %s: reserving %" PRIu64 " bytes: %s", img->path,
			      img->npages * PG, strerror(errno));
	img->base = p;
	/* 4 KiB pages: experts fill and leave page by page, shared pages included */
	madvise(p, img->npages * PG, MADV_NOHUGEPAGE);
	reg.range = (struct uffdio_range){ .start = (uintptr_t)p, .len = img->npages * PG };
	if (ioctl(img->uffd, UFFDIO_REGISTER, &reg))
		return mp_err(-errno, "image %s: UFFDIO_REGISTER: %s", img->path, strerror(errno));
	if (!(reg.ioctls & (1ull << _UFFDIO_COPY)))
		return mp_err(-EOPNOTSUPP, "image %s: no UFFDIO_COPY on the range", img->path);
	return 0;
}

/* Copies every fixed page in from the file, in stretches of up to FILL_CHUNK. */
static int fill_fixed(struct mp_image *img)
{
	uint64_t p = 0;

	while (p < img->npages) {
		uint64_t q = p;
		int err;

		if (img->pages[p] != PAGE_FIXED) {
			p++;
			continue;
		}
		while (q < img->npages && img->pages[q] == PAGE_FIXED && (q - p) * PG < FILL_CHUNK)
			q++;
		if ((err = fill_pages(img, p, q - p)))
			return err;
		p = q;
	}
	img->st.bytes_read = 0;			/* counts expert reads only */
	return 0;
}

static int set_budget(struct mp_image *img, const struct mp_image_config *cfg)
{
	const char *env = getenv("MOEPAGER_BUDGET"), *from = "the budget";
	uint64_t b = img->st.expert_bytes;
	int err = 0;

	if (cfg->budget_bytes)
		b = cfg->budget_bytes;
	else if (cfg->budget && *cfg->budget)
		err = mp_budget_parse(cfg->budget, img->st.expert_bytes, &b);
	else if (env && *env && (from = "MOEPAGER_BUDGET"))
		err = mp_budget_parse(env, img->st.expert_bytes, &b);
	if (err)
		return err;
	if (b < img->st.expert_max_bytes)
		return mp_err(-EINVAL, "image %s: %s, %" PRIu64 " bytes, is below one expert (%"
			      PRIu64 " bytes of pages)", img->path, from, b,
			      img->st.expert_max_bytes);
	img->st.budget_bytes = MP_MIN(b, img->st.expert_bytes);
	return 0;
}

static int set_policy(struct mp_image *img, const struct mp_image_config *cfg)
{
	const char *name = cfg->eviction ? cfg->eviction : getenv("MOEPAGER_EVICTION");
	const struct mp_evict_ops *ops = mp_evict_find(name && *name ? name : "lru");
	struct mp_evict_env env = { .nkeys = img->nkeys, .layers = img->layers,
				    .experts = img->experts, .slots_per_layer = img->experts };

	if (!ops)
		return mp_err(-EINVAL, "image %s: eviction policy '%s' unknown (known: %s)",
			      img->path, name, mp_evict_names());
	return mp_evict_init(&img->pol, ops, &env);
}

static int start_threads(struct mp_image *img)
{
	int err;

	img->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (img->stop_fd < 0)
		return -errno;
	if ((err = pthread_create(&img->handler, NULL, handler_main, img)))
		return -err;
	img->handler_on = true;
	if (!img->prefetch)
		return 0;
	img->succ = calloc((uint64_t)img->layers * img->experts * img->experts,
			   sizeof(*img->succ));
	img->cur = calloc((uint64_t)img->layers * img->experts, sizeof(*img->cur));
	img->cur_n = calloc(img->layers, sizeof(*img->cur_n));
	if (!img->succ || !img->cur || !img->cur_n)
		return -ENOMEM;
	img->last_layer = UINT32_MAX;
	if ((err = pthread_create(&img->prefetcher, NULL, prefetch_main, img)))
		return -err;
	img->prefetcher_on = true;
	return 0;
}

/* The file and its layout: everything of an image but memory and threads. */
static int open_layout(struct mp_image *img, const char *path)
{
	int err;

	if ((err = gguf_open(path, &img->g)))
		return err;
	img->size = img->g->size;
	img->npages = (img->size + PG - 1) / PG;
	if ((err = build_layout(img)))
		return err;
	img->st.file_bytes = img->size;
	img->st.layers = img->layers;
	img->st.experts = img->experts;
	return 0;
}

static int image_setup(struct mp_image *img, const struct mp_image_config *cfg)
{
	int err;

	if ((err = open_layout(img, cfg->path)) || (err = set_budget(img, cfg)) ||
	    (err = set_policy(img, cfg)))
		return err;
	img->direct_fd = open(cfg->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
	img->resident = calloc(img->nkeys, 1);
	if (!img->resident)
		return -ENOMEM;
	img->prefetch = MP_MIN(cfg->prefetch, img->experts);
	if ((err = open_uffd(img)) || (err = map_range(img)) || (err = fill_fixed(img)))
		return err;
	return start_threads(img);
}

static struct mp_image *image_new(const char *path)
{
	struct mp_image *img = calloc(1, sizeof(*img));

	if (!img || !(img->path = strdup(path))) {
		free(img);
		return NULL;
	}
	img->uffd = img->stop_fd = img->direct_fd = -1;
	pthread_mutex_init(&img->lock, NULL);
	pthread_cond_init(&img->q_cond, NULL);
	return img;
}

int mp_image_layout(const char *path, struct mp_image_stats *out)
{
	struct mp_image *img = image_new(path);
	int err;

	if (!img)
		return -ENOMEM;
	err = open_layout(img, path);
	*out = img->st;
	mp_image_close(img);
	return err;
}

int mp_image_open(const struct mp_image_config *cfg, struct mp_image **out)
{
	struct mp_image *img;
	int err;

	*out = NULL;
	if (!cfg || !cfg->path)
		return mp_err(-EINVAL, "image: no file");
	if ((err = mp_check_reserved(cfg->reserved, MP_ARRAY_SIZE(cfg->reserved),
				     "image config")))
		return err;
	img = image_new(cfg->path);
	if (!img)
		return mp_err(-ENOMEM, "image %s: out of memory", cfg->path);
	err = image_setup(img, cfg);
	if (err) {
		mp_image_close(img);
		return err == -ENOMEM ? mp_err(err, "image %s: out of memory", cfg->path) : err;
	}
	*out = img;
	return 0;
}

static void stop_threads(struct mp_image *img)
{
	uint64_t one = 1;

	if (img->prefetcher_on) {
		pthread_mutex_lock(&img->lock);
		img->stopping = true;
		pthread_cond_broadcast(&img->q_cond);
		pthread_mutex_unlock(&img->lock);
		pthread_join(img->prefetcher, NULL);
	}
	if (img->handler_on) {
		if (write(img->stop_fd, &one, sizeof(one)) != sizeof(one))
			mp_warn("image %s: stopping the handler: %s", img->path, strerror(errno));
		pthread_join(img->handler, NULL);
	}
}

/* Unmaps the range but what the application unmapped (something else may live there now). */
static void unmap_range(struct mp_image *img)
{
	uint64_t p = 0;

	if (!img->base)
		return;
	if (!img->pages) {
		munmap(img->base, img->npages * PG);
		return;
	}
	while (p < img->npages) {
		uint64_t q = p;

		if (img->pages[p] == PAGE_GONE) {
			p++;
			continue;
		}
		while (q < img->npages && img->pages[q] != PAGE_GONE)
			q++;
		munmap(img->base + p * PG, (q - p) * PG);
		p = q;
	}
}

void mp_image_close(struct mp_image *img)
{
	if (!img)
		return;
	stop_threads(img);
	unmap_range(img);
	if (img->uffd >= 0)
		close(img->uffd);
	if (img->stop_fd >= 0)
		close(img->stop_fd);
	if (img->direct_fd >= 0)
		close(img->direct_fd);
	if (img->pol.ops)
		mp_evict_fini(&img->pol);
	gguf_close(img->g);
	pthread_cond_destroy(&img->q_cond);
	pthread_mutex_destroy(&img->lock);
	free(img->succ);
	free(img->cur);
	free(img->cur_n);
	free(img->buf);
	free(img->resident);
	free(img->pages);
	free(img->ext);
	free(img->sorted);
	free(img->path);
	free(img);
}

const void *mp_image_base(const struct mp_image *img)
{
	return img->base;
}

uint64_t mp_image_bytes(const struct mp_image *img)
{
	return img->npages * PG;
}

uint64_t mp_image_forget(struct mp_image *img, const void *first, uint64_t len)
{
	uint64_t off = (uint64_t)((const char *)first - img->base), left = 0;

	pthread_mutex_lock(&img->lock);
	for (uint64_t p = off / PG; p < img->npages && p * PG < off + len; p++) {
		if (img->pages[p] && img->pages[p] < PAGE_GONE)
			img->st.resident_bytes -= PG;
		img->pages[p] = PAGE_GONE;
	}
	for (uint64_t p = 0; p < img->npages; p++)
		left += img->pages[p] != PAGE_GONE ? PG : 0;
	pthread_mutex_unlock(&img->lock);
	return left;
}

void mp_image_stats(struct mp_image *img, struct mp_image_stats *out)
{
	pthread_mutex_lock(&img->lock);
	img->st.prefetch_pending = img->q_len;
	*out = img->st;
	pthread_mutex_unlock(&img->lock);
}

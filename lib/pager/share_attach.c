// SPDX-License-Identifier: MIT
/*
 * The engine side of the shared host tier: attach to a pager daemon, map its
 * memfd over a reserved range, register the range MISSING + MINOR and hand
 * the userfaultfd to the daemon, which serves every fault. A watcher thread
 * notices the daemon's death; it then serves the userfaultfd itself, with
 * poison, so every thread waiting or faulting later gets SIGBUS and its
 * guard an error (-ENOTCONN), never a hang. The dense weights are the
 * daemon's sealed memfd mapped read-only: no fault of theirs reaches the
 * daemon, so its death leaves them readable.
 */
#include <fcntl.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <linux/userfaultfd.h>

#include <moepager/pager.h>
#include <moepager/share.h>

#include "base/base.h"
#include "pager/share_priv.h"
#include "uffd/shared.h"

#define PAGE		4096ull

struct mp_attach {
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct mp_store *store;
	uint32_t layers, experts;
	uint64_t slot_bytes, data_bytes, bytes, page;
	char *base;
	char *dense;			/* the dense weights, read-only (NULL: none) */
	uint64_t dense_bytes;
	uint64_t *dense_off;		/* per tensor of the store: its offset in dense */
	int sock, uffd, stop_fd;
	pthread_t watcher;
	bool watching;
	atomic_bool gone;		/* the daemon hung up */
	pthread_mutex_t req_lock;	/* one request on the socket at a time */
};

/* Sends buf (with fd when >= 0) and receives one reply of want bytes (and an fd, if any). */
static int exchange(int sock, const void *buf, size_t len, int fd, void *rep, size_t want,
		    int *rfd)
{
	int got = -1, err = mp_share_send(sock, buf, len, fd);
	ssize_t n = err ? err : mp_share_recv(sock, rep, want, &got);

	if (rfd)
		*rfd = got;
	else if (got >= 0)
		close(got);
	if (n < 0)
		return (int)n;
	return *(const uint64_t *)rep == MP_SHARE_MAGIC ? 0 : -EPROTO;
}

/*
 * The daemon's death
 */

/* After the daemon: every fault gets poison (SIGBUS), until close. */
static void serve_orphaned(struct mp_attach *a)
{
	struct pollfd pfd[2] = { { .fd = a->stop_fd, .events = POLLIN },
				 { .fd = a->uffd, .events = POLLIN } };
	struct uffd_msg msg[16];

	/* Threads the daemon read a message of but never answered refault into our hands. */
	mp_uffd_wake_fd(a->uffd, (uint64_t)(uintptr_t)a->base, a->bytes);
	while (poll(pfd, 2, -1) >= 0 || errno == EINTR) {
		ssize_t n;

		if (pfd[0].revents)
			return;
		if (!(pfd[1].revents & POLLIN))
			continue;
		n = read(a->uffd, msg, sizeof(msg));
		for (ssize_t i = 0; i < n / (ssize_t)sizeof(msg[0]); i++)
			if (msg[i].event == UFFD_EVENT_PAGEFAULT)
				mp_uffd_poison_fd(a->uffd, msg[i].arg.pagefault.address &
						  ~(a->page - 1), a->page, a->page);
	}
}

static void *watch(void *arg)
{
	struct mp_attach *a = arg;
	struct pollfd pfd[2] = { { .fd = a->stop_fd, .events = POLLIN },
				 { .fd = a->sock, .events = POLLRDHUP } };

	pthread_setname_np(pthread_self(), "mp-attach");
	while (poll(pfd, 2, -1) < 0 && errno == EINTR)
		;
	if (pfd[0].revents)
		return NULL;
	atomic_store(&a->gone, true);
	mp_warn("attach %s: the pager daemon hung up; every expert not in memory now fails "
		"with -ENOTCONN", a->path);
	serve_orphaned(a);
	return NULL;
}

/* The guard's verdict on a SIGBUS in the range (share_priv.h). */
static int attach_cause(void *ctx, void *addr)
{
	struct mp_attach *a = ctx;
	uint64_t off = (uint64_t)((char *)addr - a->base);
	uint32_t s = (uint32_t)(off / a->slot_bytes);
	uint32_t layer = s / a->experts, expert = s % a->experts;

	if (atomic_load(&a->gone))
		return mp_err(-ENOTCONN, "attach %s: the pager daemon is gone: layer %u expert %u "
			      "cannot be faulted in", a->path, layer, expert);
	if (off % a->slot_bytes >= a->data_bytes)
		return mp_err(-EFAULT, "attach %s: access at byte %llu of layer %u expert %u, "
			      "past its %llu bytes", a->path,
			      (unsigned long long)(off % a->slot_bytes), layer, expert,
			      (unsigned long long)a->data_bytes);
	/* Drops the poison marker: the next access asks the daemon again. */
	madvise(a->base + s * a->slot_bytes, a->data_bytes, MADV_DONTNEED);
	return mp_err(-EIO, "attach %s: the pager daemon could not read layer %u expert %u (its "
		      "log says why)", a->path, layer, expert);
}

/*
 * Attaching
 */

static int attach_connect(struct mp_attach *a, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	if (strlen(path) >= sizeof(sa.sun_path))
		return mp_err(-ENAMETOOLONG, "attach: socket path %s longer than %zu bytes", path,
			      sizeof(sa.sun_path) - 1);
	strcpy(sa.sun_path, path);
	strcpy(a->path, path);
	a->sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (a->sock < 0)
		return mp_err(-errno, "attach: socket: %s", strerror(errno));
	if (connect(a->sock, (struct sockaddr *)&sa, sizeof(sa)))
		return mp_err(-errno, "attach %s: no pager daemon there: %s", path,
			      strerror(errno));
	return 0;
}

/* HELLO: the daemon checks version and model, and answers with the memfd and its layout. */
static int attach_hello(struct mp_attach *a, int *memfd)
{
	const struct mp_geometry *g = mp_store_geometry(a->store);
	struct mp_share_hello h = {
		.magic = MP_SHARE_MAGIC, .op = MP_SHARE_HELLO, .proto = MP_SHARE_PROTO,
		.version_major = (uint32_t)mp_version_major(),
		.version_minor = (uint32_t)mp_version_minor(),
		.identity = mp_store_identity(a->store),
		.expert_bytes = mp_store_expert_bytes(a->store),
	};
	struct mp_share_reply rep;
	int err = exchange(a->sock, &h, sizeof(h), -1, &rep, sizeof(rep), memfd);

	if (err)
		return mp_err(err, "attach %s: handshake: %s", a->path, strerror(-err));
	rep.message[sizeof(rep.message) - 1] = 0;
	if (rep.status)
		return mp_err(rep.status, "attach %s: refused: %s", a->path, rep.message);
	if (*memfd < 0 || rep.layers != g->layers || rep.experts != g->experts ||
	    rep.memfd_bytes != (uint64_t)rep.nslots * rep.slot_bytes ||
	    rep.nslots != rep.layers * rep.experts || rep.slot_bytes % MP_EXPERT_ALIGN ||
	    rep.data_bytes < h.expert_bytes || rep.data_bytes > rep.slot_bytes ||
	    (rep.page_bytes != PAGE && rep.page_bytes != MP_EXPERT_ALIGN))
		return mp_err(-EPROTO, "attach %s: the daemon's layout (%u x %u experts, stride "
			      "%llu, memfd %s) does not fit the model (%u x %u)", a->path,
			      rep.layers, rep.experts, (unsigned long long)rep.slot_bytes,
			      *memfd < 0 ? "missing" : "passed", g->layers, g->experts);
	a->layers = rep.layers;
	a->experts = rep.experts;
	a->slot_bytes = rep.slot_bytes;
	a->data_bytes = rep.data_bytes;
	a->bytes = rep.memfd_bytes;
	a->page = rep.page_bytes;
	return 0;
}

/* Maps the memfd over a 2 MiB-aligned range and registers it on a new userfaultfd. */
static int attach_map(struct mp_attach *a, int memfd)
{
	uint64_t len = a->bytes + MP_EXPERT_ALIGN;
	char *res, *base;

	res = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (res == MAP_FAILED)
		return mp_err(-errno, "attach %s: reserving %llu bytes: %s", a->path,
			      (unsigned long long)len, strerror(errno));
	base = (char *)MP_ALIGN_UP((uintptr_t)res, MP_EXPERT_ALIGN);
	if (base > res)
		munmap(res, (size_t)(base - res));
	if (base + a->bytes < res + len)
		munmap(base + a->bytes, (size_t)(res + len - (base + a->bytes)));
	a->base = mmap(base, a->bytes, PROT_READ, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, memfd, 0);
	if (a->base == MAP_FAILED) {
		a->base = NULL;
		munmap(base, a->bytes);
		return mp_err(-errno, "attach %s: mapping the daemon's memfd: %s", a->path,
			      strerror(errno));
	}
	a->uffd = mp_uffd_shared_open(a->page > PAGE, "attach");
	if (a->uffd < 0)
		return a->uffd;
	return mp_uffd_shared_register(a->uffd, a->base, a->bytes, "attach");
}

/* The dense weights: the daemon's sealed memfd, laid out as mp_share_dense_layout() says. */
static int attach_dense(struct mp_attach *a)
{
	struct mp_share_hello req = { .magic = MP_SHARE_MAGIC, .op = MP_SHARE_DENSE };
	uint32_t n = mp_store_tensor_count(a->store);
	struct mp_share_reply rep;
	struct stat sb;
	uint64_t want;
	int fd = -1, seals, err;

	a->dense_off = calloc(n ? n : 1, sizeof(*a->dense_off));
	if (!a->dense_off)
		return -ENOMEM;
	want = mp_share_dense_layout(a->store, a->dense_off);
	err = exchange(a->sock, &req, sizeof(req), -1, &rep, sizeof(rep), &fd);
	if (err) {
		err = mp_err(err, "attach %s: asking for the dense weights: %s", a->path,
			     strerror(-err));
		goto out;
	}
	seals = fd < 0 ? -1 : fcntl(fd, F_GET_SEALS);
	if (rep.status || fd < 0 || fstat(fd, &sb) || (uint64_t)sb.st_size != want ||
	    rep.dense_bytes != want || seals < 0 ||
	    (seals & (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)) !=
	    (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW)) {
		err = mp_err(-EPROTO, "attach %s: the daemon's dense weights (%s, %llu bytes, "
			     "seals %#x) are not the %llu sealed bytes this model's take", a->path,
			     fd < 0 ? "no memfd" : "a memfd", (unsigned long long)rep.dense_bytes,
			     seals, (unsigned long long)want);
		goto out;
	}
	a->dense_bytes = want;
	a->dense = want ? mmap(NULL, want, PROT_READ, MAP_SHARED, fd, 0) : NULL;
	if (a->dense == MAP_FAILED) {
		a->dense = NULL;
		err = mp_err(-errno, "attach %s: mapping the dense weights: %s", a->path,
			     strerror(errno));
	}
out:
	if (fd >= 0)
		close(fd);
	return err;
}

int mp_attach_open(struct mp_store *store, const char *socket_path, struct mp_attach **out)
{
	struct mp_share_attach msg = { .magic = MP_SHARE_MAGIC, .op = MP_SHARE_ATTACH };
	struct mp_share_reply rep;
	struct mp_attach *a;
	int memfd = -1, err;

	*out = NULL;
	if (!store || !socket_path)
		return mp_err(-EINVAL, "attach: no store or no socket path");
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->store = store;
	a->sock = a->uffd = -1;
	pthread_mutex_init(&a->req_lock, NULL);
	a->stop_fd = eventfd(0, EFD_CLOEXEC);
	err = a->stop_fd < 0 ? -errno : attach_connect(a, socket_path);
	if (!err)
		err = attach_hello(a, &memfd);
	if (!err)
		err = attach_map(a, memfd);
	if (memfd >= 0)
		close(memfd);
	if (!err)
		err = attach_dense(a);
	if (!err) {
		msg.base = (uint64_t)(uintptr_t)a->base;
		err = exchange(a->sock, &msg, sizeof(msg), a->uffd, &rep, sizeof(rep), NULL);
		if (!err && rep.status)
			err = mp_err(rep.status, "attach %s: refused: %.*s", a->path,
				     (int)sizeof(rep.message), rep.message);
		else if (err)
			mp_err(err, "attach %s: passing the userfaultfd: %s", a->path,
			       strerror(-err));
	}
	if (!err)
		err = mp_guard_register_range(a->base, a->bytes, attach_cause, a);
	if (!err) {
		err = -pthread_create(&a->watcher, NULL, watch, a);
		a->watching = !err;
	}
	if (err) {
		mp_attach_close(a);
		return err;
	}
	*out = a;
	return 0;
}

void mp_attach_close(struct mp_attach *a)
{
	uint64_t one = 1;

	if (!a)
		return;
	if (a->watching) {
		if (write(a->stop_fd, &one, sizeof(one)) < 0)
			mp_warn("attach %s: stopping the watcher: %s", a->path, strerror(errno));
		pthread_join(a->watcher, NULL);
	}
	mp_guard_unregister_range(a);
	if (a->base)
		munmap(a->base, a->bytes);
	if (a->dense)
		munmap(a->dense, a->dense_bytes);
	free(a->dense_off);
	if (a->uffd >= 0)
		close(a->uffd);
	if (a->sock >= 0)
		close(a->sock);
	if (a->stop_fd >= 0)
		close(a->stop_fd);
	pthread_mutex_destroy(&a->req_lock);
	free(a);
}

/*
 * Using it
 */

const void *mp_attach_expert(struct mp_attach *a, uint32_t layer, uint32_t expert)
{
	if (layer >= a->layers || expert >= a->experts) {
		mp_err(-EINVAL, "attach %s: layer %u expert %u out of range (%u x %u)", a->path,
		       layer, expert, a->layers, a->experts);
		return NULL;
	}
	return a->base + ((uint64_t)layer * a->experts + expert) * a->slot_bytes;
}

const void *mp_attach_tensor(struct mp_attach *a, const struct mp_tensor_info *t)
{
	for (uint32_t i = 0; a->dense && t && i < mp_store_tensor_count(a->store); i++)
		if (mp_store_tensor_at(a->store, i) == t)
			return a->dense + a->dense_off[i];
	return NULL;
}

int mp_attach_guard(struct mp_attach *a, int (*fn)(void *arg), void *arg)
{
	(void)a;
	return mp_pager_guard(NULL, fn, arg);
}

/* Reads the first byte of every expert whose page warm() found in the memfd. */
static int touch_present(void *arg)
{
	struct mp_attach *a = ((void **)arg)[0];
	const unsigned char *vec = ((void **)arg)[1];
	volatile const char *p;
	unsigned sum = 0;

	for (uint64_t i = 0; i < (uint64_t)a->layers * a->experts; i++) {
		if (!(vec[i] & 1))
			continue;
		p = a->base + i * a->slot_bytes;
		sum += (unsigned)*p;
	}
	return (int)(sum & 0);
}

int mp_attach_warm(struct mp_attach *a, uint32_t *touched)
{
	uint64_t n = (uint64_t)a->layers * a->experts;
	unsigned char *vec = calloc(n, 1);
	void *arg[2] = { a, vec };
	uint32_t count = 0;
	int err = 0;

	if (!vec)
		return mp_err(-ENOMEM, "attach %s: warming: out of memory", a->path);
	/*
	 * mincore() of a shared mapping asks the memfd's page cache, not the
	 * page tables: it says what the daemon holds without faulting. The
	 * first page stands for the expert (the daemon fills and maps whole
	 * experts, and evicts whole experts). One byte: mincore() counts 4 KiB
	 * pages even in a hugetlb mapping.
	 */
	for (uint64_t i = 0; i < n && !err; i++) {
		if (mincore(a->base + i * a->slot_bytes, PAGE, &vec[i]))
			err = mp_err(-errno, "attach %s: mincore of expert %llu: %s", a->path,
				     (unsigned long long)i, strerror(errno));
		count += vec[i] & 1;
	}
	if (!err)
		err = mp_attach_guard(a, touch_present, arg);
	/* The dense weights' page tables too, in one call instead of a fault per page. */
	if (!err && a->dense && madvise(a->dense, a->dense_bytes, MADV_POPULATE_READ))
		mp_warn("attach %s: mapping the dense weights ahead: %s", a->path, strerror(errno));
	free(vec);
	if (!err && touched)
		*touched = count;
	return err;
}

/* One request to a live daemon and its reply; `what` names it in messages. */
static int request(struct mp_attach *a, const void *req, size_t len, void *rep, size_t want,
		   const char *what)
{
	int err;

	if (atomic_load(&a->gone))
		return mp_err(-ENOTCONN, "attach %s: the pager daemon is gone", a->path);
	pthread_mutex_lock(&a->req_lock);
	err = exchange(a->sock, req, len, -1, rep, want, NULL);
	pthread_mutex_unlock(&a->req_lock);
	if (err)
		return mp_err(err, "attach %s: %s: %s", a->path, what, strerror(-err));
	return 0;
}

int mp_attach_daemon_stats(struct mp_attach *a, struct mp_pagerd_stats *out)
{
	struct mp_share_hello req = { .magic = MP_SHARE_MAGIC, .op = MP_SHARE_STATS };
	struct mp_share_stats rep;
	int err = request(a, &req, sizeof(req), &rep, sizeof(rep),
			  "asking the daemon for its counters");

	if (!err)
		*out = rep.stats;
	return err;
}

/* A request answered by a status and a message (copied to msg when it succeeds). */
static int request_status(struct mp_attach *a, const void *req, size_t len, const char *what,
			  char *msg, size_t msg_len)
{
	struct mp_share_reply rep;
	int err = request(a, req, len, &rep, sizeof(rep), what);

	if (err)
		return err;
	rep.message[sizeof(rep.message) - 1] = 0;
	if (rep.status)
		return mp_err(rep.status, "attach %s: %s", a->path, rep.message);
	if (msg && msg_len)
		snprintf(msg, msg_len, "%s", rep.message);
	return 0;
}

int mp_attach_set_budget(struct mp_attach *a, uint64_t bytes)
{
	struct mp_share_budget req = { .magic = MP_SHARE_MAGIC, .op = MP_SHARE_BUDGET,
				       .bytes = bytes };

	return request_status(a, &req, sizeof(req), "setting the budget", NULL, 0);
}

int mp_attach_set_node(struct mp_attach *a, int node, char *msg, size_t len)
{
	struct mp_share_node req = { .magic = MP_SHARE_MAGIC, .op = MP_SHARE_NODE, .node = node };

	return request_status(a, &req, sizeof(req), "moving the host tier", msg, len);
}

static const void *source_expert(void *ctx, uint32_t layer, uint32_t expert)
{
	return mp_attach_expert(ctx, layer, expert);
}

static int source_guard(void *ctx, int (*fn)(void *arg), void *arg)
{
	return mp_attach_guard(ctx, fn, arg);
}

static const void *source_tensor(void *ctx, const struct mp_tensor_info *t)
{
	return mp_attach_tensor(ctx, t);
}

const struct mp_expert_source_ops *mp_attach_source_ops(void)
{
	static const struct mp_expert_source_ops ops = {
		.expert = source_expert,
		.guard = source_guard,
		.tensor = source_tensor,
	};

	return &ops;
}

// SPDX-License-Identifier: MIT
/*
 * The pager daemon: the host tier in one memfd, shared by every attached
 * engine process. Expert e of layer l lives at stride (l * experts + e) of
 * the memfd; an engine maps the memfd over its range, registers it MISSING +
 * MINOR and hands its userfaultfd here. One thread polls the listening
 * socket, every client's socket and every client's userfaultfd: a fault on a
 * present expert is one UFFDIO_CONTINUE of the whole expert in the client's
 * address space; a fault on a hole reads the expert from the file tier into
 * the daemon's own mapping of the memfd first. Eviction punches the hole,
 * which unmaps the pages from every process at once: the budget is one
 * number across processes. The dense (non-expert) weights are read once, at
 * open, into a second memfd, sealed: engines map it read-only and read
 * them there, with no fault to serve.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include <linux/mempolicy.h>
#include <linux/userfaultfd.h>

#include <moepager/pager.h>
#include <moepager/share.h>

#include "base/base.h"
#include "base/hash.h"
#include "pager/share_priv.h"
#include "tier/io.h"
#include "tier/tier.h"
#include "uffd/shared.h"

#define PAGE		4096ull
#ifndef MFD_HUGE_2MB	/* <linux/memfd.h>, which clashes with <sys/mman.h> */
#define MFD_HUGE_2MB	(21u << 26)
#endif
#define FAULT_BATCH	32

struct client {
	int sock;
	int uffd;		/* -1 until MP_SHARE_ATTACH */
	uint64_t base;
	pid_t pid;
	uint32_t *mapped;	/* per slot: the slot's epoch when CONTINUE mapped it whole */
};

struct mp_pagerd {
	struct mp_store *store;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	uint32_t layers, experts, nslots;
	uint64_t expert_bytes, data_bytes, slot_bytes, memfd_bytes;
	uint64_t page;			/* the memfd's page size */
	uint32_t pages;			/* enum mp_pagerd_pages */
	int memfd;
	char *alias;			/* the daemon's own mapping of the memfd */
	int dense_fd;			/* the dense weights' memfd, sealed */
	char *dense;			/* the daemon's read-only mapping of it */
	uint64_t dense_bytes;
	int listen_fd;
	int stop_fd;			/* eventfd */
	struct mp_tier *tier;
	struct mp_io *io;
	struct mp_hash *hash;

	/* Per slot: present (bytes in the memfd), its epoch (bumped at eviction), last use. */
	bool *present;
	uint32_t *epoch;
	uint64_t *used;
	uint64_t tick;

	struct client *clients;
	uint32_t nclients, max_clients;
	struct pollfd *pfd;

	pthread_mutex_t lock;		/* stats, read from other threads */
	struct mp_pagerd_stats st;
};

/* Bytes of the memfd actually backed, from its block count. */
static uint64_t memfd_backed(const struct mp_pagerd *d)
{
	struct stat sb;

	return fstat(d->memfd, &sb) ? 0 : (uint64_t)sb.st_blocks * 512;
}

void mp_pagerd_stats(struct mp_pagerd *d, struct mp_pagerd_stats *out)
{
	pthread_mutex_lock(&d->lock);
	*out = d->st;
	pthread_mutex_unlock(&d->lock);
	out->memfd_bytes = memfd_backed(d);
	out->dense_bytes = d->dense_bytes;
	memset(out->reserved, 0, sizeof(out->reserved));
}

#define STAT_ADD(d, field, n) do {		\
	pthread_mutex_lock(&(d)->lock);		\
	(d)->st.field += (n);			\
	pthread_mutex_unlock(&(d)->lock);	\
} while (0)

/*
 * Memory: holes and fills
 */

static void slot_punch(struct mp_pagerd *d, uint32_t s)
{
	if (fallocate(d->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
		      (off_t)(s * d->slot_bytes), (off_t)d->data_bytes))
		mp_warn("pagerd: punching slot %u (layer %u expert %u): %s", s, s / d->experts,
			s % d->experts, strerror(errno));
	if (d->present[s]) {
		d->present[s] = false;
		pthread_mutex_lock(&d->lock);
		d->st.resident_bytes -= d->expert_bytes;
		d->st.evictions++;
		pthread_mutex_unlock(&d->lock);
	}
	d->epoch[s]++;
}

/*
 * Evicts least recently used experts (never keep) until `extra` more bytes
 * fit the budget. An expert is charged its bytes, as the pager charges it,
 * not its page-rounded tail: a budget of N experts' bytes holds N experts in
 * any kind of page.
 */
static void make_room(struct mp_pagerd *d, uint32_t keep, uint64_t extra)
{
	while (d->st.resident_bytes + extra > d->st.budget_bytes) {
		uint32_t victim = UINT32_MAX;

		for (uint32_t s = 0; s < d->nslots; s++)
			if (d->present[s] && s != keep &&
			    (victim == UINT32_MAX || d->used[s] < d->used[victim]))
				victim = s;
		if (victim == UINT32_MAX)
			return;
		slot_punch(d, victim);
	}
}

static int fill_ready(void *arg, const void *buf, size_t len)
{
	mp_hash_update(arg, buf, len);
	return 0;
}

/* Reads slot s from the file tier into the memfd and checks its checksum. */
static int slot_fill(struct mp_pagerd *d, uint32_t s)
{
	uint32_t layer = s / d->experts, expert = s % d->experts;
	const struct mp_expert_info *x = mp_store_expert(d->store, layer, expert);
	struct iovec iov = { d->alias + s * d->slot_bytes, d->data_bytes };
	struct mp_tier_read rd = {
		.layer = layer, .expert = expert, .offset = x->offset, .bytes = x->bytes,
		.checksum = x->checksum, .iov = &iov, .iovcnt = 1, .io = d->io,
		.ready = fill_ready, .arg = d->hash,
	};
	uint64_t sum;
	int err;

	make_room(d, s, d->expert_bytes);
	mp_hash_reset(d->hash);
	err = mp_tier_read(d->tier, &rd);
	if (!err) {
		STAT_ADD(d, disk_bytes_read, x->bytes);
		sum = mp_hash_digest(d->hash);
		if (sum != x->checksum)
			err = mp_err(-EBADMSG, "pagerd: layer %u expert %u: checksum mismatch "
				     "reading %s at offset %llu", layer, expert, d->tier->name,
				     (unsigned long long)x->offset);
	}
	if (err) {
		slot_punch(d, s);
		STAT_ADD(d, fill_failures, 1);
		return err;
	}
	d->present[s] = true;
	pthread_mutex_lock(&d->lock);
	d->st.fills++;
	d->st.resident_bytes += d->expert_bytes;
	d->st.resident_peak_bytes = MP_MAX(d->st.resident_peak_bytes, d->st.resident_bytes);
	pthread_mutex_unlock(&d->lock);
	return 0;
}

/*
 * Faults
 */

static void client_drop(struct mp_pagerd *d, uint32_t i, const char *why)
{
	struct client *c = &d->clients[i];

	mp_info("pagerd: client pid %d dropped: %s", (int)c->pid, why);
	close(c->sock);
	if (c->uffd >= 0)
		close(c->uffd);
	free(c->mapped);
	d->clients[i] = d->clients[--d->nclients];
	pthread_mutex_lock(&d->lock);
	d->st.clients = d->nclients;
	d->st.dropped++;
	pthread_mutex_unlock(&d->lock);
}

/* Serves one fault of client c at addr. Returns 0 or -errno when the client is unusable. */
static int serve_fault(struct mp_pagerd *d, struct client *c, uint64_t addr)
{
	uint64_t off = addr - c->base, in, start, done;
	uint32_t s;
	int err;

	STAT_ADD(d, faults, 1);
	if (addr < c->base || off >= d->memfd_bytes)
		return mp_err(-EFAULT, "pagerd: client pid %d faulted at %#llx, outside its range",
			      (int)c->pid, (unsigned long long)addr);
	s = (uint32_t)(off / d->slot_bytes);
	in = off % d->slot_bytes;
	start = c->base + s * d->slot_bytes;
	if (in >= d->data_bytes)	/* padding past the expert: never backed */
		return mp_uffd_poison_fd(c->uffd, addr & ~(d->page - 1), d->page, d->page);
	if (!d->present[s]) {
		err = slot_fill(d, s);
		if (err)	/* the faulting thread gets SIGBUS, its guard an error */
			return mp_uffd_poison_fd(c->uffd, addr & ~(d->page - 1), d->page, d->page);
	}
	d->used[s] = ++d->tick;
	if (c->mapped[s] == d->epoch[s]) {
		/*
		 * Mapped whole since its fill: a stale message (the page is
		 * there: a wake is all it needs), or the client zapped its own
		 * pages (MADV_DONTNEED, reclaim): then map the whole expert again.
		 */
		err = mp_uffd_continue(c->uffd, addr & ~(d->page - 1), d->page, d->page, &done);
		if (err || !done)
			return err;
	}
	err = mp_uffd_continue(c->uffd, start, d->data_bytes, d->page, &done);
	if (err)
		return err;
	c->mapped[s] = d->epoch[s];
	STAT_ADD(d, continues, 1);
	return 0;
}

/* Reads and serves the client's pending fault messages. */
static int client_faults(struct mp_pagerd *d, struct client *c)
{
	struct uffd_msg msg[FAULT_BATCH];
	ssize_t n;
	int err;

	n = read(c->uffd, msg, sizeof(msg));
	if (n < 0)
		return errno == EAGAIN ? 0 : -errno;
	for (ssize_t i = 0; i < n / (ssize_t)sizeof(msg[0]); i++) {
		if (msg[i].event != UFFD_EVENT_PAGEFAULT)
			continue;
		err = serve_fault(d, c, msg[i].arg.pagefault.address);
		if (err)
			return err;
	}
	return 0;
}

/*
 * Handshakes and requests
 */

static int refuse(struct mp_pagerd *d, struct client *c, int status, const char *fmt, ...)
	__mp_printf(4, 5);

static int refuse(struct mp_pagerd *d, struct client *c, int status, const char *fmt, ...)
{
	struct mp_share_reply rep = { .magic = MP_SHARE_MAGIC, .status = status };
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(rep.message, sizeof(rep.message), fmt, ap);
	va_end(ap);
	mp_info("pagerd: refused client pid %d: %s", (int)c->pid, rep.message);
	mp_share_send(c->sock, &rep, sizeof(rep), -1);
	STAT_ADD(d, refused, 1);
	return status;
}

static int on_hello(struct mp_pagerd *d, struct client *c, const struct mp_share_hello *h)
{
	struct mp_share_reply rep = {
		.magic = MP_SHARE_MAGIC, .layers = d->layers, .experts = d->experts,
		.nslots = d->nslots, .slot_bytes = d->slot_bytes, .data_bytes = d->data_bytes,
		.memfd_bytes = d->memfd_bytes, .page_bytes = d->page,
	};
	uint64_t id = mp_store_identity(d->store);

	if (h->proto != MP_SHARE_PROTO || h->version_major != (uint32_t)mp_version_major() ||
	    h->version_minor != (uint32_t)mp_version_minor())
		return refuse(d, c, -EPROTO, "pager daemon %s speaks protocol %u of moepager "
			      "%d.%d; the client is protocol %u of moepager %u.%u", d->path,
			      MP_SHARE_PROTO, mp_version_major(), mp_version_minor(), h->proto,
			      h->version_major, h->version_minor);
	if (h->identity != id || h->expert_bytes != d->expert_bytes)
		return refuse(d, c, -ESTALE, "pager daemon %s serves model %s (identity %016llx); "
			      "the client opened another model (identity %016llx)", d->path,
			      mp_store_name(d->store), (unsigned long long)id,
			      (unsigned long long)h->identity);
	snprintf(rep.message, sizeof(rep.message), "pager daemon %s serving %s", d->path,
		 mp_store_name(d->store));
	return mp_share_send(c->sock, &rep, sizeof(rep), d->memfd);
}

/* The dense weights' memfd: sealed, so what a client maps cannot change under it. */
static int on_dense(struct mp_pagerd *d, struct client *c)
{
	struct mp_share_reply rep = { .magic = MP_SHARE_MAGIC, .dense_bytes = d->dense_bytes };

	return mp_share_send(c->sock, &rep, sizeof(rep), d->dense_fd);
}

/* A new budget for every process: a smaller one evicts down to it before the answer. */
static int on_budget(struct mp_pagerd *d, struct client *c, uint64_t bytes)
{
	struct mp_share_reply rep = { .magic = MP_SHARE_MAGIC };
	uint64_t total = mp_store_total_expert_bytes(d->store);

	if (bytes < d->expert_bytes) {
		rep.status = -EINVAL;
		snprintf(rep.message, sizeof(rep.message), "pager daemon %s: budget %llu bytes is "
			 "below one expert (%llu)", d->path, (unsigned long long)bytes,
			 (unsigned long long)d->expert_bytes);
		return mp_share_send(c->sock, &rep, sizeof(rep), -1);
	}
	pthread_mutex_lock(&d->lock);
	d->st.budget_bytes = MP_ALIGN_UP(MP_MIN(bytes, total), d->page);
	pthread_mutex_unlock(&d->lock);
	make_room(d, UINT32_MAX, 0);
	mp_info("pagerd: budget now %llu bytes (asked by pid %d)",
		(unsigned long long)d->st.budget_bytes, (int)c->pid);
	return mp_share_send(c->sock, &rep, sizeof(rep), -1);
}

static int on_attach(struct mp_pagerd *d, struct client *c, const struct mp_share_attach *a,
		     int fd)
{
	struct mp_share_reply rep = { .magic = MP_SHARE_MAGIC };

	if (fd < 0 || c->uffd >= 0) {
		if (fd >= 0)
			close(fd);
		return refuse(d, c, -EPROTO, "attach: %s", fd < 0 ? "no userfaultfd passed" :
			      "already attached");
	}
	c->uffd = fd;
	c->base = a->base;
	pthread_mutex_lock(&d->lock);
	d->st.clients_total++;
	pthread_mutex_unlock(&d->lock);
	mp_info("pagerd: client pid %d attached at %#llx", (int)c->pid,
		(unsigned long long)c->base);
	return mp_share_send(c->sock, &rep, sizeof(rep), -1);
}

/*
 * NUMA placement: the memfds' pages move to a node in place (mbind() with
 * MPOL_MF_MOVE_ALL over the daemon's mappings): the same pages, every
 * process's mapping of them follows, nothing is copied in user space and
 * no engine remaps; later fills land on the node too (the memfd's policy).
 */
#define NODE_WORD_BITS	(8 * (int)sizeof(unsigned long))
#define NODE_WORDS	(1024 / NODE_WORD_BITS)	/* nodes 0-1023 */
#define NODE_BATCH	1024u

static int bind_to_node(void *addr, uint64_t len, int node, bool *all)
{
	unsigned long mask[NODE_WORDS] = { 0 };
	unsigned long maxnode = NODE_WORDS * NODE_WORD_BITS + 1;

	if (!addr || !len)
		return 0;
	mask[node / NODE_WORD_BITS] = 1ul << (node % NODE_WORD_BITS);
	if (!syscall(SYS_mbind, addr, len, MPOL_BIND, mask, maxnode, MPOL_MF_MOVE_ALL))
		return 0;
	/* Pages mapped by other processes move only with CAP_SYS_NICE. */
	if (errno != EPERM)
		return -errno;
	*all = false;
	return syscall(SYS_mbind, addr, len, MPOL_BIND, mask, maxnode, MPOL_MF_MOVE) ? -errno : 0;
}

/* Counts the pages of pg[0..n) that are on node (move_pages() without nodes: where each is). */
static void count_on_node(void **pg, uint32_t n, int node, uint64_t *on, uint64_t *total)
{
	int st[NODE_BATCH];

	if (!n || syscall(SYS_move_pages, 0, n, pg, NULL, st, 0))
		return;
	for (uint32_t i = 0; i < n; i++) {
		*total += st[i] >= 0;
		*on += st[i] == node;
	}
}

/* Of the present experts' pages, how many are on node (*total: how many are in memory). */
static uint64_t pages_on_node(struct mp_pagerd *d, int node, uint64_t *total)
{
	void *pg[NODE_BATCH];
	uint64_t on = 0;
	uint32_t n = 0;

	*total = 0;
	for (uint32_t s = 0; s < d->nslots; s++)
		for (uint64_t off = 0; d->present[s] && off < d->data_bytes; off += d->page) {
			pg[n++] = d->alias + s * d->slot_bytes + off;
			if (n == NODE_BATCH) {
				count_on_node(pg, n, node, &on, total);
				n = 0;
			}
		}
	count_on_node(pg, n, node, &on, total);
	return on;
}

static int on_node(struct mp_pagerd *d, struct client *c, int node)
{
	struct mp_share_reply rep = { .magic = MP_SHARE_MAGIC };
	char path[64];
	uint64_t on, total;
	bool all = true;
	int err;

	snprintf(path, sizeof(path), "/sys/devices/system/node/node%d", node);
	if (node < 0 || node >= NODE_WORDS * NODE_WORD_BITS || access(path, F_OK)) {
		rep.status = -ENODEV;
		snprintf(rep.message, sizeof(rep.message), "pager daemon %s: NUMA node %d does not "
			 "exist (no %s)", d->path, node, path);
		return mp_share_send(c->sock, &rep, sizeof(rep), -1);
	}
	/* On the daemon's loop: faults wait while the pages move (none fails). */
	err = bind_to_node(d->alias, d->memfd_bytes, node, &all);
	if (!err)
		err = bind_to_node(d->dense, d->dense_bytes, node, &all);
	on = pages_on_node(d, node, &total);
	rep.status = err;
	if (err)
		snprintf(rep.message, sizeof(rep.message), "pager daemon %s: mbind to node %d: %s",
			 d->path, node, strerror(-err));
	else
		snprintf(rep.message, sizeof(rep.message), "host tier on node %d: %llu of %llu "
			 "resident expert pages there%s", node, (unsigned long long)on,
			 (unsigned long long)total, all ? "" : " (pages engines map stay: moving "
			 "them needs CAP_SYS_NICE)");
	mp_info("pagerd: %s (asked by pid %d)", rep.message, (int)c->pid);
	return mp_share_send(c->sock, &rep, sizeof(rep), -1);
}

/* The bytes a request of op carries (the magic and op: those without a body). */
static size_t request_bytes(uint32_t op)
{
	switch (op) {
	case MP_SHARE_HELLO:
		return sizeof(struct mp_share_hello);
	case MP_SHARE_ATTACH:
		return sizeof(struct mp_share_attach);
	case MP_SHARE_BUDGET:
		return sizeof(struct mp_share_budget);
	case MP_SHARE_NODE:
		return sizeof(struct mp_share_node);
	default:
		return offsetof(struct mp_share_hello, proto);
	}
}

/* One message on a client's socket. Returns 0, or -errno to drop the client. */
static int client_request(struct mp_pagerd *d, struct client *c)
{
	union {
		struct mp_share_hello h;
		struct mp_share_attach a;
		struct mp_share_budget b;
		struct mp_share_node nd;
		uint64_t w[8];
	} m = { 0 };
	int fd;
	ssize_t n = mp_share_recv(c->sock, &m, sizeof(m), &fd);

	if (n < 0)
		return (int)n;
	/* Only an attach carries a descriptor (the client's userfaultfd): any other is closed. */
	if (fd >= 0 && (m.h.magic != MP_SHARE_MAGIC || m.h.op != MP_SHARE_ATTACH ||
			(size_t)n < request_bytes(m.h.op))) {
		close(fd);
		fd = -1;
	}
	if (m.h.magic != MP_SHARE_MAGIC)
		return refuse(d, c, -EPROTO, "pager daemon %s: not a moepager client (bad magic)",
			      d->path);
	if ((size_t)n < request_bytes(m.h.op))
		return refuse(d, c, -EPROTO, "pager daemon %s: request %u of %zd bytes is short "
			      "(%zu needed)", d->path, m.h.op, n, request_bytes(m.h.op));
	switch (m.h.op) {
	case MP_SHARE_HELLO:
		return on_hello(d, c, &m.h);
	case MP_SHARE_ATTACH:
		return on_attach(d, c, &m.a, fd);
	case MP_SHARE_BUDGET:
		return on_budget(d, c, m.b.bytes);
	case MP_SHARE_DENSE:
		return on_dense(d, c);
	case MP_SHARE_NODE:
		return on_node(d, c, m.nd.node);
	case MP_SHARE_STATS: {
		struct mp_share_stats rep = { .magic = MP_SHARE_MAGIC };

		mp_pagerd_stats(d, &rep.stats);
		return mp_share_send(c->sock, &rep, sizeof(rep), -1);
	}
	}
	return refuse(d, c, -EPROTO, "pager daemon %s: unknown request %u", d->path, m.h.op);
}

static void on_connect(struct mp_pagerd *d)
{
	struct ucred cred = { 0 };
	socklen_t len = sizeof(cred);
	struct client *c;
	int fd = accept4(d->listen_fd, NULL, NULL, SOCK_CLOEXEC);

	if (fd < 0)
		return;
	getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len);
	if (d->nclients == d->max_clients) {
		struct client tmp = { .sock = fd, .pid = cred.pid, .uffd = -1 };

		refuse(d, &tmp, -EBUSY, "pager daemon %s: %u clients attached already", d->path,
		       d->max_clients);
		close(fd);
		return;
	}
	c = &d->clients[d->nclients];
	*c = (struct client){ .sock = fd, .uffd = -1, .pid = cred.pid,
			      .mapped = malloc(d->nslots * sizeof(uint32_t)) };
	if (!c->mapped) {
		close(fd);
		return;
	}
	/* Epochs start at 1: 0 never matches, so a new client's first fault maps whole. */
	memset(c->mapped, 0, d->nslots * sizeof(uint32_t));
	d->nclients++;
	pthread_mutex_lock(&d->lock);
	d->st.clients = d->nclients;
	pthread_mutex_unlock(&d->lock);
}

/*
 * The loop
 */

void mp_pagerd_stop(struct mp_pagerd *d)
{
	uint64_t one = 1;

	if (write(d->stop_fd, &one, sizeof(one)) < 0)
		return;
}

/* Polls the stop fd, the listening socket, then per client its socket and its userfaultfd. */
static uint32_t build_poll(struct mp_pagerd *d)
{
	uint32_t n = 0;

	d->pfd[n++] = (struct pollfd){ .fd = d->stop_fd, .events = POLLIN };
	d->pfd[n++] = (struct pollfd){ .fd = d->listen_fd, .events = POLLIN };
	for (uint32_t i = 0; i < d->nclients; i++) {
		d->pfd[n++] = (struct pollfd){ .fd = d->clients[i].sock, .events = POLLIN };
		d->pfd[n++] = (struct pollfd){ .fd = d->clients[i].uffd, .events = POLLIN };
	}
	return n;
}

int mp_pagerd_run(struct mp_pagerd *d)
{
	for (;;) {
		uint32_t n = build_poll(d), nc = d->nclients;
		int err;

		if (poll(d->pfd, n, -1) < 0) {
			if (errno == EINTR)
				continue;
			return mp_err(-errno, "pagerd: poll: %s", strerror(errno));
		}
		if (d->pfd[0].revents)
			return 0;
		/* Faults first, newest client last; a dropped client shifts the rest: stop there. */
		for (uint32_t i = nc; i-- > 0;) {
			struct pollfd *ps = &d->pfd[2 + 2 * i], *pu = ps + 1;

			err = 0;
			if (pu->revents & POLLIN)
				err = client_faults(d, &d->clients[i]);
			if (!err && (ps->revents & POLLIN))
				err = client_request(d, &d->clients[i]);
			else if (!err && (ps->revents & (POLLHUP | POLLERR)))
				err = -ECONNRESET;
			if (err)
				client_drop(d, i, strerror(-err));
		}
		if (d->pfd[1].revents & POLLIN)
			on_connect(d);
	}
}

/*
 * Open and close
 */

/* Binds path, replacing a stale socket file but never a live daemon's. */
static int listen_on(struct mp_pagerd *d, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, probe;

	if (strlen(path) >= sizeof(sa.sun_path))
		return mp_err(-ENAMETOOLONG, "pagerd: socket path %s longer than %zu bytes", path,
			      sizeof(sa.sun_path) - 1);
	strcpy(sa.sun_path, path);
	strcpy(d->path, path);
	probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (probe >= 0 && !connect(probe, (struct sockaddr *)&sa, sizeof(sa))) {
		close(probe);
		return mp_err(-EADDRINUSE, "pagerd: %s: another pager daemon answers there", path);
	}
	if (probe >= 0)
		close(probe);
	unlink(path);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return mp_err(-errno, "pagerd: socket: %s", strerror(errno));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 16)) {
		int err = -errno;

		close(fd);
		return mp_err(err, "pagerd: listening on %s: %s", path, strerror(-err));
	}
	d->listen_fd = fd;
	return 0;
}

static int daemon_budget(struct mp_pagerd *d, const struct mp_pagerd_config *cfg)
{
	uint64_t total = mp_store_total_expert_bytes(d->store), b = cfg->budget_bytes;
	int err;

	if (!b && cfg->budget) {
		err = mp_budget_parse(cfg->budget, total, &b);
		if (err)
			return err;
	}
	if (!b) {
		long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);

		b = MP_MIN(total, (uint64_t)pages * (uint64_t)psz / 2);
	}
	if (b < d->expert_bytes)
		return mp_err(-EINVAL, "pagerd: budget %llu bytes is below one expert (%llu)",
			      (unsigned long long)b, (unsigned long long)d->expert_bytes);
	d->st.budget_bytes = MP_ALIGN_UP(MP_MIN(b, total), d->page);
	return 0;
}

/* Free hugetlb pages of the default size, from /proc/meminfo; 0 when unknown. */
static uint64_t hugetlb_free(void)
{
	char line[128];
	unsigned long long n = 0;
	FILE *f = fopen("/proc/meminfo", "re");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "HugePages_Free: %llu", &n) == 1)
			break;
	fclose(f);
	return n;
}

/* The memfd (one stride per expert, sparse), the daemon's mapping of it, the file tier. */
static int daemon_memory(struct mp_pagerd *d)
{
	unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
	int err;

	if (d->pages == MP_PAGERD_PAGES_HUGETLB) {
		/* The experts the budget holds, each with its tail rounded up to a page. */
		uint64_t need = d->st.budget_bytes / d->expert_bytes * (d->data_bytes / d->page);

		if (hugetlb_free() < need)
			return mp_err(-ENOMEM, "pagerd: hugetlb pages: %llu free of 2 MiB, the budget "
				      "needs %llu (raise vm.nr_hugepages)",
				      (unsigned long long)hugetlb_free(), (unsigned long long)need);
		flags |= MFD_HUGETLB | MFD_HUGE_2MB;
	}
	d->memfd = memfd_create("moepager-host-tier", flags);
	if (d->memfd < 0)
		return mp_err(-errno, "pagerd: memfd_create: %s", strerror(errno));
	if (ftruncate(d->memfd, (off_t)d->memfd_bytes) ||
	    fcntl(d->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
		return mp_err(-errno, "pagerd: sizing the memfd to %llu bytes: %s",
			      (unsigned long long)d->memfd_bytes, strerror(errno));
	d->alias = mmap(NULL, d->memfd_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
			d->memfd, 0);
	if (d->alias == MAP_FAILED) {
		d->alias = NULL;
		return mp_err(-errno, "pagerd: mapping the memfd: %s", strerror(errno));
	}
	/* Shmem allocates through the mapping that touches first: the fills go through this one. */
	if (d->pages == MP_PAGERD_PAGES_THP && madvise(d->alias, d->memfd_bytes, MADV_HUGEPAGE))
		mp_warn("pagerd: MADV_HUGEPAGE on the memfd: %s", strerror(errno));
	err = mp_tier_file_open(d->store, NULL, &d->tier);
	if (!err)
		err = mp_io_open(32, &d->io);
	d->hash = mp_hash_new();
	return err ? err : d->hash ? 0 : -ENOMEM;
}

/* Reads every dense tensor (checksums checked) into the memfd at its place in the layout. */
static int dense_fill(struct mp_pagerd *d, char *dst)
{
	uint32_t n = mp_store_tensor_count(d->store);
	uint64_t *off = calloc(n ? n : 1, sizeof(*off));
	int err = off ? 0 : -ENOMEM;

	if (off)
		mp_share_dense_layout(d->store, off);
	for (uint32_t i = 0; i < n && !err; i++)
		err = mp_store_read_tensor(d->store, mp_store_tensor_at(d->store, i), dst + off[i]);
	free(off);
	return err;
}

/*
 * The dense weights, once for every client: read into a memfd through a
 * writable mapping, which is then dropped so the memfd can be sealed
 * against writes and resizing; the daemon keeps a read-only mapping (its
 * pages count in its PSS, once).
 */
static int daemon_dense(struct mp_pagerd *d)
{
	uint64_t len = mp_share_dense_layout(d->store, NULL), t0 = mp_now_ns();
	char *w;
	int err;

	d->dense_fd = memfd_create("moepager-dense", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (d->dense_fd < 0)
		return mp_err(-errno, "pagerd: memfd_create for the dense weights: %s",
			      strerror(errno));
	d->dense_bytes = len;
	if (ftruncate(d->dense_fd, (off_t)len))
		return mp_err(-errno, "pagerd: sizing the dense weights' memfd to %llu bytes: %s",
			      (unsigned long long)len, strerror(errno));
	w = len ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, d->dense_fd, 0) : NULL;
	if (w == MAP_FAILED)
		return mp_err(-errno, "pagerd: mapping the dense weights' memfd: %s",
			      strerror(errno));
	err = w ? dense_fill(d, w) : 0;
	if (w)
		munmap(w, len);
	if (err)
		return err;
	if (fcntl(d->dense_fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW |
		  F_SEAL_SEAL))
		return mp_err(-errno, "pagerd: sealing the dense weights' memfd: %s",
			      strerror(errno));
	d->dense = len ? mmap(NULL, len, PROT_READ, MAP_SHARED | MAP_POPULATE, d->dense_fd, 0) :
			 NULL;
	if (d->dense == MAP_FAILED) {
		d->dense = NULL;
		return mp_err(-errno, "pagerd: mapping the dense weights: %s", strerror(errno));
	}
	mp_info("pagerd: %llu bytes of dense weights read and checked in %.3f s",
		(unsigned long long)len, (double)(mp_now_ns() - t0) / 1e9);
	return 0;
}

static int daemon_tables(struct mp_pagerd *d, uint32_t max_clients)
{
	d->max_clients = max_clients ? max_clients : 64;
	d->present = calloc(d->nslots, sizeof(*d->present));
	d->epoch = malloc(d->nslots * sizeof(*d->epoch));
	d->used = calloc(d->nslots, sizeof(*d->used));
	d->clients = calloc(d->max_clients, sizeof(*d->clients));
	d->pfd = calloc(2 + 2 * (size_t)d->max_clients, sizeof(*d->pfd));
	if (!d->present || !d->epoch || !d->used || !d->clients || !d->pfd)
		return -ENOMEM;
	/* A client's record starts at 0: epoch 1 means "not mapped whole yet" to everyone. */
	for (uint32_t s = 0; s < d->nslots; s++)
		d->epoch[s] = 1;
	return 0;
}

int mp_pagerd_open(struct mp_store *store, const struct mp_pagerd_config *cfg,
		   struct mp_pagerd **out)
{
	const struct mp_geometry *g = mp_store_geometry(store);
	struct mp_pagerd *d;
	int err;

	*out = NULL;
	if (!cfg || !cfg->socket_path || !*cfg->socket_path)
		return mp_err(-EINVAL, "pagerd config: socket_path is required");
	err = mp_check_reserved(cfg->reserved, MP_ARRAY_SIZE(cfg->reserved), "pagerd config");
	if (err || cfg->pages > MP_PAGERD_PAGES_HUGETLB)
		return err ? err : mp_err(-EINVAL, "pagerd config: pages %u is not a kind of page",
					  cfg->pages);
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	pthread_mutex_init(&d->lock, NULL);
	d->store = store;
	d->memfd = d->listen_fd = d->dense_fd = -1;
	d->layers = g->layers;
	d->experts = g->experts;
	d->nslots = d->layers * d->experts;
	d->expert_bytes = mp_store_expert_bytes(store);
	d->pages = cfg->pages;
	d->page = d->pages == MP_PAGERD_PAGES_HUGETLB ? MP_EXPERT_ALIGN : PAGE;
	d->data_bytes = MP_ALIGN_UP(d->expert_bytes, d->page);
	d->slot_bytes = MP_ALIGN_UP(d->expert_bytes, MP_EXPERT_ALIGN);
	d->memfd_bytes = (uint64_t)d->nslots * d->slot_bytes;
	d->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	err = d->stop_fd < 0 ? -errno : 0;
	if (!err)
		err = daemon_budget(d, cfg);
	if (!err)
		err = daemon_tables(d, cfg->max_clients);
	if (!err)
		err = daemon_memory(d);
	/* The socket first: a second daemon is refused before it reads anything. */
	if (!err)
		err = listen_on(d, cfg->socket_path);
	if (!err)
		err = daemon_dense(d);
	if (err) {
		mp_pagerd_close(d);
		return err;
	}
	mp_info("pagerd: %s on %s: %u experts of %llu bytes, budget %llu bytes", mp_store_name(store),
		d->path, d->nslots, (unsigned long long)d->expert_bytes,
		(unsigned long long)d->st.budget_bytes);
	*out = d;
	return 0;
}

void mp_pagerd_close(struct mp_pagerd *d)
{
	if (!d)
		return;
	while (d->nclients)
		client_drop(d, d->nclients - 1, "daemon closing");
	if (d->listen_fd >= 0) {
		close(d->listen_fd);
		unlink(d->path);
	}
	if (d->stop_fd >= 0)
		close(d->stop_fd);
	if (d->alias)
		munmap(d->alias, d->memfd_bytes);
	if (d->memfd >= 0)
		close(d->memfd);
	if (d->dense)
		munmap(d->dense, d->dense_bytes);
	if (d->dense_fd >= 0)
		close(d->dense_fd);
	mp_io_close(d->io);
	mp_tier_destroy(d->tier);
	mp_hash_free(d->hash);
	free(d->present);
	free(d->epoch);
	free(d->used);
	free(d->clients);
	free(d->pfd);
	pthread_mutex_destroy(&d->lock);
	free(d);
}

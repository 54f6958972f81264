/* SPDX-License-Identifier: MIT */
/* The pager daemon's protocol (share_daemon.c, share_attach.c) and the guard's range hook. */
#ifndef MP_SHARE_PRIV_H
#define MP_SHARE_PRIV_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <moepager/share.h>

/* One SOCK_SEQPACKET message each; a version change bumps MP_SHARE_PROTO. */
#define MP_SHARE_MAGIC	0x4552414853504dull	/* "MPSHARE" */
#define MP_SHARE_PROTO	2

enum mp_share_op {
	MP_SHARE_HELLO = 1,	/* client -> daemon; the reply carries the memfd */
	MP_SHARE_ATTACH,	/* client -> daemon, with the client's userfaultfd */
	MP_SHARE_STATS,		/* client -> daemon; the reply carries struct mp_pagerd_stats */
	MP_SHARE_BUDGET,	/* client -> daemon: struct mp_share_budget; a mp_share_reply */
	MP_SHARE_DENSE,		/* client -> daemon; the reply (dense_bytes) carries the
				 * sealed memfd of the dense weights */
	MP_SHARE_NODE,		/* client -> daemon: struct mp_share_node; a mp_share_reply */
};

struct mp_share_hello {
	uint64_t magic;
	uint32_t op;
	uint32_t proto;
	uint32_t version_major;
	uint32_t version_minor;
	uint64_t identity;	/* mp_store_identity() of the client's model */
	uint64_t expert_bytes;
};

struct mp_share_reply {
	uint64_t magic;
	int32_t status;		/* 0 or -errno; message says why */
	uint32_t layers;
	uint32_t experts;
	uint32_t nslots;
	uint64_t slot_bytes;
	uint64_t data_bytes;
	uint64_t memfd_bytes;
	uint64_t page_bytes;	/* the memfd's page size: 4 KiB, or 2 MiB for hugetlb */
	uint64_t dense_bytes;	/* MP_SHARE_DENSE: the dense memfd's size */
	char message[256];
};

struct mp_share_attach {
	uint64_t magic;
	uint32_t op;
	uint32_t pad;
	uint64_t base;		/* the client's range, nslots * slot_bytes */
};

struct mp_share_budget {
	uint64_t magic;
	uint32_t op;
	uint32_t pad;
	uint64_t bytes;
};

struct mp_share_node {
	uint64_t magic;
	uint32_t op;
	int32_t node;		/* the NUMA node the host tier moves to */
};

struct mp_share_stats {
	uint64_t magic;
	int32_t status;
	uint32_t pad;
	struct mp_pagerd_stats stats;
};

/*
 * The dense weights' memfd: every non-expert tensor of the store, in table
 * order, each at a multiple of 4 KiB, as the .mpk holds it. off (may be
 * NULL) gets each tensor's offset; returns the memfd's size. The daemon and
 * its clients lay it out alike (the handshake made sure they have the same
 * model and library).
 */
uint64_t mp_share_dense_layout(const struct mp_store *s, uint64_t *off);

/* Sends one message, with fd when >= 0. Returns 0, -ENOTCONN when the peer is gone, or -errno. */
int mp_share_send(int sock, const void *buf, size_t len, int fd);
/*
 * Receives one message into buf (zeroed first) and the fd it carries (*fd,
 * else -1). Returns its length, -ENOTCONN when the peer hung up, or -errno.
 */
ssize_t mp_share_recv(int sock, void *buf, size_t len, int *fd);

/*
 * The SIGBUS guard for ranges that are not a pager's: an access to
 * [start, start+len) inside mp_pager_guard() returns cause(ctx, addr),
 * called after the jump, outside signal context, under the registry lock
 * (so unregistering waits for it).
 */
int mp_guard_register_range(const void *start, uint64_t len,
			    int (*cause)(void *ctx, void *addr), void *ctx);
void mp_guard_unregister_range(void *ctx);

#endif /* MP_SHARE_PRIV_H */

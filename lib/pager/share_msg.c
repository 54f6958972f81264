// SPDX-License-Identifier: MIT
/* The pager daemon's messages (one SOCK_SEQPACKET message each) and the dense weights' layout. */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"
#include "pager/share_priv.h"

uint64_t mp_share_dense_layout(const struct mp_store *s, uint64_t *off)
{
	uint64_t at = 0;

	for (uint32_t i = 0; i < mp_store_tensor_count(s); i++) {
		if (off)
			off[i] = at;
		at += MP_ALIGN_UP(mp_store_tensor_at(s, i)->bytes, 4096);
	}
	return at;
}

int mp_share_send(int sock, const void *buf, size_t len, int fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { (void *)buf, len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cm;

	if (fd >= 0) {
		mh.msg_control = cbuf;
		mh.msg_controllen = sizeof(cbuf);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	}
	if (sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)len)
		return 0;
	return errno == EPIPE || errno == ECONNRESET ? -ENOTCONN : -errno;
}

ssize_t mp_share_recv(int sock, void *buf, size_t len, int *fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { buf, len };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			     .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;
	ssize_t n;

	*fd = -1;
	memset(buf, 0, len);
	n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	if (n == 0 || (n < 0 && errno == ECONNRESET))
		return -ENOTCONN;
	if (n < 0)
		return -errno;
	for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS)
			memcpy(fd, CMSG_DATA(cm), sizeof(int));
	return n;
}

// SPDX-License-Identifier: MIT
/*
 * Anonymous memory on transparent huge pages, for what the engine streams
 * (resident experts, dense weights, the bandwidth probe). With THP in
 * "madvise" mode a mapping gets 2 MiB pages only where it is advised and
 * only over 2 MiB-aligned stretches; the kernel aligns a large anonymous
 * mapping only when its length is a multiple of 2 MiB, so the mapping is
 * over-allocated by one huge page and trimmed to an aligned start here.
 * On 4 KiB pages one thread read 26 GB/s against 30.5 on huge pages on the
 * session-32 VM (docs/engine.md "Session 32").
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"

#define HUGE_BYTES (2ull << 20)

void *mp_huge_map(size_t len)
{
	size_t span = MP_ALIGN_UP(len, 4096), head, tail;
	char *raw, *p;

	if (!len)
		return NULL;
	raw = mmap(NULL, span + HUGE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		   -1, 0);
	if (raw == MAP_FAILED)
		return NULL;
	p = (char *)MP_ALIGN_UP((uintptr_t)raw, HUGE_BYTES);
	head = (size_t)(p - raw);
	tail = HUGE_BYTES - head;
	if (head)
		munmap(raw, head);
	if (tail)
		munmap(p + span, tail);
	/* Advice only: without THP the memory is still there, on 4 KiB pages. */
	madvise(p, span, MADV_HUGEPAGE);
	return p;
}

void mp_huge_unmap(void *p, size_t len)
{
	if (p)
		munmap(p, MP_ALIGN_UP(len, 4096));
}

double mp_huge_share(const void *p)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	unsigned long long rss = 0, huge = 0;
	char line[512];
	bool in = false;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long a, b, kb;
		char perm[8];

		if (sscanf(line, "%llx-%llx %7s", &a, &b, perm) == 3) {
			if (in)
				break;
			in = (uintptr_t)p >= a && (uintptr_t)p < b;
		} else if (in && sscanf(line, "Rss: %llu kB", &kb) == 1) {
			rss = kb;
		} else if (in && sscanf(line, "AnonHugePages: %llu kB", &kb) == 1) {
			huge = kb;
		}
	}
	fclose(f);
	return rss ? (double)huge / (double)rss : in ? 0 : -1;
}

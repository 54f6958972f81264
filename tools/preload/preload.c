// SPDX-License-Identifier: MIT
/*
 * Description: libmoepager-preload.so, for LD_PRELOAD into an unmodified
 * program (llama.cpp): its read-only mmap of a whole GGUF MoE model becomes
 * a moepager file image (<moepager/image.h>) whose experts are paged under
 * $MOEPAGER_BUDGET. docs/preload.md.
 *
 * Interposed: mmap (the GGUF's becomes an image; MAP_POPULATE is moot),
 * munmap (a part of an image is forgotten; the last part closes it),
 * madvise/posix_madvise (WILLNEED and friends over an image are no-ops:
 * they would read every expert), posix_fadvise (WILLNEED on a GGUF's fd
 * would fill the page cache with the whole file), mlock (over an image:
 * pinning would defeat the budget). Everything else passes through.
 *
 * Environment: MOEPAGER_BUDGET, MOEPAGER_EVICTION (as the pager),
 * MOEPAGER_PREFETCH (experts read ahead per fault, learnt from fault
 * order; default 0), MOEPAGER_PRELOAD=0 (pass everything through),
 * MOEPAGER_PRELOAD_STATS (a file, or "-" for stderr: one JSON line of
 * statistics per image when it closes), MOEPAGER_WARM=1 (read experts in at
 * open while they fit), MOEPAGER_DEBUG (log lines).
 */
/* Both mmap and mmap64 are defined here: no redirection of one to the other. */
#undef _FILE_OFFSET_BITS
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "preload.h"

#define MAX_IMAGES 8
#define EXPORT __attribute__((visibility("default")))

struct open_image {
	struct mp_image *img;
	char *base;
	uint64_t bytes;
	char path[512];
};

static struct open_image images[MAX_IMAGES];
static pthread_mutex_t images_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread int inside;		/* our own calls pass straight through */

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);
typedef int (*munmap_fn)(void *, size_t);
typedef int (*madvise_fn)(void *, size_t, int);
typedef int (*fadvise_fn)(int, off_t, off_t, int);
typedef int (*mlock_fn)(const void *, size_t);

/* MOEPAGER_PRELOAD=0: every call passes through. */
static bool disabled(void)
{
	const char *v = getenv("MOEPAGER_PRELOAD");

	return v && !strcmp(v, "0");
}

static void *next(const char *name)
{
	return dlsym(RTLD_NEXT, name);
}

static void *real_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	static mmap_fn fn;

	if (!fn)
		fn = (mmap_fn)next("mmap");
	if (!fn)	/* dlsym itself mapping memory before we know glibc's */
		return (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
	return fn(addr, len, prot, flags, fd, off);
}

static int real_munmap(void *addr, size_t len)
{
	static munmap_fn fn;

	if (!fn)
		fn = (munmap_fn)next("munmap");
	return fn ? fn(addr, len) : (int)syscall(SYS_munmap, addr, len);
}

static void say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fputs("moepager-preload: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

static void log_line(enum mp_log_level level, const char *msg, void *arg)
{
	(void)arg;
	/* errors come back as mp_last_error(), which the caller says with its context */
	if (level == MP_LOG_WARN || (level > MP_LOG_WARN && getenv("MOEPAGER_DEBUG")))
		say("%s", msg);
}

/* The image holding [addr, addr + len), or NULL (images_lock held). */
static struct open_image *find(const void *addr, size_t len)
{
	const char *a = addr;

	for (int i = 0; i < MAX_IMAGES; i++) {
		struct open_image *o = &images[i];

		if (o->img && a < o->base + o->bytes && a + len > o->base)
			return o;
	}
	return NULL;
}

struct mp_image *preload_image(void)
{
	struct mp_image *img = NULL;

	pthread_mutex_lock(&images_lock);
	for (int i = 0; i < MAX_IMAGES && !img; i++)
		img = images[i].img;
	pthread_mutex_unlock(&images_lock);
	return img;
}

static bool is_gguf(int fd, const struct stat *st)
{
	char magic[4];

	return S_ISREG(st->st_mode) && pread(fd, magic, 4, 0) == 4 && !memcmp(magic, "GGUF", 4);
}

static void print_stats(const struct open_image *o)
{
	const char *to = getenv("MOEPAGER_PRELOAD_STATS");
	struct mp_image_stats s;
	FILE *f;

	if (!to || !*to)
		return;
	f = strcmp(to, "-") ? fopen(to, "a") : stderr;
	if (!f)
		return;
	mp_image_stats(o->img, &s);
	fprintf(f, "{\"file\": \"%s\", \"file_bytes\": %" PRIu64 ", \"fixed_bytes\": %" PRIu64
		", \"expert_bytes\": %" PRIu64 ", \"expert_max_bytes\": %" PRIu64
		", \"budget_bytes\": %" PRIu64 ", \"resident_peak\": %" PRIu64
		", \"faults\": %" PRIu64 ", \"fills\": %" PRIu64 ", \"prefetches\": %" PRIu64
		", \"evictions\": %" PRIu64 ", \"bytes_read\": %" PRIu64 ", \"layers\": %" PRIu32
		", \"experts\": %" PRIu32 ", \"routes\": %" PRIu64 ", \"route_hits\": %" PRIu64
		", \"hit_rate\": %.4f}\n", o->path, s.file_bytes, s.fixed_bytes,
		s.expert_bytes, s.expert_max_bytes, s.budget_bytes, s.resident_peak, s.faults,
		s.fills, s.prefetches, s.evictions, s.bytes_read, s.layers, s.experts, s.routes,
		s.route_hits, s.routes ? (double)s.route_hits / (double)s.routes : 0.0);
	if (f != stderr)
		fclose(f);
}

static void close_image(struct open_image *o)
{
	print_stats(o);
	mp_image_close(o->img);
	o->img = NULL;
}

/* MOEPAGER_WARM=1: reads experts in, layer by layer, while they fit in the budget. */
static void warm(struct mp_image *img)
{
	struct mp_image_stats st;

	mp_image_stats(img, &st);
	for (uint32_t L = 0; L < st.layers; L++)
		for (uint32_t e = 0; e < st.experts; e++) {
			mp_image_stats(img, &st);
			if (st.resident_bytes + st.expert_max_bytes > st.budget_bytes ||
			    mp_image_fetch(img, L, e))
				return;
		}
}

/* Makes the mapping an image; MAP_FAILED (errno 0) when it should pass through. */
static void *image_map(size_t len, int fd)
{
	struct mp_image_config cfg = { .path = NULL };
	const char *pf = getenv("MOEPAGER_PREFETCH");
	struct open_image *slot = NULL;
	char link[64];
	struct stat st;
	ssize_t n;

	if (fstat(fd, &st) || (uint64_t)st.st_size != len || !is_gguf(fd, &st))
		return MAP_FAILED;
	pthread_mutex_lock(&images_lock);
	for (int i = 0; i < MAX_IMAGES && !slot; i++)
		slot = images[i].img ? NULL : &images[i];
	if (!slot)
		goto pass;
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	n = readlink(link, slot->path, sizeof(slot->path) - 1);
	if (n <= 0)
		goto pass;
	slot->path[n] = '\0';
	cfg.path = slot->path;
	cfg.prefetch = pf ? (uint32_t)strtoul(pf, NULL, 10) : 0;
	if (mp_image_open(&cfg, &slot->img)) {
		say("%s stays a plain mapping: %s", slot->path, mp_last_error());
		goto pass;
	}
	slot->base = (char *)mp_image_base(slot->img);
	slot->bytes = mp_image_bytes(slot->img);
	if (getenv("MOEPAGER_WARM") && strcmp(getenv("MOEPAGER_WARM"), "0"))
		warm(slot->img);
	pthread_mutex_unlock(&images_lock);
	return slot->base;
pass:
	pthread_mutex_unlock(&images_lock);
	return MAP_FAILED;
}

EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	void *p = MAP_FAILED;

	if (!inside && fd >= 0 && !addr && !off && prot == PROT_READ &&
	    !(flags & (MAP_FIXED | MAP_ANONYMOUS)) && !disabled()) {
		inside = 1;
		p = image_map(len, fd);
		inside = 0;
	}
	return p != MAP_FAILED ? p : real_mmap(addr, len, prot, flags, fd, off);
}

EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off64_t off)
{
	return mmap(addr, len, prot, flags, fd, off);
}

EXPORT int munmap(void *addr, size_t len)
{
	struct open_image *o;
	int rc;

	if (inside)
		return real_munmap(addr, len);
	pthread_mutex_lock(&images_lock);
	o = find(addr, len);
	rc = real_munmap(addr, len);
	if (o && !rc) {
		inside = 1;
		if (mp_image_forget(o->img, addr, len) == 0)
			close_image(o);
		inside = 0;
	}
	pthread_mutex_unlock(&images_lock);
	return rc;
}

/* Advice over an image that would read what it covers: taken as done. */
static bool advice_on_image(void *addr, size_t len, int advice)
{
	bool ours;

	if (advice == MADV_DONTNEED || advice == MADV_REMOVE || advice == MADV_FREE)
		return false;
	pthread_mutex_lock(&images_lock);
	ours = find(addr, len) != NULL;
	pthread_mutex_unlock(&images_lock);
	return ours;
}

EXPORT int madvise(void *addr, size_t len, int advice)
{
	static madvise_fn fn;

	if (!inside && advice_on_image(addr, len, advice))
		return 0;
	if (!fn)
		fn = (madvise_fn)next("madvise");
	return fn(addr, len, advice);
}

/* glibc's posix_madvise calls the system call itself, never madvise(). */
EXPORT int posix_madvise(void *addr, size_t len, int advice)
{
	static madvise_fn fn;

	if (!inside && advice_on_image(addr, len, advice))
		return 0;
	if (!fn)
		fn = (madvise_fn)next("posix_madvise");
	return fn(addr, len, advice);
}

EXPORT int posix_fadvise(int fd, off_t off, off_t len, int advice)
{
	static fadvise_fn fn;
	struct stat st;

	if (!inside && advice == POSIX_FADV_WILLNEED && !fstat(fd, &st) && is_gguf(fd, &st) &&
	    !disabled())
		return 0;
	if (!fn)
		fn = (fadvise_fn)next("posix_fadvise");
	return fn(fd, off, len, advice);
}

EXPORT int posix_fadvise64(int fd, off64_t off, off64_t len, int advice)
{
	return posix_fadvise(fd, off, len, advice);
}

EXPORT int mlock(const void *addr, size_t len)
{
	static mlock_fn fn;
	bool ours;

	pthread_mutex_lock(&images_lock);
	ours = !inside && find(addr, len);
	pthread_mutex_unlock(&images_lock);
	if (ours)
		return 0;
	if (!fn)
		fn = (mlock_fn)next("mlock");
	return fn(addr, len);
}

__attribute__((constructor)) static void preload_init(void)
{
	mp_set_log_handler(log_line, NULL);
}

/* Images the program never unmapped: their statistics, then they go with the process. */
__attribute__((destructor)) static void preload_fini(void)
{
	pthread_mutex_lock(&images_lock);
	inside = 1;
	for (int i = 0; i < MAX_IMAGES; i++)
		if (images[i].img)
			print_stats(&images[i]);
	inside = 0;
	pthread_mutex_unlock(&images_lock);
}

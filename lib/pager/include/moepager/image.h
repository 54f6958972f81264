/* SPDX-License-Identifier: MIT */
/*
 * A file image: a GGUF model file's bytes behind one range, as an mmap of
 * the file would show them, with the experts paged under a budget. An
 * expert is its three slices (gate, up, down) in three tensors; every other
 * byte is filled from the file at open and stays. docs/preload.md.
 */
#ifndef MOEPAGER_IMAGE_H
#define MOEPAGER_IMAGE_H

#include <moepager/common.h>

#ifdef __cplusplus
extern "C" {
#endif

struct mp_image;

struct mp_image_config {
	const char *path;		/* the GGUF file */
	/*
	 * Expert bytes in memory (pages, a page shared by two experts counted
	 * once). 0: the budget string, else $MOEPAGER_BUDGET, else every expert.
	 */
	uint64_t budget_bytes;
	const char *budget;		/* "8G", "512M", "40%" of the expert pages */
	/* Eviction policy ("lru", "fifo", "lfu"; NULL: $MOEPAGER_EVICTION, else "lru"). */
	const char *eviction;
	/*
	 * Read-ahead learnt from the order of use (faults, mp_image_route()):
	 * after a use of layer L, the `prefetch` experts of layer L+1 that
	 * most often followed layer L's experts in use are read on a prefetch
	 * thread. 0: none.
	 */
	uint32_t prefetch;
	uint32_t pad0;
	MP_RESERVED(6);
};

struct mp_image_stats {
	uint64_t file_bytes;		/* the file's size (the range is it, page-rounded) */
	uint64_t fixed_bytes;		/* pages holding non-expert bytes: filled at open, kept */
	uint64_t expert_bytes;		/* pages holding only expert bytes, every expert */
	uint64_t expert_max_bytes;	/* the most pages one expert needs: the least budget */
	uint64_t budget_bytes;
	uint64_t resident_bytes;	/* expert pages in memory now */
	uint64_t resident_peak;
	uint64_t faults;		/* fault messages served */
	uint64_t fills;			/* experts read in (demand and prefetch) */
	uint64_t prefetches;		/* of the fills, those read ahead */
	uint64_t evictions;
	uint64_t bytes_read;		/* expert bytes read from the file */
	/* Routed experts reported through mp_image_route(), and those in memory then. */
	uint64_t routes;
	uint64_t route_hits;
	uint32_t layers;
	uint32_t experts;
	uint32_t prefetch_pending;	/* read-aheads queued, not yet taken by the prefetch thread */
	uint32_t pad0;
	MP_RESERVED(4);
};

/*
 * Opens the GGUF file, checks it and its expert tensors
 * (blk.L.ffn_{gate,up,down}_exps.weight, the same expert count in each),
 * reserves a range of the file's size, registers it with a userfaultfd,
 * fills every non-expert page from the file and starts the fault handler.
 * Returns 0 and sets *out; -EINVAL (a bad file, no experts, a budget below
 * one expert) or -ENODATA (truncated) naming the file, tensor and offset;
 * -EPERM or -EOPNOTSUPP when userfaultfd is not available.
 */
MP_API int mp_image_open(const struct mp_image_config *cfg, struct mp_image **out);
/* Stops the handler and prefetch threads, unmaps the range. NULL is allowed. */
MP_API void mp_image_close(struct mp_image *img);
/* The range's first byte: byte i of the file is at base + i. */
MP_API const void *mp_image_base(const struct mp_image *img);
/* The range's length (the file's size rounded up to a page). */
MP_API uint64_t mp_image_bytes(const struct mp_image *img);
/*
 * Reads expert `expert` of `layer` in now if it is not in memory (evicting
 * others). Returns 0, -ERANGE for no such expert, or the read's error.
 */
MP_API int mp_image_fetch(struct mp_image *img, uint32_t layer, uint32_t expert);
/*
 * The engine routes to experts[0..n) of `layer` (distinct): each is a use
 * for the eviction policy and, with prefetch, for the learnt order; when
 * the n experts fit in the budget together, each not in memory is read in
 * now, before the engine touches it (otherwise faults read them). Returns
 * how many were in memory already, -ERANGE for no such layer or expert, or
 * a read's error.
 */
MP_API int mp_image_route(struct mp_image *img, uint32_t layer, const uint32_t *experts,
			  uint32_t n);
/*
 * Forgets the range from first to first + len without unmapping (the caller
 * unmapped it, or is about to): the image stops filling pages there.
 * Returns the bytes of the range still in use.
 */
MP_API uint64_t mp_image_forget(struct mp_image *img, const void *first, uint64_t len);
MP_API void mp_image_stats(struct mp_image *img, struct mp_image_stats *out);

#ifdef __cplusplus
}
#endif

#endif /* MOEPAGER_IMAGE_H */

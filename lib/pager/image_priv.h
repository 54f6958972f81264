/* SPDX-License-Identifier: MIT */
/* The file image's layout without its range, for the fuzzer (tests/fuzz/fuzz_gguf.c). */
#ifndef MP_PAGER_IMAGE_PRIV_H
#define MP_PAGER_IMAGE_PRIV_H

#include <moepager/image.h>

/*
 * Checks the GGUF at path and lays it out as mp_image_open() would (expert
 * tensors, fixed and expert pages, each expert's pages), without a range
 * or a userfaultfd. Fills out's layout figures (file_bytes, fixed_bytes,
 * expert_bytes, expert_max_bytes, layers, experts). Returns 0 or
 * mp_image_open()'s errors for the file.
 */
int mp_image_layout(const char *path, struct mp_image_stats *out);

#endif /* MP_PAGER_IMAGE_PRIV_H */

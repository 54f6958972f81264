/* SPDX-License-Identifier: MIT */
/* What the preload's parts share (preload.c, eval.c). */
#ifndef MP_PRELOAD_H
#define MP_PRELOAD_H

#include <moepager/image.h>

/* The first open image (the model llama.cpp mapped), or NULL. */
struct mp_image *preload_image(void);

#endif

// SPDX-License-Identifier: MIT
/*
 * Description: routing from inside llama.cpp for libmoepager-preload.so.
 * Its context creation is interposed to install an eval callback (chained
 * to the program's own): the callback asks for each layer's
 * `ffn_moe_topk-L` tensor (the routed expert ids, computed before the
 * expert products run) and hands the ids to mp_image_route(), which counts
 * hits, reads missing experts in before they are touched, tells the
 * eviction policy of every use and feeds the learnt read-ahead.
 * MOEPAGER_EVAL=0 leaves the program's callback alone.
 */
#include <dlfcn.h>
#include <link.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-backend.h"
#include "llama.h"

#include "preload.h"

#define EXPORT __attribute__((visibility("default")))
#define TOPK "ffn_moe_topk-"

typedef void (*tensor_get_fn)(const struct ggml_tensor *, void *, size_t, size_t);
typedef struct llama_context *(*init_fn)(struct llama_model *, struct llama_context_params);

struct chain {
	ggml_backend_sched_eval_callback fn;	/* the program's, or NULL */
	void *arg;
};

/* The program's answer to the last question about a tensor (per computing thread). */
static __thread const struct ggml_tensor *asked;
static __thread bool their_want;

static int topk_layer(const struct ggml_tensor *t)
{
	char *end;
	long L;

	if (strncmp(t->name, TOPK, sizeof(TOPK) - 1))
		return -1;
	L = strtol(t->name + sizeof(TOPK) - 1, &end, 10);
	return *end || L < 0 || L > INT32_MAX ? -1 : (int)L;
}

static int find_libllama(struct dl_phdr_info *info, size_t size, void *arg)
{
	const char *base = strrchr(info->dlpi_name, '/');

	(void)size;
	if (!base || strncmp(base + 1, "libllama", 8))
		return 0;
	*(void **)arg = dlopen(info->dlpi_name, RTLD_NOLOAD | RTLD_LAZY);
	return *(void **)arg != NULL;
}

/*
 * A function of llama.cpp or ggml: the next definition after ours, or,
 * when the program loaded libllama with dlopen(RTLD_LOCAL) (node-llama-cpp's
 * addon does), the one libllama and its dependencies hold.
 */
static void *llama_sym(const char *name)
{
	void *fn = dlsym(RTLD_NEXT, name), *lib = NULL;

	if (fn || !dl_iterate_phdr(find_libllama, &lib))
		return fn;
	fn = dlsym(lib, name);
	dlclose(lib);		/* the program's own dlopen keeps it loaded */
	return fn;
}

/* Reads the ids (int32 [k, tokens], rows strided) and routes the distinct ones. */
static void route(struct mp_image *img, const struct ggml_tensor *t, uint32_t layer)
{
	static tensor_get_fn get;
	uint32_t ids[256], n = 0;
	int32_t row[64];
	int64_t k = t->ne[0];

	if (!get)
		get = (tensor_get_fn)llama_sym("ggml_backend_tensor_get");
	if (!get || t->type != GGML_TYPE_I32 || k <= 0 || k > 64)
		return;
	for (int64_t tok = 0; tok < t->ne[1]; tok++) {
		get(t, row, (size_t)tok * t->nb[1], (size_t)k * sizeof(int32_t));
		for (int64_t i = 0; i < k; i++) {
			uint32_t j = 0;

			while (j < n && ids[j] != (uint32_t)row[i])
				j++;
			if (j == n && n < 256)
				ids[n++] = (uint32_t)row[i];
		}
	}
	mp_image_route(img, layer, ids, n);
}

static bool on_eval(struct ggml_tensor *t, bool ask, void *arg)
{
	const struct chain *c = arg;
	struct mp_image *img = preload_image();
	int L = topk_layer(t);
	bool theirs = true;

	if (ask) {
		their_want = c->fn && c->fn(t, true, c->arg);
		asked = t;
		return (L >= 0 && img) || their_want;
	}
	if (c->fn && asked == t && their_want)
		theirs = c->fn(t, false, c->arg);
	if (L >= 0 && img)
		route(img, t, (uint32_t)L);
	return theirs;
}

static struct llama_context *chained(const char *name, struct llama_model *model,
				     struct llama_context_params p)
{
	init_fn real = (init_fn)llama_sym(name);
	const char *off = getenv("MOEPAGER_EVAL");
	struct chain *c;

	if (!real)
		return NULL;
	if (!preload_image() || (off && !strcmp(off, "0")) || !(c = malloc(sizeof(*c))))
		return real(model, p);
	/* freed with the process: contexts do not say when they go */
	*c = (struct chain){ p.cb_eval, p.cb_eval_user_data };
	p.cb_eval = on_eval;
	p.cb_eval_user_data = c;
	return real(model, p);
}

EXPORT struct llama_context *llama_init_from_model(struct llama_model *model,
						   struct llama_context_params p)
{
	return chained("llama_init_from_model", model, p);
}

EXPORT struct llama_context *llama_new_context_with_model(struct llama_model *model,
							  struct llama_context_params p)
{
	return chained("llama_new_context_with_model", model, p);
}

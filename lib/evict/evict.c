// SPDX-License-Identifier: MIT
/* The eviction policy table and the recency list the list-based policies share. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "evict/evict.h"

/* Later policies (lfu, finemoe, coserve, belady) add a line here and a file. */
static const struct mp_evict_ops *const policies[] = {
	&mp_evict_lru,
	&mp_evict_fifo,
	&mp_evict_lfu,
	&mp_evict_finemoe,
	&mp_evict_coserve,
	&mp_evict_belady,
	&mp_evict_ema,
};

const struct mp_evict_ops *mp_evict_find(const char *name)
{
	for (size_t i = 0; name && i < MP_ARRAY_SIZE(policies); i++)
		if (!strcmp(policies[i]->name, name))
			return policies[i];
	return NULL;
}

const char *mp_evict_names(void)
{
	static const char names[] = "lru, fifo, lfu, finemoe, coserve, belady";

	return names;
}

int mp_evict_init(struct mp_evict *pol, const struct mp_evict_ops *ops,
		   const struct mp_evict_env *env)
{
	memset(pol, 0, sizeof(*pol));
	pol->ops = ops;
	pol->env = *env;
	return ops->init ? ops->init(pol) : 0;
}

void mp_evict_fini(struct mp_evict *pol)
{
	if (pol->ops && pol->ops->fini)
		pol->ops->fini(pol);
	pol->ops = NULL;
}

int mp_keylist_init(struct mp_keylist *l, uint32_t nkeys)
{
	l->prev = malloc(nkeys * sizeof(*l->prev));
	l->next = malloc(nkeys * sizeof(*l->next));
	l->on = calloc(nkeys, 1);
	l->head = l->tail = MP_KEYLIST_NONE;
	l->n = 0;
	if (!l->prev || !l->next || !l->on) {
		mp_keylist_fini(l);
		return -ENOMEM;
	}
	return 0;
}

void mp_keylist_fini(struct mp_keylist *l)
{
	free(l->prev);
	free(l->next);
	free(l->on);
	l->prev = l->next = NULL;
	l->on = NULL;
}

void mp_keylist_remove(struct mp_keylist *l, uint32_t key)
{
	if (!l->on[key])
		return;
	if (l->prev[key] != MP_KEYLIST_NONE)
		l->next[l->prev[key]] = l->next[key];
	else
		l->head = l->next[key];
	if (l->next[key] != MP_KEYLIST_NONE)
		l->prev[l->next[key]] = l->prev[key];
	else
		l->tail = l->prev[key];
	l->on[key] = 0;
	l->n--;
}

void mp_keylist_push_head(struct mp_keylist *l, uint32_t key)
{
	mp_keylist_remove(l, key);
	l->prev[key] = MP_KEYLIST_NONE;
	l->next[key] = l->head;
	if (l->head != MP_KEYLIST_NONE)
		l->prev[l->head] = key;
	else
		l->tail = key;
	l->head = key;
	l->on[key] = 1;
	l->n++;
}

int64_t mp_keylist_victim(const struct mp_keylist *l, mp_evict_ok_fn evictable, void *arg)
{
	for (uint32_t k = l->tail; k != MP_KEYLIST_NONE; k = l->prev[k])
		if (evictable(arg, k))
			return k;
	return -ENOENT;
}

int64_t mp_keylist_min_victim(const struct mp_keylist *l,
			      double (*score)(const struct mp_evict *pol, uint32_t key),
			      const struct mp_evict *pol, mp_evict_ok_fn evictable, void *arg)
{
	int64_t best = -ENOENT;
	double best_s = 0;

	/* From the tail, so a later key must score strictly lower to win. */
	for (uint32_t k = l->tail; k != MP_KEYLIST_NONE; k = l->prev[k]) {
		double s = score(pol, k);

		if ((best < 0 || s < best_s) && evictable(arg, k)) {
			best = k;
			best_s = s;
		}
	}
	return best;
}

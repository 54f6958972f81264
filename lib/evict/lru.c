// SPDX-License-Identifier: MIT
/* LRU eviction: the resident expert used least recently goes first. */
#include <errno.h>
#include <stdlib.h>

#include "evict/evict.h"

int mp_evict_lru_init(struct mp_evict *pol)
{
	struct mp_keylist *l = malloc(sizeof(*l));
	int err;

	if (!l)
		return -ENOMEM;
	err = mp_keylist_init(l, pol->env.nkeys);
	if (err) {
		free(l);
		return err;
	}
	pol->priv = l;
	return 0;
}

void mp_evict_lru_insert(struct mp_evict *pol, uint32_t key)
{
	mp_keylist_push_head(pol->priv, key);
}

void mp_evict_lru_access(struct mp_evict *pol, uint32_t key)
{
	struct mp_keylist *l = pol->priv;

	/* Only resident keys are on the list; an access to another one is a fault's business. */
	if (l->on[key])
		mp_keylist_push_head(l, key);
}

void mp_evict_lru_remove(struct mp_evict *pol, uint32_t key)
{
	mp_keylist_remove(pol->priv, key);
}

int64_t mp_evict_lru_victim(struct mp_evict *pol, mp_evict_ok_fn evictable, void *arg)
{
	return mp_keylist_victim(pol->priv, evictable, arg);
}

void mp_evict_lru_fini(struct mp_evict *pol)
{
	if (pol->priv)
		mp_keylist_fini(pol->priv);
	free(pol->priv);
	pol->priv = NULL;
}

const struct mp_evict_ops mp_evict_lru = {
	.name = "lru",
	.description = "least recently used (routing reports and faults count as uses)",
	.init = mp_evict_lru_init,
	.on_insert = mp_evict_lru_insert,
	.on_access = mp_evict_lru_access,
	.on_fault = mp_evict_lru_access,
	.on_remove = mp_evict_lru_remove,
	.pick_victim = mp_evict_lru_victim,
	.fini = mp_evict_lru_fini,
};

// SPDX-License-Identifier: MIT
/* LRU eviction: the resident expert used least recently goes first. */
#include <errno.h>
#include <stdlib.h>

#include "policy.h"

static int lru_init(struct mp_policy *pol)
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

static void lru_touch(struct mp_policy *pol, uint32_t key)
{
	mp_keylist_push_head(pol->priv, key);
}

static void lru_access(struct mp_policy *pol, uint32_t key)
{
	struct mp_keylist *l = pol->priv;

	/* Only resident keys are on the list; an access to another one is a fault's business. */
	if (l->on[key])
		mp_keylist_push_head(l, key);
}

static void lru_remove(struct mp_policy *pol, uint32_t key)
{
	mp_keylist_remove(pol->priv, key);
}

static int64_t lru_victim(struct mp_policy *pol, mp_policy_evictable_fn evictable, void *arg)
{
	return mp_keylist_victim(pol->priv, evictable, arg);
}

static void lru_fini(struct mp_policy *pol)
{
	if (pol->priv)
		mp_keylist_fini(pol->priv);
	free(pol->priv);
	pol->priv = NULL;
}

const struct mp_policy_ops mp_policy_lru = {
	.name = "lru",
	.description = "least recently used (routing reports and faults count as uses)",
	.init = lru_init,
	.on_insert = lru_touch,
	.on_access = lru_access,
	.on_fault = lru_access,
	.on_remove = lru_remove,
	.pick_victim = lru_victim,
	.fini = lru_fini,
};

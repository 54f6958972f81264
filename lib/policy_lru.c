// SPDX-License-Identifier: MIT
/* LRU eviction: the resident expert used least recently goes first. */
#include <errno.h>
#include <stdlib.h>

#include "policy.h"

int mp_policy_lru_init(struct mp_policy *pol)
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

void mp_policy_lru_insert(struct mp_policy *pol, uint32_t key)
{
	mp_keylist_push_head(pol->priv, key);
}

void mp_policy_lru_access(struct mp_policy *pol, uint32_t key)
{
	struct mp_keylist *l = pol->priv;

	/* Only resident keys are on the list; an access to another one is a fault's business. */
	if (l->on[key])
		mp_keylist_push_head(l, key);
}

void mp_policy_lru_remove(struct mp_policy *pol, uint32_t key)
{
	mp_keylist_remove(pol->priv, key);
}

int64_t mp_policy_lru_victim(struct mp_policy *pol, mp_policy_evictable_fn evictable, void *arg)
{
	return mp_keylist_victim(pol->priv, evictable, arg);
}

void mp_policy_lru_fini(struct mp_policy *pol)
{
	if (pol->priv)
		mp_keylist_fini(pol->priv);
	free(pol->priv);
	pol->priv = NULL;
}

const struct mp_policy_ops mp_policy_lru = {
	.name = "lru",
	.description = "least recently used (routing reports and faults count as uses)",
	.init = mp_policy_lru_init,
	.on_insert = mp_policy_lru_insert,
	.on_access = mp_policy_lru_access,
	.on_fault = mp_policy_lru_access,
	.on_remove = mp_policy_lru_remove,
	.pick_victim = mp_policy_lru_victim,
	.fini = mp_policy_lru_fini,
};

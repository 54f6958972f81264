// SPDX-License-Identifier: MIT
/* FIFO eviction: the expert that entered host memory first goes first, whatever its use. */
#include <errno.h>
#include <stdlib.h>

#include "policy.h"

static int fifo_init(struct mp_policy *pol)
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

static void fifo_insert(struct mp_policy *pol, uint32_t key)
{
	mp_keylist_push_head(pol->priv, key);
}

static void fifo_remove(struct mp_policy *pol, uint32_t key)
{
	mp_keylist_remove(pol->priv, key);
}

static int64_t fifo_victim(struct mp_policy *pol, mp_policy_evictable_fn evictable, void *arg)
{
	return mp_keylist_victim(pol->priv, evictable, arg);
}

static void fifo_fini(struct mp_policy *pol)
{
	if (pol->priv)
		mp_keylist_fini(pol->priv);
	free(pol->priv);
	pol->priv = NULL;
}

const struct mp_policy_ops mp_policy_fifo = {
	.name = "fifo",
	.description = "first in, first out (insertion order; uses do not count)",
	.init = fifo_init,
	.on_insert = fifo_insert,
	.on_remove = fifo_remove,
	.pick_victim = fifo_victim,
	.fini = fifo_fini,
};

// SPDX-License-Identifier: MIT
/* Recording this process's trajectory during some of `moepager run`'s repetitions. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "run_record.h"

static int count_record(const struct mp_traj_rec *r, void *arg)
{
	(void)r;
	(void)arg;
	return 0;
}

/* Drains the ring as a recorder would, so its cost is part of what is measured. */
static void *poll_main(void *arg)
{
	struct run_record *rr = arg;

	while (!atomic_load(&rr->stop)) {
		int n = mp_traj_poll(rr->traj, 100, count_record, NULL);

		if (n < 0 && n != -EINTR)
			break;
	}
	return NULL;
}

int run_record_begin(struct run_record *rr)
{
	struct mp_traj_opts opts = { .source = MP_TRAJ_SRC_BPF, .pin = true };
	int err;

	err = mp_traj_open(&opts, &rr->traj);
	if (!err)
		err = mp_traj_start(rr->traj);
	if (err)
		goto fail;
	rr->source = mp_traj_source(rr->traj);
	atomic_store(&rr->stop, false);
	err = -pthread_create(&rr->poller, NULL, poll_main, rr);
	if (err)
		goto fail;
	rr->polling = true;
	return 0;
fail:
	cli_error(0, "recording the trajectory: %s", strerror(-err));
	mp_traj_close(rr->traj);
	rr->traj = NULL;
	return err;
}

void run_record_end(struct run_record *rr)
{
	struct mp_traj_stats st;

	if (!rr->traj)
		return;
	atomic_store(&rr->stop, true);
	if (rr->polling)
		pthread_join(rr->poller, NULL);
	rr->polling = false;
	mp_traj_stop(rr->traj);
	mp_traj_poll(rr->traj, 0, count_record, NULL);
	if (!mp_traj_stats(rr->traj, &st)) {
		rr->records += st.records;
		rr->dropped += st.dropped;
	}
	mp_traj_close(rr->traj);
	rr->traj = NULL;
}

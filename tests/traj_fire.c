// SPDX-License-Identifier: MIT
/*
 * Fires the moepager:route probe inside libmoepager.so for every row of a
 * moe-trace v1 file, as the runner will: the BPF tests record it and
 * compare with the file. Links the shared library, like an engine does.
 *
 * usage: traj_fire TRACE [--wait] [--token-us N] [--repeat N]
 *   --wait        read one byte from stdin first (the tracer attaches meanwhile)
 *   --token-us N  sleep N microseconds after each token (decode pace)
 *   --repeat N    replay the whole trace N times, request ids offset by requests
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <moepager.h>

int main(int argc, char **argv)
{
	unsigned long token_us = 0, repeat = 1;
	unsigned long long fired = 0;
	struct mp_trace *t;
	bool wait = false;
	char c;
	int err;

	if (argc < 2) {
		fprintf(stderr, "usage: traj_fire TRACE [--wait] [--token-us N] [--repeat N]\n");
		return 2;
	}
	for (int i = 2; i < argc; i++) {
		if (!strcmp(argv[i], "--wait"))
			wait = true;
		else if (!strcmp(argv[i], "--token-us") && i + 1 < argc)
			token_us = strtoul(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
			repeat = strtoul(argv[++i], NULL, 10);
		else {
			fprintf(stderr, "traj_fire: unknown argument %s\n", argv[i]);
			return 2;
		}
	}
	err = mp_trace_open(argv[1], &t);
	if (err) {
		fprintf(stderr, "traj_fire: %s\n", mp_last_error());
		return 1;
	}
	if (wait && read(0, &c, 1) != 1) {
		fprintf(stderr, "traj_fire: no go byte on stdin\n");
		mp_trace_close(t);
		return 1;
	}
	for (unsigned long rep = 0; rep < repeat; rep++) {
		uint32_t base = (uint32_t)(rep * mp_trace_requests(t));

		for (uint32_t r = 0; r < mp_trace_requests(t); r++) {
			for (uint32_t tok = 0; tok < mp_trace_tokens(t, r); tok++) {
				for (uint32_t l = 0; l < mp_trace_layers(t); l++) {
					const uint32_t *ids;
					const float *w;

					err = mp_trace_route(t, r, tok, l, &ids, &w);
					if (!err)
						err = mp_traj_route(NULL, base + r, tok, l,
								    mp_trace_topk(t), ids, w);
					if (err) {
						fprintf(stderr, "traj_fire: %s\n", mp_last_error());
						mp_trace_close(t);
						return 1;
					}
					fired++;
				}
				if (token_us) {
					struct timespec ts = { (time_t)(token_us / 1000000),
							       (long)(token_us % 1000000) * 1000 };

					nanosleep(&ts, NULL);
				}
			}
		}
	}
	fprintf(stderr, "traj_fire: %llu routes\n", fired);
	mp_trace_close(t);
	return 0;
}

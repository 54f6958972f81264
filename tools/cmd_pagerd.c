// SPDX-License-Identifier: MIT
/* moepager pagerd: the pager daemon, one host tier shared by every engine process attached. */
#include <argp.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>
#include <moepager.h>

#include "cli.h"

static struct pagerd_env {
	const char *model;
	const char *socket;
	const char *budget;
	const char *set_budget;
	int set_node;			/* -1: none */
	uint32_t max_clients;
	uint32_t pages;
	bool json;
} env;

enum { OPT_SOCKET = 0x100, OPT_BUDGET, OPT_SET_BUDGET, OPT_MAX_CLIENTS, OPT_PAGES, OPT_JSON,
	OPT_SET_NODE };

static const char doc[] =
	"Hold a model's experts in one memfd (the host tier) under one budget and serve\n"
	"every engine process that attaches on --socket (moepager run --attach SOCKET,\n"
	"mp_attach_open()): the daemon maps experts into the engines with\n"
	"UFFDIO_CONTINUE, reads missing ones from the model file once for all of them,\n"
	"and evicts by punching holes in the memfd. It also reads the model's dense\n"
	"weights once at start (checksums checked) into a sealed memfd the engines map\n"
	"read-only: they copy and read none. Engines of another moepager version\n"
	"or of another model are refused with a message. Runs until SIGINT or SIGTERM;\n"
	"prints \"ready SOCKET\" once engines can attach (with --json, stdout holds only\n"
	"the JSON: wait for the socket instead).\n"
	"\n"
	"--set-budget SIZE changes a running daemon's budget instead (it evicts down to a\n"
	"smaller one before answering) and prints its counters.\n"
	"\n"
	"--set-node N moves a running daemon's host tier to NUMA node N instead: its\n"
	"memfds' pages migrate in place (mbind MPOL_MF_MOVE_ALL; pages engines map need\n"
	"CAP_SYS_NICE), every mapping follows, nothing is copied or remapped, later fills\n"
	"land there; it prints how many resident pages are on N. A node that does not\n"
	"exist is refused.\n"
	"\n"
	"--json prints the daemon's counters as one object at exit: budget_bytes,\n"
	"dense_bytes, resident_bytes, resident_peak_bytes, memfd_bytes, disk_bytes_read, fills,\n"
	"evictions, faults, continues, fill_failures, clients_total, refused, dropped.\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager pagerd --model mixtral-mini.mpk --socket /tmp/mp.sock --budget 50% &\n"
	"  moepager run --model mixtral-mini.mpk --attach /tmp/mp.sock --tokens 16\n"
	"  moepager pagerd --model mixtral-mini.mpk --socket /tmp/mp.sock --set-budget 25%\n";

static const struct argp_option opts[] = {
	{ "model", 'm', "FILE", 0, "The .mpk model (required)", 0 },
	{ "socket", OPT_SOCKET, "PATH", 0, "UNIX socket engines attach to (required)", 0 },
	{ "budget", OPT_BUDGET, "SIZE", 0,
	  "Expert memory across every process (\"8G\", \"40%\"; default half of RAM)", 0 },
	{ "set-budget", OPT_SET_BUDGET, "SIZE", 0,
	  "Change the budget of the daemon running on --socket, then exit", 0 },
	{ "set-node", OPT_SET_NODE, "N", 0,
	  "Move the host tier of the daemon running on --socket to NUMA node N, then exit", 0 },
	{ "max-clients", OPT_MAX_CLIENTS, "N", 0, "Engines attached at once (default 64)", 0 },
	{ "pages", OPT_PAGES, "KIND", 0,
	  "small (4 KiB shmem, the default), thp (shmem asked for THP; the kernel's\n"
	  "shmem_enabled decides) or hugetlb (2 MiB MFD_HUGETLB pages; vm.nr_hugepages must\n"
	  "hold the budget's experts, each rounded up to whole pages)", 0 },
	{ "json", OPT_JSON, NULL, 0, "Print the counters as one JSON object at exit", 0 },
	{ 0 },
};

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	uint32_t node;
	int pages;

	switch (key) {
	case 'm':
		env.model = arg;
		break;
	case OPT_SOCKET:
		env.socket = arg;
		break;
	case OPT_BUDGET:
		env.budget = arg;
		break;
	case OPT_SET_NODE:
		cli_opt_u32(state, "--set-node", arg, 0, 1023, &node);
		env.set_node = (int)node;
		break;
	case OPT_SET_BUDGET:
		env.set_budget = arg;
		break;
	case OPT_MAX_CLIENTS:
		cli_opt_u32(state, "--max-clients", arg, 1, 1024, &env.max_clients);
		break;
	case OPT_PAGES:
		cli_opt_pages(state, "--pages", arg, &pages);
		env.pages = pages;
		break;
	case OPT_JSON:
		env.json = true;
		break;
	case ARGP_KEY_ARG:
		argp_error(state, "unexpected argument '%s'", arg);
		break;
	case ARGP_KEY_END:
		if (!env.model || !env.socket)
			argp_error(state, "--model FILE and --socket PATH are required");
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

static struct mp_pagerd *running;

static void on_signal(int sig)
{
	(void)sig;
	if (running)
		mp_pagerd_stop(running);
}

static void print_stats(const struct mp_pagerd_stats *s)
{
	const struct mp_pagerd_stats st = *s;
	json_t *o;

	o = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
		      "budget_bytes", (json_int_t)st.budget_bytes,
		      "dense_bytes", (json_int_t)st.dense_bytes,
		      "resident_bytes", (json_int_t)st.resident_bytes,
		      "resident_peak_bytes", (json_int_t)st.resident_peak_bytes,
		      "memfd_bytes", (json_int_t)st.memfd_bytes,
		      "disk_bytes_read", (json_int_t)st.disk_bytes_read,
		      "fills", (json_int_t)st.fills, "evictions", (json_int_t)st.evictions,
		      "faults", (json_int_t)st.faults, "continues", (json_int_t)st.continues,
		      "fill_failures", (json_int_t)st.fill_failures,
		      "clients_total", (json_int_t)st.clients_total,
		      "refused", (json_int_t)st.refused, "dropped", (json_int_t)st.dropped);
	if (o && !json_dumpf(o, stdout, JSON_INDENT(2)))
		putchar('\n');
	json_decref(o);
}

/* --set-budget: attach to the running daemon, ask, and print what it reports after. */
static int set_budget(struct mp_store *s)
{
	struct mp_pagerd_stats st;
	struct mp_attach *a;
	uint64_t bytes;
	int err;

	err = mp_budget_parse(env.set_budget, mp_store_total_expert_bytes(s), &bytes);
	if (!err)
		err = mp_attach_open(s, env.socket, &a);
	if (err)
		return err;
	err = mp_attach_set_budget(a, bytes);
	if (!err)
		err = mp_attach_daemon_stats(a, &st);
	mp_attach_close(a);
	if (err)
		return err;
	if (env.json)
		print_stats(&st);
	else
		printf("pagerd %s: budget %llu bytes, %llu resident\n", env.socket,
		       (unsigned long long)st.budget_bytes, (unsigned long long)st.resident_bytes);
	return 0;
}

/* --set-node: attach to the running daemon, ask it to move the host tier, print its account. */
static int set_node(struct mp_store *s)
{
	char msg[256];
	struct mp_attach *a;
	int err = mp_attach_open(s, env.socket, &a);

	if (err)
		return err;
	err = mp_attach_set_node(a, env.set_node, msg, sizeof(msg));
	mp_attach_close(a);
	if (!err)
		printf("pagerd %s: %s\n", env.socket, msg);
	return err;
}

int cmd_pagerd(int argc, char **argv)
{
	static const struct argp argp = { opts, parse_arg, NULL, doc, NULL, NULL, NULL };
	struct mp_pagerd_config cfg = { 0 };
	struct sigaction sa = { .sa_handler = on_signal };
	struct mp_pagerd *d;
	struct mp_store *s;
	int err;

	memset(&env, 0, sizeof(env));
	env.set_node = -1;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	err = mp_store_open(env.model, &s);
	if (err)
		return cli_fail(err, "%s", env.model);
	if (env.set_node >= 0) {
		err = set_node(s);
		mp_store_close(s);
		return err;
	}
	if (env.set_budget) {
		err = set_budget(s);
		mp_store_close(s);
		return err;
	}
	cfg.socket_path = env.socket;
	cfg.budget = env.budget;
	cfg.max_clients = env.max_clients;
	cfg.pages = env.pages;
	err = mp_pagerd_open(s, &cfg, &d);
	if (err) {
		cli_fail(err, "%s", env.socket);
		mp_store_close(s);
		return err;
	}
	running = d;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (!env.json) {
		printf("ready %s\n", env.socket);
		fflush(stdout);
	}
	err = mp_pagerd_run(d);
	if (env.json) {
		struct mp_pagerd_stats st;

		mp_pagerd_stats(d, &st);
		print_stats(&st);
	}
	running = NULL;
	mp_pagerd_close(d);
	mp_store_close(s);
	return err;
}

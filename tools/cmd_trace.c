// SPDX-License-Identifier: MIT
/* moepager trace: records a process's expert trajectory through BPF, exports it as moe-trace v1. */
#include <argp.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/param.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <moepager.h>

#include "cli.h"

/* How often the --top heatmap is redrawn. */
#define TOP_REFRESH_NS	500000000ull
/* The shading of a heatmap cell, from no use to the row's busiest expert. */
static const char ramp[] = " .:-=+*#%@";

static struct trace_env {
	int pid;
	char **cmd;			/* after --: the command to start and record */
	const char *out;
	const char *export_path;
	const char *lib;
	struct mp_traj_range range;
	uint32_t layers, experts;
	uint64_t duration_ms;
	bool keep, top, json;
} env;

static volatile sig_atomic_t exiting;

static const char doc[] =
	"Record which experts each token of a moepager process uses: attach BPF to the\n"
	"process's moepager USDT probes (docs/probes.md) and to its page faults in the\n"
	"expert ranges of its pagers, and write a trajectory file (docs/trajectory-format.md).\n"
	"The ranges are found without help: those open when recording starts are read from\n"
	"the process's libmoepager (its mp_pager_ranges list), those opened later arrive\n"
	"through the moepager:region probe. --range names one range explicitly instead (a\n"
	"range moepager does not publish); then only that range is attributed.\n"
	"Recording stops when the process exits, on Ctrl-C, or after --duration. While\n"
	"recording, the count maps are pinned in /sys/fs/bpf/moepager/PID/ (bpftool map dump\n"
	"pinned ...); they are removed at the end unless --keep. Needs root (or CAP_BPF and\n"
	"CAP_PERFMON).\n"
	"\n"
	"--export FILE prints a trajectory file's routes as moe-trace v1 on stdout.\n"
	"--json prints one object on stdout (a started command's stdout goes to stderr):\n"
	"{\"pid\", \"source\", \"out\", \"records\", \"routes\", \"page_faults\", \"faults\",\n"
	"\"caller_faults\", \"prefetches\", \"evictions\", \"dropped\", \"bad_args\",\n"
	"\"probes_attached\", \"pgfault\", \"pin_dir\", \"seconds\", \"exit_status\"}.\n"
	"page_faults counts the user page faults in expert ranges; faults the pager's demand\n"
	"faults (fault_done), of which caller_faults had no page fault before them: the\n"
	"pager resolves experts below 2 MiB on the thread that asks for them, so the engine\n"
	"never faults on them (MOEPAGER_RESOLVE=fault makes it; docs/region.md).\n"
	"\n"
	"EXAMPLES:\n"
	"  moepager trace --out run.mptraj -- moepager run --model m.mpk --trace t.csv\n"
	"  moepager trace --pid 4242 --top\n"
	"  moepager trace --pid 4242 --range 0x7f0000000000,2M,8,32 --duration 10\n"
	"  moepager trace --export run.mptraj > run.csv\n";

enum {
	OPT_RANGE = 0x100,
	OPT_LIB,
	OPT_LAYERS,
	OPT_EXPERTS,
	OPT_DURATION,
	OPT_EXPORT,
};

static const struct argp_option opts[] = {
	{ "pid", 'p', "PID", 0, "Record this running process", 0 },
	{ "out", 'o', "FILE", 0, "Trajectory file to write (default moepager-PID.mptraj)", 0 },
	{ "keep", 'k', NULL, 0, "Leave the pinned maps in place after recording", 0 },
	{ "top", 't', NULL, 0, "Show a live per-layer expert heatmap on the terminal", 0 },
	{ "range", OPT_RANGE, "BASE,SLOT,SLOTS,LAYERS", 0,
	  "Attribute page faults in this range only (default: the ranges the process's "
	  "pagers open): base address, slot bytes (2M ok), slots per layer, layers", 0 },
	{ "lib", OPT_LIB, "PATH", 0, "File with the probes (default: the target's "
	  "libmoepager.so; with a command, the one this tool uses)", 0 },
	{ "layers", OPT_LAYERS, "N", 0, "Model layers, recorded in the file", 0 },
	{ "experts", OPT_EXPERTS, "N", 0, "Experts per layer (file metadata, export)", 0 },
	{ "duration", OPT_DURATION, "SEC", 0, "Stop after SEC seconds", 0 },
	{ "export", OPT_EXPORT, "FILE", 0, "Print FILE's routes as moe-trace v1 and exit", 0 },
	{ "json", 'j', NULL, 0, "Print a JSON summary on stdout", 0 },
	{ 0 },
};

static int parse_range(const char *s)
{
	char buf[256], *parts[4], *save = NULL;
	int n = 0;

	snprintf(buf, sizeof(buf), "%s", s);
	for (char *p = strtok_r(buf, ",", &save); p && n < 4; p = strtok_r(NULL, ",", &save))
		parts[n++] = p;
	if (n != 4 || strtok_r(NULL, ",", &save))
		return cli_error(-EINVAL, "--range wants BASE,SLOT,SLOTS,LAYERS, got '%s'", s);
	if (cli_parse_u64("--range base", parts[0], 0, UINT64_MAX, &env.range.base) ||
	    cli_parse_size("--range slot", parts[1], &env.range.slot_bytes) ||
	    cli_parse_u32("--range slots", parts[2], 1, 1u << 20, &env.range.slots_per_layer) ||
	    cli_parse_u32("--range layers", parts[3], 1, 1024, &env.range.layers))
		return -EINVAL;
	if (!env.range.slot_bytes)
		return cli_error(-EINVAL, "--range slot bytes must not be 0");
	return 0;
}

static error_t parse_arg(int key, char *arg, struct argp_state *state)
{
	uint32_t v;
	uint64_t d;

	switch (key) {
	case 'p':
		cli_opt_u32(state, "--pid", arg, 1, INT32_MAX, &v);
		env.pid = (int)v;
		break;
	case 'o':
		env.out = arg;
		break;
	case 'k':
		env.keep = true;
		break;
	case 't':
		env.top = true;
		break;
	case 'j':
		env.json = true;
		break;
	case OPT_RANGE:
		if (parse_range(arg))
			cli_usage_error(state);
		break;
	case OPT_LIB:
		env.lib = arg;
		break;
	case OPT_LAYERS:
		cli_opt_u32(state, "--layers", arg, 1, 1024, &env.layers);
		break;
	case OPT_EXPERTS:
		cli_opt_u32(state, "--experts", arg, 1, 4096, &env.experts);
		break;
	case OPT_DURATION:
		cli_opt_u64(state, "--duration", arg, 1, 86400 * 365, &d);
		env.duration_ms = d * 1000;
		break;
	case OPT_EXPORT:
		env.export_path = arg;
		break;
	case ARGP_KEY_ARGS:
		env.cmd = state->argv + state->next;
		break;
	case ARGP_KEY_END:
		if (env.export_path) {
			if (env.pid || env.cmd || env.top || env.keep || env.out)
				argp_error(state, "--export takes no recording options");
		} else if (!!env.pid == !!env.cmd) {
			argp_error(state, "give either --pid PID or -- COMMAND ARGS...");
		}
		break;
	default:
		return ARGP_ERR_UNKNOWN;
	}
	return 0;
}

static void on_signal(int sig)
{
	(void)sig;
	exiting = 1;
}

struct recorder {
	struct mp_traj_writer *w;
	int err;			/* first write error */
	uint64_t kinds[MP_TRAJ_PREFILL + 1];
	/*
	 * Demand faults with no page fault on their expert since its last one
	 * (or eviction): resolved on the asking thread. One bit per (layer,
	 * expert), set by a page fault, cleared by a fault_begin or an evict.
	 */
	uint64_t caller_faults;
	uint8_t *faulted;
	/* --top: uses of (layer, expert) by routes and page faults, grown as ids appear. */
	uint64_t *heat;
	uint32_t heat_layers, heat_experts;
};

static int heat_grow(struct recorder *rc, uint32_t layer, uint32_t expert)
{
	uint32_t nl = MAX(rc->heat_layers, layer + 1), ne = MAX(rc->heat_experts, expert + 1);
	uint64_t *h;

	if (nl == rc->heat_layers && ne == rc->heat_experts)
		return 0;
	if (nl > MP_MAX_LAYERS || ne > MP_MAX_EXPERTS)
		return -ERANGE;
	h = calloc((size_t)nl * ne, sizeof(*h));
	if (!h)
		return -ENOMEM;
	for (uint32_t l = 0; l < rc->heat_layers; l++)
		memcpy(h + (size_t)l * ne, rc->heat + (size_t)l * rc->heat_experts,
		       rc->heat_experts * sizeof(*h));
	free(rc->heat);
	rc->heat = h;
	rc->heat_layers = nl;
	rc->heat_experts = ne;
	return 0;
}

static void heat_add(struct recorder *rc, uint32_t layer, uint32_t expert)
{
	if (!heat_grow(rc, layer, expert))
		rc->heat[(size_t)layer * rc->heat_experts + expert]++;
}

/* Counts a fault_begin that no page fault of its expert came before (struct recorder). */
static void note_caller_fault(struct recorder *rc, const struct mp_traj_rec *r)
{
	size_t bit = (size_t)r->layer * MP_MAX_EXPERTS + r->expert;
	uint8_t mask = (uint8_t)(1u << (bit % 8));

	if (r->layer >= MP_MAX_LAYERS || r->expert >= MP_MAX_EXPERTS || !rc->faulted)
		return;
	switch (r->kind) {
	case MP_TRAJ_PGFAULT:
		rc->faulted[bit / 8] |= mask;
		break;
	case MP_TRAJ_FAULT_BEGIN:
		rc->caller_faults += !(rc->faulted[bit / 8] & mask);
		/* fall through */
	case MP_TRAJ_EVICT:
		rc->faulted[bit / 8] &= (uint8_t)~mask;
		break;
	default:
		break;
	}
}

static int on_record(const struct mp_traj_rec *r, void *arg)
{
	struct recorder *rc = arg;
	int err;

	if (r->kind <= MP_TRAJ_PREFILL)
		rc->kinds[r->kind]++;
	note_caller_fault(rc, r);
	if (env.top && r->kind == MP_TRAJ_ROUTE)
		for (uint32_t i = 0; i < r->k; i++)
			heat_add(rc, r->layer, r->ids[i]);
	else if (env.top && r->kind == MP_TRAJ_PGFAULT)
		heat_add(rc, r->layer, r->expert);
	err = mp_traj_writer_put(rc->w, r);
	if (err && !rc->err)
		rc->err = err;
	return 0;	/* keep draining: the write error is reported at the end */
}

/* One row per layer, one cell per expert (or per group of experts on a narrow terminal). */
static void draw_top(const struct recorder *rc, const struct mp_traj *t, uint64_t elapsed_ns)
{
	struct mp_traj_stats st;
	struct winsize ws;
	uint32_t cols = 80, rows = 24, per, width;

	if (!ioctl(2, TIOCGWINSZ, &ws) && ws.ws_col > 20) {
		cols = ws.ws_col;
		rows = ws.ws_row;
	}
	mp_traj_stats(t, &st);
	/* Room for cols - 16 cells: several characters per expert, or experts per character. */
	per = rc->heat_experts ? (rc->heat_experts + cols - 17) / (cols - 16) : 1;
	width = per == 1 && rc->heat_experts ? MIN(4u, (cols - 16) / rc->heat_experts) : 1;
	fprintf(stderr, "\033[H\033[2J");
	cli_say("pid %d, %.1f s, %" PRIu64 " routes, %" PRIu64
		" page faults, %" PRIu64 " dropped", env.pid, (double)elapsed_ns / 1e9,
		rc->kinds[MP_TRAJ_ROUTE], rc->kinds[MP_TRAJ_PGFAULT], st.dropped);
	fprintf(stderr, "layer  experts 0..%u%s, shade = uses / busiest expert of the layer\n",
		rc->heat_experts ? rc->heat_experts - 1 : 0,
		per > 1 ? " (grouped)" : "");
	for (uint32_t l = 0; l < rc->heat_layers && l + 4 < rows; l++) {
		const uint64_t *row = rc->heat + (size_t)l * rc->heat_experts;
		uint64_t max = 0, sum = 0, cell;

		for (uint32_t e = 0; e < rc->heat_experts; e += per) {
			cell = 0;
			for (uint32_t i = e; i < MIN(e + per, rc->heat_experts); i++)
				cell += row[i];
			max = MAX(max, cell);
			sum += cell;
		}
		fprintf(stderr, "%5u |", l);
		for (uint32_t e = 0; e < rc->heat_experts; e += per) {
			cell = 0;
			for (uint32_t i = e; i < MIN(e + per, rc->heat_experts); i++)
				cell += row[i];
			for (uint32_t c = 0; c < width; c++)
				fputc(max ? ramp[cell * (sizeof(ramp) - 2) / max] : ' ', stderr);
		}
		fprintf(stderr, "| %" PRIu64 "\n", sum);
	}
	fflush(stderr);
}

static int pidfd_open_(int pid)
{
	return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* The libmoepager.so this tool runs with: a started command will load the same one. */
static const char *own_library(void)
{
	static char path[4096];
	Dl_info info;

	if (!dladdr((void *)mp_traj_open, &info) || !info.dli_fname)
		return NULL;
	snprintf(path, sizeof(path), "%s", info.dli_fname);
	return path;
}

/* Forks the command, blocked until *go_fd is written or closed; exec errors come back on err_fd. */
static int start_command(int *go_fd, int *err_fd)
{
	int go[2], ep[2];
	pid_t pid;

	if (pipe2(go, O_CLOEXEC) || pipe2(ep, O_CLOEXEC))
		return cli_error(-errno, "pipe: %s", strerror(errno));
	pid = fork();
	if (pid < 0)
		return cli_error(-errno, "fork: %s", strerror(errno));
	if (!pid) {
		char c;
		int e;

		close(go[1]);
		close(ep[0]);
		if (read(go[0], &c, 1) != 1)
			_exit(127);	/* the tracer gave up */
		/* --json: stdout is the summary object alone; the command's goes to stderr. */
		if (env.json && dup2(STDERR_FILENO, STDOUT_FILENO) < 0)
			_exit(127);
		execvp(env.cmd[0], env.cmd);
		e = errno;
		if (write(ep[1], &e, sizeof(e)) < 0)
			_exit(127);
		_exit(127);
	}
	close(go[0]);
	close(ep[1]);
	*go_fd = go[1];
	*err_fd = ep[0];
	return pid;
}

static int print_json(const struct recorder *rc, const struct mp_traj_stats *st,
		      const char *pin_dir, double seconds, int exit_status)
{
	json_t *o = json_pack("{s:i, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i, "
			      "s:b, s:o, s:f, s:o}",
			      "pid", env.pid, "source", "bpf", "out", env.out,
			      "records", (json_int_t)st->records,
			      "routes", (json_int_t)rc->kinds[MP_TRAJ_ROUTE],
			      "page_faults", (json_int_t)rc->kinds[MP_TRAJ_PGFAULT],
			      "faults", (json_int_t)rc->kinds[MP_TRAJ_FAULT_DONE],
			      "caller_faults", (json_int_t)rc->caller_faults,
			      "prefetches", (json_int_t)rc->kinds[MP_TRAJ_PREFETCH_DONE],
			      "evictions", (json_int_t)rc->kinds[MP_TRAJ_EVICT],
			      "dropped", (json_int_t)st->dropped,
			      "bad_args", (json_int_t)st->bad_args,
			      "probes_attached", (int)st->probes_attached,
			      "pgfault", st->pgfault_attached,
			      "pin_dir", pin_dir ? json_string(pin_dir) : json_null(),
			      "seconds", seconds,
			      "exit_status",
			      exit_status >= 0 ? json_integer(exit_status) : json_null());

	if (!o)
		return -ENOMEM;
	json_dumpf(o, stdout, JSON_INDENT(2));
	putchar('\n');
	json_decref(o);
	return 0;
}

static int record(void)
{
	struct mp_traj_opts o = { .source = MP_TRAJ_SRC_BPF, .pin = true };
	struct mp_traj_file_info info = { .source = MP_TRAJ_SRC_BPF };
	struct sigaction sa = { .sa_handler = on_signal };
	struct recorder rc = { 0 };
	char out_buf[64], pin_dir[4096] = "";
	int err, go_fd = -1, err_fd = -1, pidfd = -1, exit_status = -1, exec_errno = 0;
	uint64_t start, last_draw = 0;
	struct mp_traj_stats st, attached = { 0 };
	struct mp_traj *t = NULL;
	pid_t child = 0;

	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	rc.faulted = calloc((size_t)MP_MAX_LAYERS * MP_MAX_EXPERTS / 8, 1);
	if (!rc.faulted)
		return cli_fail(-ENOMEM, NULL);
	if (env.top && !isatty(2)) {
		err = cli_error(-ENOTTY, "--top draws on a terminal; stderr is not one");
		goto cleanup;
	}
	if (env.cmd) {
		err = start_command(&go_fd, &err_fd);
		if (err < 0)
			goto cleanup;
		child = env.pid = err;
	}
	if (!env.out) {
		snprintf(out_buf, sizeof(out_buf), "moepager-%d.mptraj", env.pid);
		env.out = out_buf;
	}
	o.pid = env.pid;
	o.binary = env.lib ? env.lib : env.cmd ? own_library() : NULL;
	o.range = env.range;
	/* Without an explicit range, the pagers' own ranges (open now or later) are attributed. */
	o.pager_ranges = !env.range.slot_bytes;
	o.keep_pins = env.keep;
	err = mp_traj_open(&o, &t);
	if (err) {
		cli_fail(err, NULL);
		goto cleanup;
	}
	info.pid = (uint32_t)env.pid;
	info.range = env.range;
	info.layers = env.layers ? env.layers : env.range.layers;
	info.experts = env.experts ? env.experts : env.range.slots_per_layer;
	info.start_ns = cli_clock_ns(CLOCK_MONOTONIC);
	info.start_unix_ns = cli_clock_ns(CLOCK_REALTIME);
	err = mp_traj_writer_create(env.out, &info, &rc.w);
	if (err) {
		cli_fail(err, NULL);
		goto cleanup;
	}
	err = mp_traj_start(t);
	if (err) {
		cli_fail(err, NULL);
		goto cleanup;
	}
	if (mp_traj_pin_dir(t))
		snprintf(pin_dir, sizeof(pin_dir), "%s", mp_traj_pin_dir(t));
	mp_traj_stats(t, &attached);	/* stop detaches: keep what start attached */
	pidfd = pidfd_open_(env.pid);
	if (pidfd < 0) {
		err = cli_error(-errno, "pidfd_open(%d): %s", env.pid, strerror(errno));
		goto cleanup;
	}
	if (child) {
		/* Probes are attached: let the command run. */
		if (write(go_fd, "g", 1) != 1) {
			err = cli_error(-errno, "starting the command: %s", strerror(errno));
			goto cleanup;
		}
		close(go_fd);
		go_fd = -1;
		if (read(err_fd, &exec_errno, sizeof(exec_errno)) == sizeof(exec_errno)) {
			err = cli_error(-exec_errno, "cannot run %s: %s", env.cmd[0],
					strerror(exec_errno));
			goto cleanup;
		}
	}
	if (!env.top && !env.json)
		cli_say("recording pid %d into %s%s%s (Ctrl-C stops)",
			env.pid, env.out, pin_dir[0] ? ", maps pinned in " : "", pin_dir);

	start = cli_clock_ns(CLOCK_MONOTONIC);
	while (!exiting) {
		struct pollfd pfd = { .fd = pidfd, .events = POLLIN };
		uint64_t now;

		err = mp_traj_poll(t, 100, on_record, &rc);
		if (err == -EINTR)
			break;
		if (err < 0) {
			cli_fail(err, NULL);
			goto cleanup;
		}
		now = cli_clock_ns(CLOCK_MONOTONIC);
		if (env.top && now - last_draw >= TOP_REFRESH_NS) {
			draw_top(&rc, t, now - start);
			last_draw = now;
		}
		if (env.duration_ms && now - start >= env.duration_ms * 1000000ull)
			break;
		if (poll(&pfd, 1, 0) == 1)
			break;	/* the process exited */
	}
	err = mp_traj_stop(t);
	/* What the ring still holds belongs to the recording. */
	while ((err = mp_traj_poll(t, 0, on_record, &rc)) > 0)
		;
	if (err < 0 && err != -EINTR) {
		cli_fail(err, NULL);
		goto cleanup;
	}
	if (env.top)
		draw_top(&rc, t, cli_clock_ns(CLOCK_MONOTONIC) - start);
	mp_traj_stats(t, &st);
	st.probes_attached = attached.probes_attached;
	st.pgfault_attached = attached.pgfault_attached;
	mp_traj_writer_set_dropped(rc.w, st.dropped);
	err = rc.err;
	if (err) {
		cli_fail(err, NULL);
		goto cleanup;
	}
	err = mp_traj_writer_finish(rc.w);
	rc.w = NULL;
	if (err) {
		cli_fail(err, NULL);
		goto cleanup;
	}
	if (child) {
		int ws;

		if (exiting)
			kill(child, SIGTERM);	/* recording was stopped: so is the command */
		if (waitpid(child, &ws, 0) == child)
			exit_status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
		child = 0;
	}
	if (env.json) {
		err = print_json(&rc, &st, env.keep && pin_dir[0] ? pin_dir : NULL,
				 (double)(cli_clock_ns(CLOCK_MONOTONIC) - start) / 1e9, exit_status);
	} else {
		cli_say("%" PRIu64 " records (%" PRIu64 " routes, %" PRIu64
			" page faults, %" PRIu64 " faults served (%" PRIu64 " on the asking "
			"thread, without a page fault), %" PRIu64 " prefetches, %" PRIu64
			" evictions), %" PRIu64 " dropped -> %s", st.records,
			rc.kinds[MP_TRAJ_ROUTE], rc.kinds[MP_TRAJ_PGFAULT],
			rc.kinds[MP_TRAJ_FAULT_DONE], rc.caller_faults,
			rc.kinds[MP_TRAJ_PREFETCH_DONE],
			rc.kinds[MP_TRAJ_EVICT], st.dropped, env.out);
		if (env.keep && pin_dir[0])
			cli_say("maps kept in %s", pin_dir);
	}
	if (st.dropped)
		cli_say("warning: %" PRIu64 " records dropped (ring full); "
			"the pinned counts are still exact", st.dropped);
	if (!err && exit_status > 0)
		err = cli_error(-ECHILD, "%s exited with status %d", env.cmd[0], exit_status);

cleanup:
	mp_traj_writer_abort(rc.w);
	mp_traj_close(t);
	if (go_fd >= 0)
		close(go_fd);	/* a command never released exits without running */
	if (err_fd >= 0)
		close(err_fd);
	if (pidfd >= 0)
		close(pidfd);
	if (child > 0)
		waitpid(child, NULL, 0);
	free(rc.heat);
	free(rc.faulted);
	return err;
}

int cmd_trace(int argc, char **argv)
{
	static const struct argp argp = { opts, parse_arg, "[-- COMMAND ARGS...]", doc,
					  NULL, NULL, NULL };
	int64_t n;
	int err;

	memset(&env, 0, sizeof(env));
	exiting = 0;
	err = argp_parse(&argp, argc, argv, 0, NULL, NULL);
	if (err)
		return err;
	if (env.export_path) {
		n = mp_traj_export_moe_trace(env.export_path, env.experts, stdout);
		if (n < 0)
			return cli_fail((int)n, "%s", env.export_path);
		return 0;
	}
	return record();
}

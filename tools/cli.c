// SPDX-License-Identifier: MIT
/* Helpers the subcommands share: log handler, number parsing, progress line. */
#include <argp.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sysexits.h>
#include <string.h>
#include <time.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <moepager.h>

#include "cli.h"

/*
 * What the tool says about itself and the library's error lines it printed:
 * process-wide, as the library's log handler is (lines come from threads
 * the tool does not own), set once by the dispatcher before a command runs.
 */
static struct cli_log {
	const char *prog;		/* "moepager run" */
	bool debug;			/* MOEPAGER_DEBUG: every level */
	atomic_uint errors;		/* library error lines printed */
	atomic_uint reported;		/* errors when cli_fail() last ran */
} cli_log = { .prog = "moepager" };

static void log_to_stderr(enum mp_log_level level, const char *msg, void *arg)
{
	static const char *const tags[] = { "", "warning: ", "info: ", "debug: " };

	(void)arg;
	if (level > MP_LOG_WARN && !cli_log.debug)
		return;
	/* The library's message names what failed and where: it is the error line. */
	fprintf(stderr, "%s: %s%s\n", cli_log.prog, tags[level], msg);
	if (level == MP_LOG_ERROR)
		atomic_fetch_add(&cli_log.errors, 1);
}

void cli_install_log_handler(const char *prog)
{
	const char *d = getenv("MOEPAGER_DEBUG");

	cli_log.prog = prog;
	cli_log.debug = d && *d && *d != '0';
	mp_set_log_handler(log_to_stderr, NULL);
	/* log_to_stderr() drops the rest: not formatted for nothing on the fill path. */
	mp_set_log_level(cli_log.debug ? MP_LOG_DEBUG : MP_LOG_WARN);
}

const char *cli_prog(void)
{
	return cli_log.prog;
}

int cli_fail(int err, const char *fmt, ...)
{
	unsigned now = atomic_load(&cli_log.errors);
	va_list ap;

	/* An error line (the library's, or the tool's) since the last report said why. */
	if (atomic_exchange(&cli_log.reported, now) != now)
		return err;
	fprintf(stderr, "%s: ", cli_log.prog);
	if (fmt) {
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
		fprintf(stderr, ": ");
	}
	fprintf(stderr, "%s\n", strerror(err < 0 ? -err : err));
	/* Counted, so a caller's report of the same failure says nothing more. */
	atomic_fetch_add(&cli_log.errors, 1);
	return err;
}

/* "PROG: FMT...\n" in one piece, whichever threads say lines at the same time. */
static void say(const char *fmt, va_list ap)
{
	flockfile(stderr);
	fprintf(stderr, "%s: ", cli_log.prog);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	funlockfile(stderr);
}

int cli_resident_pack(struct mp_resident *r, struct mp_engine *e, uint32_t *runner_flags)
{
	int err = mp_resident_pack(r, e);

	*runner_flags |= MP_RUNNER_PACK_DENSE;
	return err == -EOPNOTSUPP ? 0 : err;
}

int cli_error(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	say(fmt, ap);
	va_end(ap);
	atomic_fetch_add(&cli_log.errors, 1);
	return err;
}

void cli_say(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	say(fmt, ap);
	va_end(ap);
}

void cli_usage_error(const struct argp_state *state)
{
	argp_state_help(state, stderr, ARGP_HELP_SEE | ARGP_HELP_EXIT_ERR);
	exit(EX_USAGE);	/* argp_state_help exits unless ARGP_NO_EXIT */
}

int cli_parse_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || end == s || *end || *s == '-' || v < lo || v > hi) {
		cli_error(0, "%s: '%s' is not a number in [%llu, %llu]", opt, s,
			  (unsigned long long)lo, (unsigned long long)hi);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

int cli_parse_u32(const char *opt, const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	uint64_t v;
	int err = cli_parse_u64(opt, s, lo, hi, &v);

	if (!err)
		*out = (uint32_t)v;
	return err;
}

pid_t cli_spawn_self(const char *const *args, int out_fd)
{
	return cli_spawn(NULL, args, out_fd);
}

pid_t cli_spawn(const char *exe, const char *const *args, int out_fd)
{
	const char *argv[32] = { "moepager" };
	pid_t parent = getpid(), pid;
	size_t n = 1;

	while (*args && n < 31)
		argv[n++] = *args++;
	if (*args)
		return -E2BIG;
	pid = fork();
	if (pid)
		return pid < 0 ? -errno : pid;
	/* Dies with the bench (killed by a test's timeout, say), checked once set. */
	if (prctl(PR_SET_PDEATHSIG, SIGTERM) || getppid() != parent)
		_exit(126);
	dup2(out_fd, STDOUT_FILENO);
	execv(exe ? exe : "/proc/self/exe", (char *const *)argv);
	_exit(127);
}

static int reap(pid_t pid, int *status)
{
	pid_t r;

	while ((r = waitpid(pid, status, 0)) < 0 && errno == EINTR)
		;
	return r == pid ? 0 : -errno;
}

int cli_serve_wait_port(pid_t pid, const char *port_file, unsigned timeout_ms, unsigned *port)
{
	const struct timespec ts = { 0, 2000000L };
	const uint64_t deadline = cli_now_ns() + (uint64_t)timeout_ms * 1000000ull;

	for (;;) {
		FILE *f = fopen(port_file, "re");
		int n = f ? fscanf(f, "%u", port) : 0;
		int status;

		if (f)
			fclose(f);
		if (n == 1)
			return 0;
		if (waitpid(pid, &status, WNOHANG) == pid)
			return cli_error(-ECHILD, "the server exited before listening");
		if (cli_now_ns() > deadline) {
			kill(pid, SIGKILL);
			reap(pid, &status);
			return cli_error(-ETIMEDOUT, "the server did not listen within %u ms",
					 timeout_ms);
		}
		nanosleep(&ts, NULL);
	}
}

int cli_child_stop(pid_t pid)
{
	int status = 0, err;

	if (kill(pid, SIGTERM))
		return -errno;
	err = reap(pid, &status);
	return err ? err : status;
}

int cli_parse_u32_list(const char *opt, const char *s, uint32_t lo, uint32_t hi,
		       uint32_t *out, uint32_t max, uint32_t *n)
{
	char *copy = strdup(s), *rest = copy, *t;
	int err = copy ? 0 : -ENOMEM;

	*n = 0;
	/* strsep, not strtok: an empty field ("1,,2") is an error, not skipped. */
	while (!err && (t = strsep(&rest, ",")))
		err = *n == max ? cli_error(-EINVAL, "%s %s: more than %u values", opt, s, max) :
		      cli_parse_u32(opt, t, lo, hi, &out[(*n)++]);
	free(copy);
	return err;
}

int cli_parse_double(const char *opt, const char *s, double lo, double hi, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !(v >= lo && v <= hi)) {
		cli_error(0, "%s: '%s' is not a number in [%g, %g]", opt, s, lo, hi);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

int cli_parse_size(const char *opt, const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	unsigned shift = 0;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s || *s == '-')
		goto bad;
	switch (*end) {
	case 'K': case 'k': shift = 10; end++; break;
	case 'M': case 'm': shift = 20; end++; break;
	case 'G': case 'g': shift = 30; end++; break;
	case 'T': case 't': shift = 40; end++; break;
	default: break;
	}
	if (*end == 'i' || *end == 'B')
		end++;
	if (*end == 'B')
		end++;
	if (*end || (shift && v > (~0ull >> shift)))
		goto bad;
	*out = (uint64_t)v << shift;
	return 0;
bad:
	cli_error(0, "%s: '%s' is not a size (e.g. 4096, 512M, 8G)", opt, s);
	return -EINVAL;
}

/* The cli_opt_*() parsers: a parse that failed (and said why) is a usage error. */
static int or_usage(const struct argp_state *state, int err)
{
	if (err)
		cli_usage_error(state);
	return 0;
}

int cli_opt_u64(const struct argp_state *state, const char *opt, const char *s, uint64_t lo,
		uint64_t hi, uint64_t *out)
{
	return or_usage(state, cli_parse_u64(opt, s, lo, hi, out));
}

int cli_opt_u32(const struct argp_state *state, const char *opt, const char *s, uint32_t lo,
		uint32_t hi, uint32_t *out)
{
	return or_usage(state, cli_parse_u32(opt, s, lo, hi, out));
}

int cli_opt_double(const struct argp_state *state, const char *opt, const char *s, double lo,
		   double hi, double *out)
{
	return or_usage(state, cli_parse_double(opt, s, lo, hi, out));
}

int cli_opt_u32_list(const struct argp_state *state, const char *opt, const char *s, uint32_t lo,
		     uint32_t hi, uint32_t *out, uint32_t max, uint32_t *n)
{
	return or_usage(state, cli_parse_u32_list(opt, s, lo, hi, out, max, n));
}

int cli_opt_size(const struct argp_state *state, const char *opt, const char *s, uint64_t *out)
{
	return or_usage(state, cli_parse_size(opt, s, out));
}

int cli_opt_pages(const struct argp_state *state, const char *opt, const char *s, int *out)
{
	return or_usage(state, cli_parse_pages(opt, s, out));
}

/* mp_dtype_parse() says which name is unknown and which are known. */
int cli_opt_dtype(const struct argp_state *state, const char *s, enum mp_dtype *out)
{
	return or_usage(state, mp_dtype_parse(s, out));
}

int cli_parse_one_path(int key, char *arg, struct argp_state *state, const char **path)
{
	switch (key) {
	case ARGP_KEY_ARG:
		if (*path)
			argp_error(state, "one FILE only: '%s' is a second", arg);
		*path = arg;
		return 0;
	case ARGP_KEY_END:
		if (!*path)
			argp_error(state, "FILE is missing");
		return 0;
	default:
		return ARGP_ERR_UNKNOWN;
	}
}

enum { OPT_ENGINE = 0x700, OPT_THREADS };

static const struct argp_option engine_opts[] = {
	{ "engine", OPT_ENGINE, "NAME", 0, "Matmul engine (default ref)", 0 },
	{ "threads", OPT_THREADS, "N", 0, "Engine threads (default: online CPUs)", 0 },
	{ 0 }
};

static error_t parse_engine_opt(int key, char *arg, struct argp_state *state)
{
	struct cli_engine_opts *o = state->input;

	switch (key) {
	case ARGP_KEY_INIT:
		o->engine = "ref";
		o->threads = 0;
		return 0;
	case OPT_ENGINE:
		o->engine = arg;
		return 0;
	case OPT_THREADS:
		return cli_opt_u32(state, "--threads", arg, 1, 1024, &o->threads);
	default:
		return ARGP_ERR_UNKNOWN;
	}
}

const struct argp cli_engine_argp = { engine_opts, parse_engine_opt, NULL, NULL, NULL, NULL,
				      NULL };

bool cli_progress_enabled(void)
{
	return isatty(1) && isatty(2);
}

void cli_progress(const char *label, uint64_t done, uint64_t total)
{
	if (!cli_progress_enabled() || !total)
		return;
	fprintf(stderr, "\r%s: %3u%% (%.2f / %.2f GB)", label,
		(unsigned)(done * 100 / total), done / 1e9, total / 1e9);
	fflush(stderr);
}

void cli_progress_end(void)
{
	if (cli_progress_enabled())
		fprintf(stderr, "\n");
}

/*
 * Small helpers
 */

uint64_t cli_clock_ns(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double cli_quantile(const double *v, size_t n, double q)
{
	double *c, r;
	size_t i;

	if (!n)
		return 0;
	c = malloc(n * sizeof(*c));
	if (!c)
		return NAN;
	memcpy(c, v, n * sizeof(*c));
	qsort(c, n, sizeof(*c), cmp_double);
	i = (size_t)ceil(q * (double)n);
	r = c[i ? i - 1 : 0];
	free(c);
	return r;
}

double cli_median(const double *v, size_t n)
{
	return cli_quantile(v, n, 0.5);
}

double cli_rand_unit(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	z ^= z >> 31;
	return ((double)(z >> 11) + 1.0) * 0x1.0p-53;
}

void cli_power_cdf(double *cdf, uint32_t n, double alpha)
{
	double sum = 0, acc = 0;

	for (uint32_t i = 0; i < n; i++)
		sum += pow(i + 1.0, -alpha);
	for (uint32_t i = 0; i < n; i++) {
		acc += pow(i + 1.0, -alpha) / sum;
		cdf[i] = acc;
	}
	if (n)
		cdf[n - 1] = 1.0;
}

uint32_t cli_power_pick(const double *cdf, uint32_t n, double u)
{
	uint32_t i = 0;

	while (i + 1 < n && u > cdf[i])
		i++;
	return i;
}

int cli_read_file(const char *path, char **buf, size_t *len)
{
	FILE *f = fopen(path, "rbe");
	size_t cap = 1 << 16, n = 0, got;
	char *b = NULL, *nb;
	int err = 0;

	if (!f) {
		err = -errno;
		cli_error(0, "%s: %s", path, strerror(errno));
		return err;
	}
	do {
		if (n + 1 >= cap || !b) {
			nb = realloc(b, cap *= 2);
			if (!nb) {
				err = -ENOMEM;
				cli_error(0, "%s: out of memory", path);
				goto close_file;
			}
			b = nb;
		}
		got = fread(b + n, 1, cap - n - 1, f);
		n += got;
	} while (got);
	if (ferror(f)) {
		err = -EIO;
		cli_error(0, "%s: read error", path);
		goto close_file;
	}
	b[n] = '\0';
	*buf = b;
	*len = n;
	b = NULL;
close_file:
	fclose(f);
	free(b);
	return err;
}

const char *cli_drop_caches(int fd)
{
	int d;

	if (fd >= 0)
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	d = open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
	if (d >= 0) {
		bool ok;

		sync();
		ok = write(d, "3", 1) == 1;
		close(d);
		if (ok)
			return "drop_caches";
	}
	return "fadvise";
}

int cli_parse_pages(const char *opt, const char *s, int *out)
{
	static const char *const names[] = {
		[MP_PAGERD_PAGES_SMALL] = "small",
		[MP_PAGERD_PAGES_THP] = "thp",
		[MP_PAGERD_PAGES_HUGETLB] = "hugetlb",
	};

	for (int i = 0; i < (int)(sizeof(names) / sizeof(names[0])); i++) {
		if (!strcmp(s, names[i])) {
			*out = i;
			return 0;
		}
	}
	cli_error(0, "%s %s: small, thp or hugetlb", opt, s);
	return -EINVAL;
}

pid_t cli_start_pagerd(const char *model, const char *sock, uint64_t budget, const char *pages)
{
	char line[256] = "", bytes[32];
	struct pollfd pfd;
	int out[2];
	pid_t pid;

	snprintf(bytes, sizeof(bytes), "%llu", (unsigned long long)budget);
	if (pipe(out))
		return -errno;
	pid = cli_spawn_self((const char *[]){ "pagerd", "--model", model, "--socket", sock,
				"--budget", bytes, "--pages", pages, NULL }, out[1]);
	close(out[1]);
	pfd = (struct pollfd){ .fd = out[0], .events = POLLIN };
	if (pid < 0 || poll(&pfd, 1, 30000) != 1 || read(out[0], line, sizeof(line) - 1) <= 0 ||
	    !strstr(line, "ready")) {
		close(out[0]);
		if (pid > 0) {
			kill(pid, SIGKILL);
			waitpid(pid, NULL, 0);
		}
		return -ECHILD;
	}
	close(out[0]);
	return pid;
}

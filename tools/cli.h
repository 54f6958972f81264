/* SPDX-License-Identifier: MIT */
/* Shared pieces of the moepager subcommands. */
#ifndef MP_CLI_H
#define MP_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <moepager/common.h>

struct cli_command {
	const char *name;
	const char *summary;
	/* argv[0] is the subcommand name; returns 0 on success. */
	int (*run)(int argc, char **argv);
};

int cmd_adapter(int argc, char **argv);
int cmd_consolidate(int argc, char **argv);
int cmd_gen(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_faultbench(int argc, char **argv);
int cmd_preloadbench(int argc, char **argv);
int cmd_elasticbench(int argc, char **argv);
int cmd_batchbench(int argc, char **argv);
int cmd_servebench(int argc, char **argv);
int cmd_adapterbench(int argc, char **argv);
int cmd_multibench(int argc, char **argv);
int cmd_pagerd(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_loadgen(int argc, char **argv);
int cmd_coe_gen(int argc, char **argv);
int cmd_coe_profile(int argc, char **argv);
int cmd_coe_window(int argc, char **argv);
int cmd_bench_coe(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_export(int argc, char **argv);

/*
 * Routes library log lines to stderr: errors as "PROG: MSG", warnings as
 * "PROG: warning: MSG" (every level with MOEPAGER_DEBUG=1). prog names the
 * command as typed ("moepager run") and prefixes every line the tool says.
 */
void cli_install_log_handler(const char *prog);
/* That prefix: "moepager run" ("moepager" before a command runs). */
const char *cli_prog(void);

/*
 * Reports a failed call once, returning err. The library prints its own
 * error line when it fails (naming what and where); if it printed one since
 * the last report, that line is the report and nothing more is said.
 * Otherwise prints "PROG: FMT...: strerror(-err)" (fmt NULL: "PROG: strerror"),
 * which counts as such a line: the callers up the stack may each report the
 * failure, and it is said once.
 */
int cli_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
struct mp_resident;
struct mp_engine;
/*
 * A resident run in e's packed layout where e has one, the same bits read as
 * one stream a tile: r's experts (mp_resident_pack(), else left in file
 * order), and MP_RUNNER_PACK_DENSE added to *runner_flags for the runner's
 * dense matrices. Returns 0 or the packing's error.
 */
int cli_resident_pack(struct mp_resident *r, struct mp_engine *e, uint32_t *runner_flags);
/* The tool's own error line, "PROG: FMT...", counted as cli_fail() counts it. Returns err. */
int cli_error(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/*
 * A line the tool says that reports no failure of the command (what it does,
 * a warning, a request that failed and is counted): "PROG: FMT...", not
 * counted, so a failure after it is still said.
 */
void cli_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/*
 * In an argp parser, after a bad option value was said (cli_parse_*): the
 * "Try `PROG --help'" hint, and exit 64 (EX_USAGE) as argp_error() does.
 */
struct argp_state;
__attribute__((noreturn)) void cli_usage_error(const struct argp_state *state);

/*
 * This binary as a child, `moepager ARGS...` (args NULL-ended, at most 30),
 * for the benches: its stdout on out_fd (STDERR_FILENO when the caller's
 * stdout is its JSON), and SIGTERM when the calling thread ends (so call it
 * from one that outlives the child). Returns the pid, or -errno.
 */
pid_t cli_spawn_self(const char *const *args, int out_fd);
/* The same with the moepager binary exe (NULL: this one), to run another build's. */
pid_t cli_spawn(const char *exe, const char *const *args, int out_fd);
/*
 * Waits up to timeout_ms for the port a serve child writes to port_file once
 * it listens. Returns 0, -ECHILD if the child exited (reaped), or -ETIMEDOUT
 * (the child killed and reaped), after saying which (cli_error).
 */
int cli_serve_wait_port(pid_t pid, const char *port_file, unsigned timeout_ms, unsigned *port);
/* SIGTERM to a child, then reaps it: its wait status, or -errno. */
int cli_child_stop(pid_t pid);

/*
 * Parses a number with strtoull+errno: the whole string must be a number
 * in [lo, hi]. Returns 0 or -EINVAL (and prints which option was bad); in an
 * argp parser, cli_opt_u64() and the rest below.
 */
int cli_parse_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi, uint64_t *out);
int cli_parse_u32(const char *opt, const char *s, uint32_t lo, uint32_t hi, uint32_t *out);
int cli_parse_double(const char *opt, const char *s, double lo, double hi, double *out);

/*
 * Parses a comma-separated list of at most max numbers, each in [lo, hi],
 * into out; *n is how many. Returns 0, or -EINVAL for a bad or empty field
 * or too many (said, naming the option), -ENOMEM if the list cannot be copied.
 */
int cli_parse_u32_list(const char *opt, const char *s, uint32_t lo, uint32_t hi,
		       uint32_t *out, uint32_t max, uint32_t *n);

/*
 * Parses a size: "8G", "512M", "64K", "4096" (bytes, powers of 1024).
 * Returns 0 or -EINVAL.
 */
int cli_parse_size(const char *opt, const char *s, uint64_t *out);

/*
 * The page kind a pager daemon's memfd uses (`--pages small|thp|hugetlb`): 0 and
 * *out an enum mp_pagerd_pages, or -EINVAL after printing what is allowed.
 */
int cli_parse_pages(const char *opt, const char *s, int *out);

/*
 * The same in an argp parser: parses into *out, or says which option was bad
 * and raises the usage error (cli_usage_error: exit 64). Returns 0, so a
 * case can `return cli_opt_u32(state, "--tokens", arg, 1, 64, &env.tokens);`.
 * cli_opt_dtype() takes a dtype name (mp_dtype_parse, which says what is known).
 */
int cli_opt_u64(const struct argp_state *state, const char *opt, const char *s, uint64_t lo,
		uint64_t hi, uint64_t *out);
int cli_opt_u32(const struct argp_state *state, const char *opt, const char *s, uint32_t lo,
		uint32_t hi, uint32_t *out);
int cli_opt_double(const struct argp_state *state, const char *opt, const char *s, double lo,
		   double hi, double *out);
int cli_opt_u32_list(const struct argp_state *state, const char *opt, const char *s, uint32_t lo,
		     uint32_t hi, uint32_t *out, uint32_t max, uint32_t *n);
int cli_opt_size(const struct argp_state *state, const char *opt, const char *s, uint64_t *out);
int cli_opt_pages(const struct argp_state *state, const char *opt, const char *s, int *out);
int cli_opt_dtype(const struct argp_state *state, const char *s, enum mp_dtype *out);

/*
 * The positional-argument part of an argp parser for commands that take
 * exactly one FILE: stores it in *path, refuses a second one and a missing
 * one (argp_error: one line naming which, exit 64). Other keys return
 * ARGP_ERR_UNKNOWN, so a parser ends with
 * `default: return cli_parse_one_path(key, arg, state, &env.path);`.
 */
int cli_parse_one_path(int key, char *arg, struct argp_state *state, const char **path);

/* --engine NAME and --threads N, for every command that runs the engine. */
struct cli_engine_opts {
	const char *engine;	/* "ref" unless given */
	uint32_t threads;	/* 0: the engine's default (online CPUs) */
};

/*
 * The argp child that parses them: list it in the command's children,
 * { &cli_engine_argp, 0, NULL, 0 }, and hand it the options in the
 * command's ARGP_KEY_INIT: state->child_inputs[0] = &env.eng.
 */
struct argp;
extern const struct argp cli_engine_argp;

/* True when stdout (fd 1) / stderr (fd 2) is a terminal: progress goes to stderr only then. */
bool cli_progress_enabled(void);
/* Draws "label: 42% (1.2/2.9 GB)" on stderr, rewriting the line. */
void cli_progress(const char *label, uint64_t done, uint64_t total);
void cli_progress_end(void);

/*
 * The engine's wall time lost to the pager's waits, in s, from its summed
 * stall_ns and caller_stall_ns (struct mp_pager_stats): a fault blocks every
 * engine thread reading the expert and each counts, so those waits are
 * divided by the thread count; a request resolved on the asking thread
 * counts that thread alone while the others wait for it too.
 */
static inline double cli_engine_stall_s(uint64_t stall_ns, uint64_t caller_stall_ns,
					uint32_t threads)
{
	return ((double)(stall_ns - caller_stall_ns) / (threads ? threads : 1) +
		(double)caller_stall_ns) / 1e9;
}

/* clock_gettime(clk) in ns; cli_now_ns() on CLOCK_MONOTONIC. */
uint64_t cli_clock_ns(clockid_t clk);
static inline uint64_t cli_now_ns(void)
{
	return cli_clock_ns(CLOCK_MONOTONIC);
}

/*
 * The q-quantile (0..1) of n values by nearest rank, v left as it is; 0 for
 * no values, NAN when out of memory. The median is the 0.5 quantile: the
 * lower middle value of an even count.
 */
double cli_quantile(const double *v, size_t n, double q);
double cli_median(const double *v, size_t n);

/* splitmix64: advances *state and returns a uniform double in (0, 1]. */
double cli_rand_unit(uint64_t *state);

/*
 * Power-law shares over n choices (choice i gets a share proportional to
 * (i + 1)^-alpha; alpha 0 is uniform), as a cumulative distribution in
 * cdf[n], and the choice a uniform u in (0, 1] falls on.
 */
void cli_power_cdf(double *cdf, uint32_t n, double alpha);
uint32_t cli_power_pick(const double *cdf, uint32_t n, double u);

/*
 * Reads the whole file at path into a new NUL-terminated buffer (free() it).
 * Returns 0 or a negative errno, after printing what failed.
 */
int cli_read_file(const char *path, char **buf, size_t *len);

/*
 * Drops the page cache before a cold-tier measurement: the file's pages
 * (posix_fadvise, fd may be -1), then everything (/proc/sys/vm/drop_caches,
 * as root). Returns how: "drop_caches" or "fadvise".
 */
const char *cli_drop_caches(int fd);

/*
 * Starts `moepager pagerd` (this binary, /proc/self/exe) for model on sock
 * with budget bytes of `pages` (small, thp, hugetlb). Returns its pid once
 * it said ready, or a negative errno.
 */
pid_t cli_start_pagerd(const char *model, const char *sock, uint64_t budget, const char *pages);

#endif

// SPDX-License-Identifier: MIT
/* Description: fork() with the range registered; the model file truncated under a pager. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fault_common.h"

/* Waits up to ms for the child; kills it and fails when it hangs. Returns its wait status. */
static int wait_child(pid_t pid, uint32_t ms, const char *what)
{
	int status = 0;

	for (uint32_t waited = 0;; waited += 10) {
		pid_t r = waitpid(pid, &status, WNOHANG);

		if (r == pid)
			return status;
		assert_int_equal(r, 0);
		if (waited >= ms) {
			kill(pid, SIGKILL);
			waitpid(pid, &status, 0);
			fail_msg("child (%s) still running after %u ms: it hangs", what, ms);
		}
		usleep(10 * 1000);
	}
}

struct looper {
	struct mp_pager *p;
	atomic_bool stop;
	atomic_int ok;		/* read by the test while the loop runs */
	int wrong;		/* wrong bytes served: never allowed */
	int enodata;
	int eio;
	int other;		/* any other error */
};

static void *read_loop(void *arg)
{
	struct looper *lp = arg;
	unsigned seed = 3;

	while (!atomic_load(&lp->stop)) {
		int ret = fx_read(lp->p, (uint32_t)rand_r(&seed) % fx.geo->layers,
				  (uint32_t)rand_r(&seed) % fx.geo->experts);

		atomic_fetch_add(&lp->ok, ret == 0);
		lp->wrong += ret == -EILSEQ;
		lp->enodata += ret == -ENODATA;
		lp->eio += ret == -EIO;
		lp->other += ret && ret != -EILSEQ && ret != -ENODATA && ret != -EIO;
	}
	return NULL;
}

static void fork_with_faults_in_flight_leaves_child_and_parent_working(void **state)
{
	struct mp_pager *p = fx_open(NULL, "read:delay=5ms", 1, 3, NULL);
	const volatile uint8_t *x;
	struct looper lp = { .p = p };
	pthread_t th;
	pid_t pid;
	int status;

	(void)state;
	assert_int_equal(fx_read(p, 0, 0), 0);
	x = mp_pager_expert(p, 0, 0);
	/* Another thread keeps faulting while we fork. */
	pthread_create(&th, NULL, read_loop, &lp);
	usleep(20 * 1000);

	/* A child that only exits. */
	for (int i = 0; i < 5; i++) {
		pid = fork();
		assert_true(pid >= 0);
		if (!pid)
			_exit(7);
		status = wait_child(pid, 10000, "exit");
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 7);
	}

	/* A child that does its own work, then execs. */
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		execl("/bin/true", "true", (char *)NULL);
		_exit(127);
	}
	status = wait_child(pid, 10000, "exec");
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);

	/*
	 * A child that touches expert memory: the range is not inherited
	 * (MADV_DONTFORK), so it dies of SIGSEGV at once instead of waiting
	 * for a handler it does not have.
	 */
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		/* cmocka catches SIGSEGV to fail a test: the child must die of it instead. */
		signal(SIGSEGV, SIG_DFL);
		signal(SIGBUS, SIG_DFL);
		alarm(5);
		_exit(x[0] == 0x5a ? 3 : 4);
	}
	status = wait_child(pid, 10000, "touch");
	assert_true(WIFSIGNALED(status));
	assert_int_equal(WTERMSIG(status), SIGSEGV);

	atomic_store(&lp.stop, true);
	assert_true(fx_join(th, 30000));
	assert_true(atomic_load(&lp.ok) > 0);
	assert_int_equal(lp.wrong + lp.enodata + lp.eio + lp.other, 0);
	/* The parent's pager is untouched by all this. */
	for (uint32_t l = 0; l < fx.geo->layers; l++)
		for (uint32_t e = 0; e < fx.geo->experts; e++)
			assert_int_equal(fx_read(p, l, e), 0);
	mp_pager_close(p);
}

static int copy_file(const char *from, const char *to)
{
	static char buf[1 << 16];
	int in = open(from, O_RDONLY), out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	off_t end = in >= 0 ? lseek(in, 0, SEEK_END) : -1;
	int err = in < 0 || out < 0 || end < 0 ? -errno : 0;

	/* Keep the copy sparse as the original: copy only the data extents. */
	for (off_t off = 0; !err && off < end;) {
		off_t data = lseek(in, off, SEEK_DATA), hole;

		if (data < 0)
			break;
		hole = lseek(in, data, SEEK_HOLE);
		for (off_t o = data; !err && o < hole;) {
			ssize_t n = pread(in, buf, (size_t)MP_MIN((off_t)sizeof(buf), hole - o), o);

			if (n <= 0 || pwrite(out, buf, (size_t)n, o) != n)
				err = -EIO;
			o += n;
		}
		off = hole;
	}
	if (!err && ftruncate(out, end))
		err = -errno;
	if (in >= 0)
		close(in);
	if (out >= 0)
		close(out);
	return err;
}

static void truncated_model_file_gives_errors_not_hangs_or_wrong_bytes(void **state)
{
	const char *path = t_path("trunc.mpk");
	const struct mp_expert_info *cut_at;
	struct mp_store *s;
	struct mp_pager *p;
	uint32_t gone = 0;

	(void)state;
	assert_int_equal(copy_file(fx.path, path), 0);
	assert_int_equal(mp_store_open(path, &s), 0);
	p = fx_open(s, "", 1, 2, NULL);
	for (uint32_t l = 0; l < fx.geo->layers; l++)
		for (uint32_t e = 0; e < fx.geo->experts; e++)
			assert_int_equal(fx_read(p, l, e), 0);

	/* Cut the file in the middle of layer 2 expert 3. */
	cut_at = mp_store_expert(s, 2, 3);
	assert_int_equal(truncate(path, (off_t)(cut_at->offset + cut_at->bytes / 2)), 0);
	for (uint32_t l = 0; l < fx.geo->layers; l++) {
		for (uint32_t e = 0; e < fx.geo->experts; e++) {
			const struct mp_expert_info *x = mp_store_expert(s, l, e);
			int ret;

			fx_log_reset();
			ret = fx_read(p, l, e);
			if (x->offset + x->bytes <= cut_at->offset + cut_at->bytes / 2) {
				assert_int_equal(ret, 0);
				continue;
			}
			assert_int_equal(ret, -ENODATA);
			assert_true(fx_log_contains("file ends at offset"));
			gone++;
		}
	}
	assert_int_equal(gone, (fx.geo->layers - 2) * fx.geo->experts - 3);
	mp_pager_close(p);
	mp_store_close(s);
	unlink(path);
}

static void truncating_while_threads_read_gives_errors_not_wrong_bytes(void **state)
{
	const char *path = t_path("trunc2.mpk");
	struct mp_store *s;
	struct mp_pager *p;
	struct looper lp[3];
	pthread_t th[3];
	int ok = 0;

	(void)state;
	assert_int_equal(copy_file(fx.path, path), 0);
	assert_int_equal(mp_store_open(path, &s), 0);
	p = fx_open(s, "read:delay=1ms", 1, 2, NULL);
	for (int i = 0; i < 3; i++) {
		lp[i] = (struct looper){ .p = p };
		pthread_create(&th[i], NULL, read_loop, &lp[i]);
	}
	usleep(200 * 1000);
	for (int i = 0; i < 3; i++)
		ok += atomic_load(&lp[i].ok);
	assert_true(ok > 0);
	assert_int_equal(truncate(path, (off_t)mp_store_expert(s, 1, 0)->offset), 0);
	usleep(300 * 1000);
	for (int i = 0; i < 3; i++) {
		atomic_store(&lp[i].stop, true);
		if (!fx_join(th[i], 30000))
			fail_msg("reader %d blocked after the file was truncated", i);
	}
	/*
	 * Each read gave the right bytes or said the file ends; none saw wrong
	 * bytes. A thread whose SIGBUS lands after another reader already
	 * cleared the poison gets a plain -EIO (the cause is gone by then).
	 */
	for (int i = 0; i < 3; i++) {
		print_message("reader %d: %d right, %d ENODATA, %d EIO\n", i,
			      atomic_load(&lp[i].ok), lp[i].enodata, lp[i].eio);
		assert_int_equal(lp[i].wrong, 0);
		assert_int_equal(lp[i].other, 0);
		assert_true(atomic_load(&lp[i].ok) > 0);
	}
	for (uint32_t e = 0; e < fx.geo->experts; e++) {
		mp_pager_evict(p, 3, e, 0);
		assert_int_equal(fx_read(p, 3, e), -ENODATA);
	}
	mp_pager_close(p);
	mp_store_close(s);
	unlink(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(fork_with_faults_in_flight_leaves_child_and_parent_working),
		cmocka_unit_test(truncated_model_file_gives_errors_not_hangs_or_wrong_bytes),
		cmocka_unit_test(truncating_while_threads_read_gives_errors_not_wrong_bytes),
	};

	return cmocka_run_group_tests(tests, fx_group_setup, fx_group_teardown);
}

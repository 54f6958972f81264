// SPDX-License-Identifier: MIT
/*
 * Description: the opt-in bf16-activation path (engine ref-amx): its AMX
 * kernel against a scalar product over the same bf16-rounded activations,
 * each vector's products the same bits alone and in any batch (kernel and
 * engine, across token groups and the engine's blocks), and a clear
 * refusal where the CPU or kernel does not allow AMX.
 */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <moepager/engine.h>

#include "engine/kernels.h"
#include "helpers.h"

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))
#define ARCH_REQ_XCOMP_PERM 0x1023

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static float frand(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (float)((rng_state >> 40) * (2.0 / 16777216.0) - 1.0);
}

static void *xmalloc(size_t bytes)
{
	void *p = malloc(bytes);

	assert_non_null(p);
	return p;
}

/* rows x cols bf16 weights from random floats. */
static uint16_t *make_weights(uint32_t rows, uint32_t cols)
{
	uint16_t *w = xmalloc((size_t)rows * cols * 2 + 2);

	for (size_t i = 0; i < (size_t)rows * cols; i++)
		w[i] = mp_f32_to_bf16(frand());
	return w;
}

/* The AMX kernels, or NULL after checking that ref-amx is refused with a reason. */
static const struct mp_kernels *amx_or_refusal(void)
{
	const struct mp_kernels *k = mp_kernels_for(MP_ISA_AMX);
	struct mp_engine *e = NULL;

	if (k)
		return k;
	t_log_reset();
	assert_int_equal(mp_engine_open("ref-amx", NULL, &e), -EOPNOTSUPP);
	assert_null(e);
	assert_true(t_log_contains("AMX-BF16"));
	printf("# no AMX-BF16 here: checked the refusal instead\n");
	return NULL;
}

/*
 * The reference: each term bf16(w) * bf16(x), exact in f32 (8-bit
 * significands), summed in f32 in column order. The tile unit sums the 32
 * terms of an instruction in its own order (not documented bit for bit),
 * so the kernel is held to f32 rounding of that sum: 2^-22 of the sum of
 * |terms| per 32-column block is generous and still far below one bf16
 * rounding of the activations (2^-9), which the reference shares exactly.
 */
static void check_reference(const uint16_t *w, uint32_t rows, uint32_t cols, const float *x,
			    const float *y, const char *what)
{
	for (uint32_t r = 0; r < rows; r++) {
		float sum = 0;
		double scale = 0;

		for (uint32_t c = 0; c < cols; c++) {
			float term = mp_bf16_to_f32(w[(size_t)r * cols + c]) *
				     mp_bf16_to_f32(mp_f32_to_bf16(x[c]));

			sum += term;
			scale += fabs((double)term);
		}
		if (!(fabs((double)y[r] - sum) <= scale * 0x1p-22 * ((cols + 31) / 32) + 1e-30)) {
			print_error("%s row %u: got %.9g, want %.9g (scale %.3g)\n", what, r,
				    (double)y[r], (double)sum, scale);
			fail();
		}
	}
}

/*
 * Vector t of a batch of n (laid out by the kernels' xprep for those n)
 * gets the bits it gets alone, at its stride, and nothing past the batch's
 * rows is written.
 */
static void check_gemm(const struct mp_kernels *k, uint32_t rows, uint32_t cols, uint32_t nmax)
{
	const size_t ystride = rows + 3;
	uint16_t *w = make_weights(rows, cols);
	float *x = xmalloc((size_t)nmax * cols * sizeof(float));
	float *xk = xmalloc((size_t)nmax * cols * sizeof(float));
	float *y = xmalloc(nmax * ystride * sizeof(float));
	float *one = xmalloc(rows * sizeof(float));
	char what[96];

	for (size_t i = 0; i < (size_t)nmax * cols; i++)
		x[i] = frand();
	for (uint32_t n = 1; n <= nmax; n++) {
		memset(y, 0xff, nmax * ystride * sizeof(float));
		k->xprep[MP_DTYPE_BF16](x, n, cols, xk);
		k->gemm[MP_DTYPE_BF16](w, rows, cols, xk, n, y, ystride);
		for (uint32_t t = 0; t < nmax; t++) {
			const float *yt = y + t * ystride;

			for (uint32_t r = t < n ? rows : 0; r < ystride; r++)
				assert_true(isnan(yt[r]));
			if (t >= n)
				continue;
			snprintf(what, sizeof(what), "amx %ux%u n=%u vector %u", rows, cols, n, t);
			k->xprep[MP_DTYPE_BF16](x + (size_t)t * cols, 1, cols, xk);
			k->gemm[MP_DTYPE_BF16](w, rows, cols, xk, 1, one, rows);
			if (memcmp(one, yt, rows * sizeof(float))) {
				print_error("%s differs from its product alone\n", what);
				fail();
			}
			check_reference(w, rows, cols, x + (size_t)t * cols, yt, what);
		}
	}
	free(w);
	free(x);
	free(xk);
	free(y);
	free(one);
}

/* Odd shapes: partial 16-row blocks, short column blocks, odd columns, 1-2 groups of 16. */
static void amx_gemm_matches_a_bf16_activation_reference(void **state)
{
	static const uint32_t rows[] = { 1, 5, 16, 19, 38 };
	static const uint32_t cols[] = { 1, 7, 32, 45, 96, 129 };
	const struct mp_kernels *k = amx_or_refusal();

	(void)state;
	if (!k)
		return;
	assert_string_equal(k->isa, "amx");
	for (size_t r = 0; r < N_ELEMS(rows); r++)
		for (size_t c = 0; c < N_ELEMS(cols); c++)
			check_gemm(k, rows[r], cols[c], 35);
}

/*
 * Through the engine on 2 threads: a batch large enough to run in the
 * engine's blocks (vectors in whole groups of 16, rows not) gives each
 * vector its lone products, and ref-amx's other types are ref-avx512's bits.
 */
static void amx_engine_products_are_the_same_bits_alone_and_batched(void **state)
{
	const uint32_t rows = 200, cols = 1500, n = 70;
	struct mp_engine_config cfg = { .threads = 2 };
	struct mp_engine *e = NULL, *e512 = NULL;
	uint16_t *w;
	float *x, *y, *one, *wf, *yf;

	(void)state;
	if (!amx_or_refusal())
		return;
	assert_int_equal(mp_engine_open("ref-amx", &cfg, &e), 0);
	assert_int_equal(mp_engine_open("ref-avx512", &cfg, &e512), 0);
	w = make_weights(rows, cols);
	x = xmalloc((size_t)n * cols * sizeof(float));
	y = xmalloc((size_t)n * rows * sizeof(float));
	one = xmalloc(rows * sizeof(float));
	wf = xmalloc((size_t)rows * cols * sizeof(float));
	yf = xmalloc((size_t)n * rows * sizeof(float));
	for (size_t i = 0; i < (size_t)n * cols; i++)
		x[i] = frand();
	assert_int_equal(mp_engine_matmul(e, NULL, MP_DTYPE_BF16, w, rows, cols, x, n, y), 0);
	for (uint32_t t = 0; t < n; t++) {
		assert_int_equal(mp_engine_matvec(e, NULL, MP_DTYPE_BF16, w, rows, cols,
						  x + (size_t)t * cols, one), 0);
		assert_memory_equal(one, y + (size_t)t * rows, rows * sizeof(float));
	}
	mp_dtype_to_f32(MP_DTYPE_BF16, w, wf, (size_t)rows * cols);
	assert_int_equal(mp_engine_matmul(e, NULL, MP_DTYPE_F32, wf, rows, cols, x, n, y), 0);
	assert_int_equal(mp_engine_matmul(e512, NULL, MP_DTYPE_F32, wf, rows, cols, x, n, yf), 0);
	assert_memory_equal(y, yf, (size_t)n * rows * sizeof(float));
	mp_engine_close(e);
	mp_engine_close(e512);
	free(w);
	free(x);
	free(y);
	free(one);
	free(wf);
	free(yf);
}

/* A filter that fails arch_prctl(ARCH_REQ_XCOMP_PERM) with EPERM, as a locked-down host might. */
static int forbid_amx(void)
{
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_arch_prctl, 0, 3),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH_REQ_XCOMP_PERM, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { .len = N_ELEMS(f), .filter = f };

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		return -errno;
	return syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) ? -errno : 0;
}

/*
 * Where the kernel refuses the tile state, ref-amx is -EOPNOTSUPP naming
 * what it needs (no crash, no fallback to other bits), and the other
 * engines still open. In a child: the filter stays with the process.
 */
static void amx_is_refused_with_a_clear_error_where_the_kernel_forbids_it(void **state)
{
	int status;
	pid_t pid;

	(void)state;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct mp_engine *e = NULL;
		int code = 0;

		if (forbid_amx())
			_exit(10);
		t_log_reset();
		if (mp_engine_open("ref-amx", NULL, &e) != -EOPNOTSUPP || e)
			code = 11;
		else if (!t_log_contains("AMX-BF16") || !t_log_contains("arch_prctl"))
			code = 12;
		else if (mp_kernels_for(MP_ISA_AMX))
			code = 13;
		/* An AMX CPU: the filter's errno is the reason given, in the message too. */
		else if (mp_isa_amx_check() != -ENODEV && (mp_isa_amx_check() != -EPERM ||
							  !t_log_contains(strerror(EPERM))))
			code = 15;
		else if (mp_engine_open("ref", NULL, &e))
			code = 14;
		mp_engine_close(e);
		_exit(code);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		print_error("child: %s %d (10 no seccomp, 11 not refused, 12 message, 13 "
			    "kernels, 14 ref, 15 errno)\n", WIFEXITED(status) ? "exit" : "signal",
			    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		fail();
	}
}

int main(void)
{
	static const struct CMUnitTest tests[] = {
		cmocka_unit_test(amx_gemm_matches_a_bf16_activation_reference),
		cmocka_unit_test(amx_engine_products_are_the_same_bits_alone_and_batched),
		cmocka_unit_test(amx_is_refused_with_a_clear_error_where_the_kernel_forbids_it),
	};

	return cmocka_run_group_tests(tests, t_group_log_capture, t_group_tmpdir_cleanup);
}

// SPDX-License-Identifier: MIT
/*
 * Description: the opt-in bf16-activation paths (engines ref-amx and
 * ref-bf16): their AMX and AVX512-BF16 kernels against a scalar product
 * over the same bf16-rounded activations, each vector's products the same
 * bits alone and in any batch (kernel and engine, across token groups and
 * the engine's blocks), and a clear refusal where the CPU or kernel does
 * not allow them (AMX: a seccomp filter; AVX512-BF16: cpuid faulting that
 * hides its bit).
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
#include <cpuid.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ucontext.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <moepager/engine.h>

#include "engine/kernels.h"
#include "helpers.h"

#define N_ELEMS(a) (sizeof(a) / sizeof((a)[0]))
#define ARCH_REQ_XCOMP_PERM 0x1023
#define ARCH_SET_CPUID 0x1012

/*
 * A bf16-activation path: its table, engine, what its refusal names, and
 * its kernel's rounding allowance in f32 ulps of the sum of |terms| per
 * 32-column block (check_reference()).
 */
struct path {
	enum mp_isa isa;
	const char *engine;
	const char *isa_name;
	const char *needs;
	double per_block;
};

/* The tile unit sums a block's 32 terms in its own order (not documented bit for bit). */
static const struct path amx = { MP_ISA_AMX, "ref-amx", "amx", "AMX-BF16", 4 };
/*
 * vdpbf16ps adds a block's two terms of each lane into its f32 accumulator
 * (two roundings); the 16 lanes are then reduced in four levels (check_reference()).
 */
static const struct path bf16 = { MP_ISA_BF16, "ref-bf16", "avx512bf16", "AVX512-BF16", 2 };

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

/* The path's kernels, or NULL after checking that its engine is refused with a reason. */
static const struct mp_kernels *kernels_or_refusal(const struct path *p)
{
	const struct mp_kernels *k = mp_kernels_for(p->isa);
	struct mp_engine *e = NULL;

	if (k)
		return k;
	t_log_reset();
	assert_int_equal(mp_engine_open(p->engine, NULL, &e), -EOPNOTSUPP);
	assert_null(e);
	assert_true(t_log_contains(p->needs));
	printf("# no %s here: checked the refusal instead\n", p->needs);
	return NULL;
}

/*
 * The reference: each term bf16(w) * bf16(x), exact in f32 (8-bit
 * significands), summed in double (exact enough to be the true sum here).
 * The kernels differ from it by their f32 additions only, each off by at
 * most 2^-24 of a partial sum no larger than the sum of |terms|: per
 * 32-column block p->per_block of them, then at most 5 more (vdpbf16ps's
 * 16 lanes reduced in 4 levels, one spare). That is ~1000x below one bf16
 * rounding of the activations (2^-9), which the reference shares exactly,
 * so a wrong rounding or a lost or doubled column fails.
 */
static void check_reference(const struct path *p, const uint16_t *w, uint32_t rows,
			    uint32_t cols, const float *x, const float *y, const char *what)
{
	for (uint32_t r = 0; r < rows; r++) {
		double sum = 0, scale = 0;

		for (uint32_t c = 0; c < cols; c++) {
			float term = mp_bf16_to_f32(w[(size_t)r * cols + c]) *
				     mp_bf16_to_f32(mp_f32_to_bf16(x[c]));

			sum += term;
			scale += fabs((double)term);
		}
		if (!(fabs((double)y[r] - sum) <=
		      scale * 0x1p-24 * (p->per_block * ((cols + 31) / 32) + 5) + 1e-30)) {
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
static void check_gemm(const struct path *p, const struct mp_kernels *k, uint32_t rows,
		       uint32_t cols, uint32_t nmax)
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
			snprintf(what, sizeof(what), "%s %ux%u n=%u vector %u", p->isa_name, rows,
				 cols, n, t);
			k->xprep[MP_DTYPE_BF16](x + (size_t)t * cols, 1, cols, xk);
			k->gemm[MP_DTYPE_BF16](w, rows, cols, xk, 1, one, rows);
			if (memcmp(one, yt, rows * sizeof(float))) {
				print_error("%s differs from its product alone\n", what);
				fail();
			}
			check_reference(p, w, rows, cols, x + (size_t)t * cols, yt, what);
		}
	}
	free(w);
	free(x);
	free(xk);
	free(y);
	free(one);
}

/* check_gemm() at every rows x cols shape, up to nmax vectors, on the path's kernels. */
static void check_shapes(const struct path *p, const uint32_t *rows, size_t nr,
			 const uint32_t *cols, size_t nc, uint32_t nmax)
{
	const struct mp_kernels *k = kernels_or_refusal(p);

	if (!k)
		return;
	assert_string_equal(k->isa, p->isa_name);
	for (size_t r = 0; r < nr; r++)
		for (size_t c = 0; c < nc; c++)
			check_gemm(p, k, rows[r], cols[c], nmax);
}

/* Odd shapes: partial 16-row blocks, short column blocks, odd columns, 1-2 groups of 16. */
static void amx_gemm_matches_a_bf16_activation_reference(void **state)
{
	static const uint32_t rows[] = { 1, 5, 16, 19, 38 };
	static const uint32_t cols[] = { 1, 7, 32, 45, 96, 129 };

	(void)state;
	check_shapes(&amx, rows, N_ELEMS(rows), cols, N_ELEMS(cols), 35);
}

/*
 * Odd shapes for vdpbf16ps's 4-row x 6-vector tiles: rows left over one by
 * one, masked last blocks of 1-31 columns, one to three groups of vectors.
 */
static void bf16_gemm_matches_a_bf16_activation_reference(void **state)
{
	static const uint32_t rows[] = { 1, 3, 4, 5, 9, 38 };
	static const uint32_t cols[] = { 1, 7, 31, 32, 33, 45, 96, 129 };

	(void)state;
	check_shapes(&bf16, rows, N_ELEMS(rows), cols, N_ELEMS(cols), 14);
}

/*
 * The packed kernel over n vectors gives vector t the row-major kernel's
 * bits alone (whose values check_reference() bounds), at its stride, and
 * writes nothing past the batch's rows.
 */
static void check_packed_gemm(const struct path *p, const struct mp_kernels *k, uint32_t rows,
			      uint32_t cols, uint32_t nmax)
{
	const size_t ystride = rows + 3;
	uint16_t *w = make_weights(rows, cols), *pk = xmalloc((size_t)rows * cols * 2);
	float *x = xmalloc((size_t)nmax * cols * sizeof(float));
	float *xk = xmalloc((size_t)nmax * cols * sizeof(float));
	float *y = xmalloc(nmax * ystride * sizeof(float));
	float *one = xmalloc(rows * sizeof(float));

	mp_pack_bf16(w, rows, cols, pk);
	for (size_t i = 0; i < (size_t)nmax * cols; i++)
		x[i] = frand();
	for (uint32_t n = 1; n <= nmax; n++) {
		memset(y, 0xff, nmax * ystride * sizeof(float));
		k->xprep[MP_DTYPE_BF16](x, n, cols, xk);
		k->gemm_packed[MP_DTYPE_BF16](pk, rows, cols, xk, n, y, ystride);
		for (uint32_t t = 0; t < nmax; t++) {
			const float *yt = y + t * ystride;

			for (uint32_t r = t < n ? rows : 0; r < ystride; r++)
				assert_true(isnan(yt[r]));
			if (t >= n)
				continue;
			k->xprep[MP_DTYPE_BF16](x + (size_t)t * cols, 1, cols, xk);
			k->gemm[MP_DTYPE_BF16](w, rows, cols, xk, 1, one, rows);
			if (memcmp(one, yt, rows * sizeof(float))) {
				print_error("%s packed %ux%u n=%u vector %u: not its row-major bits "
					    "alone\n", p->isa_name, rows, cols, n, t);
				fail();
			}
		}
	}
	free(w);
	free(pk);
	free(x);
	free(xk);
	free(y);
	free(one);
}

/*
 * vdpbf16ps's packed kernel at odd shapes: a short last group of 1-3 rows,
 * 0-17 whole 32-column blocks (none, part of one 4-block segment, whole
 * segments and a short last one) with and without a masked part block, and
 * 1-60 vectors: one tile, groups of 6 over segments, two passes of 48.
 */
static void bf16_packed_gemm_is_the_row_major_bits(void **state)
{
	static const uint32_t rows[] = { 1, 3, 4, 5, 9, 38 };
	static const uint32_t cols[] = { 7, 32, 33, 129, 161, 256, 300, 557 };
	const struct mp_kernels *k = kernels_or_refusal(&bf16);

	(void)state;
	if (!k)
		return;
	assert_non_null(k->gemm_packed[MP_DTYPE_BF16]);
	for (size_t r = 0; r < N_ELEMS(rows); r++)
		for (size_t c = 0; c < N_ELEMS(cols); c++)
			check_packed_gemm(&bf16, k, rows[r], cols[c], 60);
}

/*
 * vdpbf16ps's xprep rounds as mp_f32_to_bf16(): ties to even, NaNs quiet,
 * infinities, signed zeros and subnormals, into each vector's first half.
 */
static void bf16_xprep_rounds_as_the_scalar_conversion(void **state)
{
	static const uint32_t bits[] = {
		0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001, 0x7f800000, 0xff800000,
		0x7f800001, 0xffc00001, 0x7fffffff, 0x80000000, 0x00000001, 0x007fffff,
		0x7f7fffff, 0xbf7fffff, 0x00008000, 0x00018000,
	};
	const uint32_t cols = 37, n = 3;
	const struct mp_kernels *k = kernels_or_refusal(&bf16);
	float x[3 * 37], out[3 * 37];

	(void)state;
	if (!k)
		return;
	for (uint32_t i = 0; i < n * cols; i++) {
		uint32_t b = bits[i % N_ELEMS(bits)] ^ (i / N_ELEMS(bits) % 2 ? 0x80000000u : 0);

		memcpy(&x[i], &b, sizeof(b));
	}
	k->xprep[MP_DTYPE_BF16](x, n, cols, out);
	for (uint32_t t = 0; t < n; t++) {
		const uint16_t *o = (const uint16_t *)(out + (size_t)t * cols);

		for (uint32_t c = 0; c < cols; c++)
			assert_int_equal(o[c], mp_f32_to_bf16(x[t * cols + c]));
	}
}

/*
 * Through the engine on 2 threads: a batch large enough to run in the
 * engine's blocks (AMX: vectors in whole groups of 16, rows not) gives each
 * vector its lone products, and the path's other types are ref-avx512's bits.
 */
static void engine_products_are_the_same_bits_alone_and_batched(const struct path *p)
{
	const uint32_t rows = 200, cols = 1500, n = 70;
	struct mp_engine_config cfg = { .threads = 2 };
	struct mp_engine *e = NULL, *e512 = NULL;
	uint16_t *w;
	float *x, *y, *one, *wf, *yf;

	if (!kernels_or_refusal(p))
		return;
	assert_int_equal(mp_engine_open(p->engine, &cfg, &e), 0);
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

static void amx_engine_products_are_the_same_bits_alone_and_batched(void **state)
{
	(void)state;
	engine_products_are_the_same_bits_alone_and_batched(&amx);
}

static void bf16_engine_products_are_the_same_bits_alone_and_batched(void **state)
{
	(void)state;
	engine_products_are_the_same_bits_alone_and_batched(&bf16);
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

static volatile sig_atomic_t cpuid_traps;

/*
 * SIGSEGV of a trapped cpuid (ARCH_SET_CPUID 0): runs it untrapped and
 * returns its registers with AVX512-BF16 (leaf 7 subleaf 1, EAX bit 5)
 * cleared, as a CPU without it would.
 */
static void cpuid_without_bf16(int sig, siginfo_t *si, void *ctx)
{
	greg_t *g = ((ucontext_t *)ctx)->uc_mcontext.gregs;
	const uint8_t *ip = (const uint8_t *)g[REG_RIP];
	const unsigned leaf = (unsigned)g[REG_RAX], sub = (unsigned)g[REG_RCX];
	unsigned a, b, c, d;

	(void)sig;
	(void)si;
	if (ip[0] != 0x0f || ip[1] != 0xa2)
		_exit(20);	/* a real fault */
	syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
	__cpuid_count(leaf, sub, a, b, c, d);
	syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
	if (leaf == 7 && sub == 1)
		a &= ~(1u << 5);
	g[REG_RAX] = a;
	g[REG_RBX] = b;
	g[REG_RCX] = c;
	g[REG_RDX] = d;
	g[REG_RIP] += 2;
	cpuid_traps++;
}

/* In a forked child: the engine opened where cpuid says no AVX512-BF16 (codes as below). */
static int bf16_refusal_child(void)
{
	struct sigaction sa = { .sa_sigaction = cpuid_without_bf16, .sa_flags = SA_SIGINFO };
	struct mp_engine *e = NULL;
	int code = 0;

	if (sigaction(SIGSEGV, &sa, NULL))
		return 9;
	if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0))
		return 10;
	t_log_reset();
	if (mp_engine_open("ref-bf16", NULL, &e) != -EOPNOTSUPP || e)
		code = 11;
	else if (!t_log_contains("AVX512-BF16") || !t_log_contains("cpuid"))
		code = 12;
	else if (mp_kernels_for(MP_ISA_BF16))
		code = 13;
	else if (mp_engine_open("ref-avx512", NULL, &e))
		code = 14;
	else if (!cpuid_traps)
		code = 15;
	mp_engine_close(e);
	return code;
}

/* The bit that decides: 7.1 EAX bit 5, read only where subleaf 1 exists. */
static void bf16_is_cpuid_leaf_7_1_eax_bit_5(void **state)
{
	(void)state;
	assert_true(mp_isa_bf16_cpuid(1, 1u << 5));
	assert_true(mp_isa_bf16_cpuid(2, ~0u));
	assert_false(mp_isa_bf16_cpuid(1, ~(1u << 5)));
	assert_false(mp_isa_bf16_cpuid(0, 1u << 5));
	assert_false(mp_isa_bf16_cpuid(1, 0));
}

/*
 * Where cpuid lacks AVX512-BF16, ref-bf16 is -EOPNOTSUPP naming it (no
 * crash on an illegal instruction, no fallback to other bits) and ref-avx512
 * still opens. On a CPU with it, a child hides the bit by cpuid faulting
 * (Linux's ARCH_SET_CPUID; every cpuid traps to a handler that answers).
 * Where the hypervisor offers no cpuid faulting, the decision itself is
 * what the test above checks, and this one says so.
 */
static void bf16_is_refused_with_a_clear_error_where_cpuid_lacks_it(void **state)
{
	int status;
	pid_t pid;

	(void)state;
	if (!kernels_or_refusal(&bf16))
		return;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		_exit(bf16_refusal_child());
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (WIFEXITED(status) && WEXITSTATUS(status) == 10) {
		print_message("no cpuid faulting on this machine: the refusal's cpuid "
			      "decision is checked by bf16_is_cpuid_leaf_7_1_eax_bit_5\n");
		return;
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		print_error("child: %s %d (9 sigaction, 10 no cpuid faulting, 11 not refused, 12 message, "
			    "13 kernels, 14 ref-avx512, 15 no cpuid trapped, 20 a real fault)\n",
			    WIFEXITED(status) ? "exit" : "signal",
			    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
		fail();
	}
}

int main(void)
{
	static const struct CMUnitTest tests[] = {
		cmocka_unit_test(amx_gemm_matches_a_bf16_activation_reference),
		cmocka_unit_test(bf16_gemm_matches_a_bf16_activation_reference),
		cmocka_unit_test(bf16_packed_gemm_is_the_row_major_bits),
		cmocka_unit_test(bf16_xprep_rounds_as_the_scalar_conversion),
		cmocka_unit_test(amx_engine_products_are_the_same_bits_alone_and_batched),
		cmocka_unit_test(bf16_engine_products_are_the_same_bits_alone_and_batched),
		cmocka_unit_test(amx_is_refused_with_a_clear_error_where_the_kernel_forbids_it),
		cmocka_unit_test(bf16_is_cpuid_leaf_7_1_eax_bit_5),
		cmocka_unit_test(bf16_is_refused_with_a_clear_error_where_cpuid_lacks_it),
	};

	return cmocka_run_group_tests(tests, t_group_log_capture, t_group_tmpdir_cleanup);
}

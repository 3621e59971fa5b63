/* A tiny program with USDT probes (one with a semaphore) for the usdt
 * tests. Built by the tests with gcc; needs systemtap-sdt-dev. */
#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#include <stdio.h>

#define SEM(n) __extension__ unsigned short n \
    __attribute__((unused)) __attribute__((section(".probes")))
SEM(rbtest_hit_semaphore);
SEM(rbtest_other_semaphore);
SEM(rbtest_empty_semaphore);

static volatile long sink;

int main(int argc, char **argv) {
	long big = (long)argc * 1000;
	int small = argc * 3;
	short tiny = (short)(argc + 7);
	if (rbtest_hit_semaphore)
		sink++;
	STAP_PROBE3(rbtest, hit, big, small, argv[0]);
	STAP_PROBE2(rbtest, other, tiny, -5);
	STAP_PROBE(rbtest, empty);
	printf("%ld\n", sink);
	return 0;
}

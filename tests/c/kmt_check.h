/*
 * The step reporting of the test programs written against Debian's libhsakmt 5.2.3
 * (hsakmt_client.c, and through sdma_ring.h the SDMA ones): `ok <step>` / `fail <step>
 * status=N` lines on stdout, and the number of the failed step as the return value (the
 * exit status when returned from main). Static, one copy each.
 */
#ifndef KMT_CHECK_H
#define KMT_CHECK_H
#include <hsakmt.h>
#include <stdint.h>
#include <stdio.h>

static int step;

#define CHECK(name, call)                                                         \
	do {                                                                      \
		HSAKMT_STATUS s_ = (call);                                        \
		step++;                                                           \
		if (s_ != HSAKMT_STATUS_SUCCESS) {                                \
			printf("fail %s status=%d\n", name, (int)s_);             \
			fflush(stdout);                                           \
			return step;                                              \
		}                                                                 \
	} while (0)
#define EXPECT(name, cond)                                                        \
	do {                                                                      \
		step++;                                                           \
		if (!(cond)) {                                                    \
			printf("fail %s\n", name);                                \
			fflush(stdout);                                           \
			return step;                                              \
		}                                                                 \
		printf("ok %s\n", name);                                          \
		fflush(stdout);                                                   \
	} while (0)

/*
 * hsaKmtOpenKFD, then the first topology node with compute cores: *gpu its id, *props its
 * properties. 0, or the failed step (`fail ...` said).
 */
static inline int open_kfd_gpu(uint32_t *gpu, HsaNodeProperties *props)
{
	HsaSystemProperties sys;

	*gpu = 0;
	CHECK("open_kfd", hsaKmtOpenKFD());
	CHECK("system_properties", hsaKmtAcquireSystemProperties(&sys));
	for (uint32_t n = 0; n < sys.NumNodes && !*gpu; n++) {
		CHECK("node_properties", hsaKmtGetNodeProperties(n, props));
		if (props->NumFComputeCores)
			*gpu = n;
	}
	EXPECT("gpu_node", *gpu != 0);
	return 0;
}

#endif

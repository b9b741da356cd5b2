/*
 * Debian's HIP 5.2.3 (libamdhip64, unmodified) over ROCr on the emulated gfx90a, through the
 * shim (tests/integration/test_rocr.py; issue 30's stretch goal). Public HIP API only:
 * hipGetDeviceCount, hipSetDevice, hipMalloc, hipMemcpy host->device and device->host with
 * the bytes checked, hipFree. Prints `ok <call>` per call, `fail <call> err=N` at the first
 * error (exit 1). ROCclr 5.2.3 moves a pageable hipMemcpy with its blit *kernel* on its own
 * AQL queue, which the emulated GPU cannot run: the test expects the visible failure
 * (ROCclr aborts on the queue error) until it can.
 */
#define __HIP_PLATFORM_AMD__ 1
#include <hip/hip_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CK(x)                                                                            \
	do {                                                                             \
		hipError_t e_ = (x);                                                     \
		if (e_ != hipSuccess) {                                                  \
			printf("fail %s err=%d\n", #x, (int)e_);                         \
			return 1;                                                        \
		}                                                                        \
		printf("ok %s\n", #x);                                                   \
		fflush(stdout);                                                          \
	} while (0)

int main(void)
{
	size_t sz = 1 << 20;
	char *h = malloc(sz), *b = malloc(sz);
	void *d = NULL;
	int n = 0;

	alarm(100);
	for (size_t i = 0; i < sz; i++)
		h[i] = (char)(i * 7 + 3);
	CK(hipGetDeviceCount(&n));
	CK(hipSetDevice(0));
	CK(hipMalloc(&d, sz));
	CK(hipMemcpy(d, h, sz, hipMemcpyHostToDevice));
	CK(hipMemcpy(b, d, sz, hipMemcpyDeviceToHost));
	printf("%s bytes equal=%d\n", memcmp(h, b, sz) == 0 ? "ok" : "fail", memcmp(h, b, sz) == 0);
	CK(hipFree(d));
	return 0;
}

/* SPDX-License-Identifier: MIT */
/*
 * mapped_caller <render-node> <file> [threads]
 *
 * A client whose ioctl pointers lie in a MAP_PRIVATE mapping of <file> that nothing has
 * faulted in (a sys attribute of a ualinkd mount: faulting it in means a FUSE READ to that
 * mount's daemon).  Run by tests/integration/test_caller_memory.py as a subprocess, so a
 * daemon that hangs on it hangs this process, not the test.
 *
 * Maps <file> (PROT_READ|PROT_WRITE, MAP_PRIVATE, never touched), prints "mapped", waits
 * for a line on stdin, then:
 *  - without [threads]: each caller-memory path once with its pointer in the mapping, and
 *    one line of "name=errno" pairs (0: success);
 *  - with [threads]: that many SYNCOBJ_RESETs at once from threads made beforehand (a
 *    thread made later would mmap its stack, and the process's mmap lock may be held by a
 *    daemon worker stuck on the mapping), one line "reset_threads=e1,e2,..." in order;
 *    then after one more stdin line a RESET of an ordinary array: "reset_good=errno".
 *    The threads never exit (see resetter()).
 * Nothing is allocated after "mapped" for the same reason.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ualink/ualink_drm.h>

#define PAGE 4096
#define VA 0x100000000ULL
#define MAX_THREADS 64

static int fd;
static void *mapped;
static int errs[MAX_THREADS];
static pthread_barrier_t start, done;

static int call(unsigned long cmd, void *arg)
{
	return ioctl(fd, cmd, arg) == 0 ? 0 : errno;
}

static void wait_line(void)
{
	char c;

	while (read(0, &c, 1) == 1 && c != '\n')
		;
}

static void *resetter(void *arg)
{
	struct drm_syncobj_array a = { .handles = (uintptr_t)mapped, .count_handles = 1 };

	pthread_barrier_wait(&start);
	errs[(intptr_t)arg] = call(DRM_IOCTL_SYNCOBJ_RESET, &a);
	/* Never exits: freeing its stack would munmap, which waits for the mmap lock that a
	 * stuck daemon worker may hold. The process ends with the threads still parked. */
	pthread_barrier_wait(&done);
	for (;;)
		pause();
	return NULL;
}

static int threads_mode(int n, uint32_t syncobj)
{
	pthread_t t[MAX_THREADS];
	struct drm_syncobj_array good = { .handles = (uintptr_t)&syncobj, .count_handles = 1 };
	char line[MAX_THREADS * 8 + 32];
	int i, len;

	pthread_barrier_init(&start, NULL, n + 1);
	pthread_barrier_init(&done, NULL, n + 1);
	for (i = 0; i < n; i++)
		pthread_create(&t[i], NULL, resetter, (void *)(intptr_t)i);
	printf("mapped\n");
	fflush(stdout);
	wait_line();
	pthread_barrier_wait(&start);
	pthread_barrier_wait(&done);
	len = snprintf(line, sizeof(line), "reset_threads=");
	for (i = 0; i < n; i++)
		len += snprintf(line + len, sizeof(line) - len, "%s%d", i ? "," : "", errs[i]);
	line[len++] = '\n';
	if (write(1, line, len) != len)
		return 1;
	wait_line();
	len = snprintf(line, sizeof(line), "reset_good=%d\n",
		       call(DRM_IOCTL_SYNCOBJ_RESET, &good));
	_exit(write(1, line, len) == len ? 0 : 1);
}

int main(int argc, char **argv)
{
	struct drm_syncobj_create sc = { 0 };
	union drm_amdgpu_gem_create gc = { .in = { .bo_size = PAGE,
						   .domains = AMDGPU_GEM_DOMAIN_VRAM } };
	struct drm_syncobj_array reset;
	struct drm_syncobj_timeline_array query;
	struct drm_amdgpu_gem_op op;
	struct drm_amdgpu_gem_va va;
	struct drm_amdgpu_gem_userptr up;
	uint32_t syncobj;
	char buf[64];
	int ffd, gpu_load;

	if (argc < 3 || argc > 4 || (argc == 4 && (atoi(argv[3]) < 1 ||
						    atoi(argv[3]) > MAX_THREADS))) {
		fprintf(stderr, "usage: %s RENDER FILE [THREADS]\n", argv[0]);
		return 2;
	}
	ffd = open(argv[2], O_RDONLY);
	fd = open(argv[1], O_RDWR);
	if (ffd < 0 || fd < 0) {
		perror("open");
		return 1;
	}
	mapped = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE, ffd, 0);
	if (mapped == MAP_FAILED || call(DRM_IOCTL_SYNCOBJ_CREATE, &sc)) {
		perror("mmap / SYNCOBJ_CREATE");
		return 1;
	}
	syncobj = sc.handle;
	if (argc == 4)
		return threads_mode(atoi(argv[3]), syncobj);
	printf("mapped\n");
	fflush(stdout);
	wait_line();

	reset = (struct drm_syncobj_array){ .handles = (uintptr_t)mapped, .count_handles = 1 };
	printf("syncobj_reset=%d", call(DRM_IOCTL_SYNCOBJ_RESET, &reset));
	query = (struct drm_syncobj_timeline_array){
		.handles = (uintptr_t)&syncobj, .points = (uintptr_t)mapped, .count_handles = 1 };
	printf(" syncobj_query=%d", call(DRM_IOCTL_SYNCOBJ_QUERY, &query));
	if (call(DRM_IOCTL_AMDGPU_GEM_CREATE, &gc))
		return 1;
	op = (struct drm_amdgpu_gem_op){ .handle = gc.out.handle,
		.op = AMDGPU_GEM_OP_GET_GEM_CREATE_INFO, .value = (uintptr_t)mapped };
	printf(" gem_op_create_info=%d", call(DRM_IOCTL_AMDGPU_GEM_OP, &op));
	va = (struct drm_amdgpu_gem_va){ .handle = gc.out.handle, .operation = AMDGPU_VA_OP_MAP,
		.flags = AMDGPU_VM_PAGE_READABLE, .va_address = VA, .map_size = PAGE,
		.num_syncobj_handles = 1, .input_fence_syncobj_handles = (uintptr_t)mapped };
	printf(" gem_va_input_fences=%d", call(DRM_IOCTL_AMDGPU_GEM_VA, &va));
	up = (struct drm_amdgpu_gem_userptr){ .addr = (uintptr_t)mapped, .size = PAGE,
		.flags = AMDGPU_GEM_USERPTR_READONLY | AMDGPU_GEM_USERPTR_VALIDATE };
	printf(" userptr_validate=%d", call(DRM_IOCTL_AMDGPU_GEM_USERPTR, &up));
	up = (struct drm_amdgpu_gem_userptr){ .addr = (uintptr_t)mapped, .size = PAGE,
		.flags = AMDGPU_GEM_USERPTR_READONLY };
	printf(" userptr_create=%d", call(DRM_IOCTL_AMDGPU_GEM_USERPTR, &up));
	va = (struct drm_amdgpu_gem_va){ .handle = up.handle, .operation = AMDGPU_VA_OP_MAP,
		.flags = AMDGPU_VM_PAGE_READABLE, .va_address = 2 * VA, .map_size = PAGE };
	printf(" userptr_va_map=%d", call(DRM_IOCTL_AMDGPU_GEM_VA, &va));
	gpu_load = pread(fd, buf, sizeof(buf), 2 * VA) < 0 ? errno : 0;
	printf(" userptr_gpu_load=%d\n", gpu_load);
	return 0;
}

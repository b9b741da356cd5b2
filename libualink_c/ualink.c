/* SPDX-License-Identifier: MIT */
/*
 * libualink: the C client of ualinkd's emulated amdgpu render nodes.
 *
 * Each call is one ioctl (or pread/pwrite) on the render-node fd, plus the
 * one emulator-specific step a FUSE server forces on us: the import ioctl and
 * PRIME_HANDLE_TO_FD return a dma-buf *token*, which we trade for a real fd
 * by opening <dmabuf_dir>/<token> (DESIGN.md, "A dma-buf fd from a FUSE
 * server"; spec, emulator policy 5).
 *
 * Contract (STYLE.md rule 11): every entry point returns 0 (or a count) or a
 * negative errno; output parameters are written only on success; only the
 * symbols listed in libualink.map are exported.
 */
#define _GNU_SOURCE	/* asprintf */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "ualink/ualink.h"

#define UALINK_API __attribute__((visibility("default")))

#define UALINK_DEFAULT_RENDER_NODE "/dev/dri/renderD128"

struct ualink_dev {
	int fd;			/* the render node: one DrmFile in the daemon */
	char *dmabuf_dir;	/* where dma-buf tokens are traded for fds */
};

/* drmIoctl's loop: EINTR and EAGAIN are retried (spec §1.7: an import that
 * races another import of the same handle answers EAGAIN until it settles). */
static int ualink_ioctl(int fd, unsigned long request, void *arg)
{
	int ret;

	do {
		ret = ioctl(fd, request, arg);
	} while (ret == -1 && (errno == EINTR || errno == EAGAIN));
	return ret == -1 ? -errno : ret;
}

/* "<dir of path>/../dmabuf": <mount>/dri/renderD128 -> <mount>/dri/../dmabuf.
 * The render node is a regular file, so "<path>/../.." would not resolve. */
static char *dmabuf_dir_for(const char *render_path)
{
	const char *env = getenv("UALINK_DMABUF_DIR");
	const char *slash;
	char *dir;

	if (env && *env)
		return strdup(env);
	slash = strrchr(render_path, '/');
	if (!slash)
		return strdup("../dmabuf");
	if (asprintf(&dir, "%.*s/../dmabuf", (int)(slash - render_path),
		     render_path) < 0)
		return NULL;
	return dir;
}

/* Trade a dma-buf token for the real fd. Tokens are single-use; if this
 * fails the daemon keeps the reference until the render fd is closed. */
static int open_dmabuf_token(const ualink_dev *dev, uint32_t token,
			     int oflags, int *fd_out)
{
	char path[PATH_MAX];
	int fd;

	if (token == 0)
		return -EPROTO;	/* the daemon never hands out token 0 */
	if (snprintf(path, sizeof(path), "%s/%u", dev->dmabuf_dir, token) >=
	    (int)sizeof(path))
		return -ENAMETOOLONG;
	do {
		fd = open(path, oflags);
	} while (fd == -1 && errno == EINTR);
	if (fd == -1)
		return -errno;
	*fd_out = fd;
	return 0;
}

UALINK_API int ualink_open(const char *path, ualink_dev **out)
{
	ualink_dev *dev;
	int err;

	if (!out)
		return -EINVAL;
	if (!path) {
		path = getenv("UALINK_RENDER_NODE");
		if (!path || !*path)
			path = UALINK_DEFAULT_RENDER_NODE;
	}
	dev = calloc(1, sizeof(*dev));
	if (!dev)
		return -ENOMEM;
	dev->dmabuf_dir = dmabuf_dir_for(path);
	if (!dev->dmabuf_dir) {
		err = -ENOMEM;
		goto err_free;
	}
	do {
		dev->fd = open(path, O_RDWR | O_CLOEXEC);
	} while (dev->fd == -1 && errno == EINTR);
	if (dev->fd == -1) {
		err = -errno;
		goto err_free;
	}
	*out = dev;
	return 0;

err_free:
	free(dev->dmabuf_dir);
	free(dev);
	return err;
}

UALINK_API void ualink_close(ualink_dev *dev)
{
	if (!dev)
		return;
	close(dev->fd);
	free(dev->dmabuf_dir);
	free(dev);
}

UALINK_API int ualink_fd(const ualink_dev *dev)
{
	return dev ? dev->fd : -EINVAL;
}

UALINK_API int ualink_bo_create(ualink_dev *dev, uint64_t size,
				uint64_t alignment, uint64_t domains,
				uint64_t flags, uint32_t *handle)
{
	union drm_amdgpu_gem_create args;
	int ret;

	if (!dev || !handle)
		return -EINVAL;
	memset(&args, 0, sizeof(args));
	args.in.bo_size = size;
	args.in.alignment = alignment;
	args.in.domains = domains;
	args.in.domain_flags = flags;
	ret = ualink_ioctl(dev->fd, DRM_IOCTL_AMDGPU_GEM_CREATE, &args);
	if (ret < 0)
		return ret;
	*handle = args.out.handle;
	return 0;
}

UALINK_API int ualink_bo_close(ualink_dev *dev, uint32_t handle)
{
	struct drm_gem_close args = { .handle = handle };
	int ret;

	if (!dev)
		return -EINVAL;
	ret = ualink_ioctl(dev->fd, DRM_IOCTL_GEM_CLOSE, &args);
	return ret < 0 ? ret : 0;
}

UALINK_API int ualink_export(ualink_dev *dev, uint32_t gem_handle,
			     uint64_t handle[2])
{
	union drm_amdgpu_ualink_handle args;
	int ret;

	if (!dev || !handle)
		return -EINVAL;
	memset(&args, 0, sizeof(args));
	args.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_EXPORT;
	args.in.gem_handle = gem_handle;
	ret = ualink_ioctl(dev->fd, DRM_IOCTL_AMDGPU_UALINK_HANDLE, &args);
	if (ret < 0)
		return ret;
	handle[0] = args.out.export_ualink_handle[0];
	handle[1] = args.out.export_ualink_handle[1];
	return 0;
}

UALINK_API int ualink_import(ualink_dev *dev, const uint64_t handle[2],
			     int *dmabuf_fd)
{
	union drm_amdgpu_ualink_handle args;
	int ret;

	if (!dev || !handle || !dmabuf_fd)
		return -EINVAL;
	memset(&args, 0, sizeof(args));
	args.in.op = DRM_AMDGPU_UALINK_HANDLE_OP_IMPORT;
	args.in.import_ualink_handle[0] = handle[0];
	args.in.import_ualink_handle[1] = handle[1];
	ret = ualink_ioctl(dev->fd, DRM_IOCTL_AMDGPU_UALINK_HANDLE, &args);
	if (ret < 0)
		return ret;
	return open_dmabuf_token(dev, args.out.import_dmabuf_handle,
				 O_RDWR | O_CLOEXEC, dmabuf_fd);
}

/* The kernel makes the fd close-on-exec only if DRM_CLOEXEC is asked for;
 * so do we. The token file is always opened O_RDWR (the daemon's contract). */
UALINK_API int ualink_prime_handle_to_fd(ualink_dev *dev, uint32_t gem_handle,
					 uint32_t flags, int *dmabuf_fd)
{
	struct drm_prime_handle args = {
		.handle = gem_handle, .flags = flags, .fd = -1,
	};
	int ret;

	if (!dev || !dmabuf_fd)
		return -EINVAL;
	ret = ualink_ioctl(dev->fd, DRM_IOCTL_PRIME_HANDLE_TO_FD, &args);
	if (ret < 0)
		return ret;
	return open_dmabuf_token(dev, (uint32_t)args.fd,
				 O_RDWR | ((flags & DRM_CLOEXEC) ? O_CLOEXEC : 0),
				 dmabuf_fd);
}

/* The daemon resolves our fd itself, through /proc/<pid>/fd (policy 5). */
UALINK_API int ualink_prime_fd_to_handle(ualink_dev *dev, int dmabuf_fd,
					 uint32_t *gem_handle)
{
	struct drm_prime_handle args = { .fd = dmabuf_fd };
	int ret;

	if (!dev || !gem_handle)
		return -EINVAL;
	ret = ualink_ioctl(dev->fd, DRM_IOCTL_PRIME_FD_TO_HANDLE, &args);
	if (ret < 0)
		return ret;
	*gem_handle = args.handle;
	return 0;
}

static int gem_va(ualink_dev *dev, uint32_t op, uint32_t gem_handle,
		  uint64_t va, uint64_t offset_in_bo, uint64_t size,
		  uint32_t flags)
{
	struct drm_amdgpu_gem_va args;
	int ret;

	if (!dev)
		return -EINVAL;
	memset(&args, 0, sizeof(args));
	args.handle = gem_handle;
	args.operation = op;
	args.flags = flags;
	args.va_address = va;
	args.offset_in_bo = offset_in_bo;
	args.map_size = size;
	ret = ualink_ioctl(dev->fd, DRM_IOCTL_AMDGPU_GEM_VA, &args);
	return ret < 0 ? ret : 0;
}

UALINK_API int ualink_va_map(ualink_dev *dev, uint32_t gem_handle, uint64_t va,
			     uint64_t offset_in_bo, uint64_t size,
			     uint32_t flags)
{
	return gem_va(dev, AMDGPU_VA_OP_MAP, gem_handle, va, offset_in_bo, size,
		      flags);
}

UALINK_API int ualink_va_unmap(ualink_dev *dev, uint32_t gem_handle,
			       uint64_t va, uint64_t offset_in_bo,
			       uint64_t size)
{
	return gem_va(dev, AMDGPU_VA_OP_UNMAP, gem_handle, va, offset_in_bo,
		      size, 0);
}

/*
 * GPU loads/stores are pread/pwrite at offset = VA (policy 10). FUSE may
 * split a large transfer, and a fault part-way gives a short count, so loop
 * until done, EOF or an error; an error after progress ends in a short count.
 * VAs above INT64_MAX cannot be an off_t and were never mappable.
 */
static ssize_t gpu_rw(ualink_dev *dev, uint64_t va, void *buf, size_t len,
		      int write)
{
	size_t done = 0;

	if (!dev || (!buf && len))
		return -EINVAL;
	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	if (va > (uint64_t)INT64_MAX || len > (uint64_t)INT64_MAX - va)
		return -EFAULT;
	while (done < len) {
		char *p = (char *)buf + done;
		off_t off = (off_t)(va + done);
		ssize_t n = write ? pwrite(dev->fd, p, len - done, off)
				  : pread(dev->fd, p, len - done, off);

		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0)
			return done ? (ssize_t)done : -errno;
		if (n == 0)
			break;
		done += (size_t)n;
	}
	return (ssize_t)done;
}

UALINK_API ssize_t ualink_gpu_read(ualink_dev *dev, uint64_t va, void *buf,
				   size_t len)
{
	return gpu_rw(dev, va, buf, len, 0);
}

UALINK_API ssize_t ualink_gpu_write(ualink_dev *dev, uint64_t va,
				    const void *buf, size_t len)
{
	return gpu_rw(dev, va, (void *)buf, len, 1);
}

"""Device buffers, allocated against a budget, and copies to and from them through staging memory.

Two kinds of buffer:

* device buffers (`alloc`): device-local memory for weights, KV pages and activations, filled
  through a reusable host-visible staging buffer;
* host buffers (`alloc_host`): host-visible, coherent, persistently mapped memory (device-local
  as well where the device offers it, as integrated GPUs do) for the small per-step inputs the
  host writes and the sampled ids it reads back.

Every allocation is counted; `free_bytes` is what the device could still give.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .device import Device
from .errors import DeviceMemoryError

STAGING_BYTES = 64 * 2**20
# Threads that fill the staging buffer, each a slice (numpy lets the GIL go while it copies): one
# copies from the page cache at about 8 GB/s on the H200's host, the bound of a 4b load's 1.1 s of
# upload (docs/EXPERIMENTS.md, "Two staging buffers and pre-mapped pages"). 1: the caller alone.
COPY_THREADS_ENV = "GEMMA_BATCH_VK_COPY_THREADS"
SPLIT_BYTES = 4 * 2**20  # smaller copies are not split
_USAGE = "VK_BUFFER_USAGE_STORAGE_BUFFER_BIT VK_BUFFER_USAGE_TRANSFER_SRC_BIT VK_BUFFER_USAGE_TRANSFER_DST_BIT VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT"


class Buffer:
    """One VkBuffer with its own memory; `array` is a numpy view of host-visible memory (else None)."""

    def __init__(self, handle, memory, size: int, reserved: int, label: str, array: np.ndarray | None) -> None:
        self.handle, self.memory, self.size, self.label, self.array = handle, memory, size, label, array
        self.reserved = reserved  # bytes of device memory behind it (size rounded up by the driver)


class Memory:
    def __init__(self, device: Device, limit: int | None = None) -> None:
        """`limit`: the most device memory to count on holding (--gpu-memory; None: what is free)."""
        self.dev = device
        self.limit = limit
        self.vk = device.vk
        self.allocated = 0
        self.peak = 0  # most bytes allocated at once
        self.buffers: list[Buffer] = []
        self._staging: Buffer | None = None
        self._readback: Buffer | None = None  # staging for downloads, in cached memory (`alloc_host(readback=True)`)
        self._copy_cb = device.command_buffer()
        self._copy_threads = int(os.environ.get(COPY_THREADS_ENV) or min(8, os.cpu_count() or 1))
        self._copiers: ThreadPoolExecutor | None = None  # made on the first large upload

    def _fill(self, dst: np.ndarray, src: np.ndarray) -> None:
        """dst[:len(src)] = src (uint8), split over COPY_THREADS_ENV threads."""
        threads = self._copy_threads
        if threads <= 1 or src.nbytes < SPLIT_BYTES:
            dst[: src.nbytes] = src
            return
        if self._copiers is None:
            self._copiers = ThreadPoolExecutor(threads, thread_name_prefix="staging copy")
        step = -(-src.nbytes // threads)

        def piece(start: int) -> None:
            part = src[start : start + step]
            dst[start : start + part.nbytes] = part

        for done in [self._copiers.submit(piece, start) for start in range(0, src.nbytes, step)]:
            done.result()

    # -- budget -------------------------------------------------------------------------------
    def free_bytes(self) -> int:
        """Device-local bytes not yet used (the driver's budget where VK_EXT_memory_budget exists),
        within `limit`."""
        budget = self.dev.heap_budget()
        free = budget[0] - budget[1] if budget is not None else self.dev.info.device_local_bytes - self.allocated
        if self.limit is not None:  # (less what this process holds in device memory: host-visible staging aside)
            free = min(free, self.limit - sum(b.reserved for b in self.buffers if b.array is None))
        return max(0, free)

    def _memory_type(self, bits: int, want: int, avoid: int = 0) -> int | None:
        props = self.dev.memory_properties
        for t in range(props.memoryTypeCount):
            flags = props.memoryTypes[t].propertyFlags
            if bits & (1 << t) and (flags & want) == want and not flags & avoid:
                return t
        return None

    def _create(self, size: int, label: str, host: bool, readback: bool = False) -> Buffer:
        vk = self.vk
        dev = self.dev.device
        limit = self.dev.info.max_storage_buffer_range
        if size > limit and not readback:  # (a limit on what a shader binds; readback staging is only copied into)
            raise DeviceMemoryError(
                f"{label}: one buffer of {size / 2**20:.1f} MiB exceeds {self.dev.info.name}'s largest storage "
                f"buffer ({limit / 2**20:.0f} MiB); use a smaller --kv-memory or --backend cpu")
        usage = 0
        for bit in _USAGE.split():
            usage |= getattr(vk, bit)
        handle = vk.vkCreateBuffer(dev, vk.VkBufferCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, size=max(size, 16), usage=usage,
            sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
        req = vk.vkGetBufferMemoryRequirements(dev, handle)
        local, visible = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
        cached = vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT
        if host and readback:  # read by the CPU: cached system memory (device-local BAR memory reads at PCIe latency)
            kind = (self._memory_type(req.memoryTypeBits, visible | cached, avoid=local)
                    or self._memory_type(req.memoryTypeBits, visible | cached) or self._memory_type(req.memoryTypeBits, visible))
        elif host:
            kind = self._memory_type(req.memoryTypeBits, visible | local) or self._memory_type(req.memoryTypeBits, visible)
        else:
            kind = self._memory_type(req.memoryTypeBits, local)
        free = self.free_bytes()
        if kind is None or (not host and req.size > free):
            vk.vkDestroyBuffer(dev, handle, None)
            raise DeviceMemoryError(
                f"allocation of {req.size / 2**30:.2f} GiB for {label} failed on {self.dev.info.name}: "
                f"{free / 2**30:.2f} GiB free; use a smaller --kv-memory or --backend cpu")
        try:
            memory = vk.vkAllocateMemory(dev, vk.VkMemoryAllocateInfo(
                sType=vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, allocationSize=req.size, memoryTypeIndex=kind), None)
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory):
            vk.vkDestroyBuffer(dev, handle, None)
            raise DeviceMemoryError(
                f"allocation of {req.size / 2**30:.2f} GiB for {label} failed on {self.dev.info.name}: out of device memory "
                f"({free / 2**30:.2f} GiB reported free); use a smaller --kv-memory or --backend cpu") from None
        vk.vkBindBufferMemory(dev, handle, memory, 0)
        array = None
        if host:
            ptr = vk.vkMapMemory(dev, memory, 0, req.size, 0)
            array = np.frombuffer(ptr, dtype=np.uint8, count=size)
        self.allocated += req.size
        self.peak = max(self.peak, self.allocated)
        buf = Buffer(handle, memory, size, req.size, label, array)
        self.buffers.append(buf)
        return buf

    def alloc(self, size: int, label: str) -> Buffer:
        """A device-local buffer of `size` bytes; `label` names it in errors."""
        return self._create(size, label, host=False)

    def uploaded(self, values: np.ndarray, label: str) -> Buffer:
        """A device-local buffer holding `values`' bytes."""
        buf = self.alloc(values.nbytes, label)
        self.upload(buf, values)
        return buf

    def alloc_host(self, size: int, label: str, readback: bool = False) -> Buffer:
        """A host-visible, mapped buffer (`.array` is its bytes); `readback`: one the CPU reads, in
        cached memory where the device has it."""
        return self._create(size, label, host=True, readback=readback)

    def free(self, buf: Buffer) -> None:
        vk = self.vk
        vk.vkDeviceWaitIdle(self.dev.device)
        if buf.array is not None:
            vk.vkUnmapMemory(self.dev.device, buf.memory)
        vk.vkDestroyBuffer(self.dev.device, buf.handle, None)
        vk.vkFreeMemory(self.dev.device, buf.memory, None)
        self.allocated -= buf.reserved
        self.buffers.remove(buf)

    # -- copies -------------------------------------------------------------------------------
    def _staging_buffer(self) -> Buffer:
        if self._staging is None:
            self._staging = self.alloc_host(STAGING_BYTES, "staging")
        return self._staging

    def _readback_buffer(self) -> Buffer:
        if self._readback is None:
            self._readback = self.alloc_host(STAGING_BYTES, "readback staging", readback=True)
        return self._readback

    def _copy(self, src, dst, src_offset: int, dst_offset: int, size: int) -> None:
        vk, cb = self.vk, self._copy_cb
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, flags=vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT))
        vk.vkCmdCopyBuffer(cb, src, dst, 1, [vk.VkBufferCopy(srcOffset=src_offset, dstOffset=dst_offset, size=size)])
        vk.vkEndCommandBuffer(cb)
        self.dev.submit_and_wait(cb)

    def upload(self, dst: Buffer, data: np.ndarray, offset: int = 0) -> None:
        """Copy `data`'s bytes into `dst` at byte `offset`, in staging-sized pieces."""
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if offset + raw.nbytes > dst.size:
            raise ValueError(f"upload of {raw.nbytes} bytes at {offset} overruns {dst.label} ({dst.size} bytes)")
        if dst.array is not None:
            dst.array[offset : offset + raw.nbytes] = raw
            return
        staging = self._staging_buffer()
        for start in range(0, raw.nbytes, STAGING_BYTES):
            piece = raw[start : start + STAGING_BYTES]
            self._fill(staging.array, piece)
            self._copy(staging.handle, dst.handle, 0, offset + start, piece.nbytes)

    def download(self, src: Buffer, size: int | None = None, offset: int = 0) -> np.ndarray:
        """`size` bytes of `src` from byte `offset`, as a new uint8 array."""
        size = src.size - offset if size is None else size
        if src.array is not None:
            return src.array[offset : offset + size].copy()
        staging = self._readback_buffer()
        out = np.empty(size, np.uint8)
        for start in range(0, size, STAGING_BYTES):
            n = min(STAGING_BYTES, size - start)
            self._copy(src.handle, staging.handle, offset + start, 0, n)
            out[start : start + n] = staging.array[:n]
        return out

    def close(self) -> None:
        for buf in list(self.buffers):
            self.free(buf)
        if self._copiers is not None:
            self._copiers.shutdown()
            self._copiers = None

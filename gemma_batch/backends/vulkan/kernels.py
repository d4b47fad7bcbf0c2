"""Pipelines of the compiled shaders (variants.py), built once per variant on first use, and the
recording of their dispatches.

Each push-constant layout is written once per side: as the GLSL `Push` block in the shader and
as a numpy dtype in push_constants.py; `tests/test_vulkan_shaders.py` checks that the two agree,
and `Kernels.record` checks the bytes it pushes against the dtype.

All kernels share one descriptor-set layout (storage buffers at bindings 0-15, binding 7 being
the step header) and one pipeline layout; a kernel binds the buffers it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ...startup import phase
from .coop_tiles import DEFAULT_PROMPT_FORM, prompt_shape_key
from .device import Device
from .push_constants import PUSH, PUSH_BYTES, SPECIALIZED
from .variants import (ATTENTION_MAX_GROUP, GATED_SPLIT_MAX_ROW, POST_NORM_MAX_ROW, POST_NORM_WG, VARIANTS,
                       gated_row_vec, post_norm_row_shape)

if TYPE_CHECKING:
    from ...model.config import Gemma3Config

NUM_BINDINGS = 16  # the backend checks maxPerStageDescriptorStorageBuffers
META_BINDING = 7


class Kernels:
    """Pipelines, built once per variant on first use, and the recording of dispatches.

    Specialization constants, given to every pipeline (a shader without one ignores it):
    0, `x_lo`: the cooperative matmuls' X_LO, multiply x as fp16 hi + lo (True) or hi alone
    (coopmat.py); 1, `kv_group`: attention.comp's GMAX, the query heads per KV head it serves
    (the model's, or at most ATTENTION_MAX_GROUP); 2, matmul_epilogue.glsl's EPI_VEC, the vec4 of a
    row of `hidden` values each of POST_NORM_WG invocations holds (at most EPILOGUE_VEC4); 3 and 4,
    reduce.comp's post-norm workgroup: its invocations and their vec4 each (post_norm_row_shape);
    5, reduce_gated_split_rows' ACT_VEC for rows of `intermediate` values (gated_row_vec); 6,
    `fragment_loads`: fp16 weight tiles stored and read in the matrix units' fragment order
    (coop_fragment.glsl, fragment_order.py); 7, ...: a pipeline recorded with `specialize`, its
    push constants named in SPECIALIZED."""

    def __init__(self, device: Device, x_lo: bool = True, kv_group: int = ATTENTION_MAX_GROUP,
                 hidden: int = POST_NORM_MAX_ROW, intermediate: int = GATED_SPLIT_MAX_ROW,
                 fragment_loads: bool = False) -> None:
        self.dev = device
        # the specialization constants by id (VkBool32 or uint)
        self.constants = (int(x_lo), kv_group, -(-hidden // (4 * POST_NORM_WG)), *post_norm_row_shape(hidden),
                          gated_row_vec(intermediate), int(fragment_loads))
        vk = self.vk = device.vk
        bindings = [
            vk.VkDescriptorSetLayoutBinding(binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                            descriptorCount=1, stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
            for i in range(NUM_BINDINGS)
        ]
        self.set_layout = vk.vkCreateDescriptorSetLayout(device.device, vk.VkDescriptorSetLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, bindingCount=NUM_BINDINGS, pBindings=bindings), None)
        push = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=PUSH_BYTES)
        self.layout = vk.vkCreatePipelineLayout(device.device, vk.VkPipelineLayoutCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, setLayoutCount=1, pSetLayouts=[self.set_layout],
            pushConstantRangeCount=1, pPushConstantRanges=[push]), None)
        self.pipelines: dict[str, object] = {}
        self._modules: list = []
        self._pools: list = []
        self._pool_left = 0
        self._sets: dict[tuple, object] = {}  # the buffers of every binding -> their set, made once
        self._barriers: dict[tuple[int, int], object] = {}  # (src, dst access masks) -> a VkMemoryBarrier[1]
        self.prompt_forms: dict[str, str] = {}  # tuning.shape_key -> the prompt tile's form, where not the default

    @property
    def x_lo(self) -> bool:
        """Whether the cooperative matmuls multiply x as fp16 hi + lo (specialization constant 0)."""
        return bool(self.constants[0])

    @property
    def fragment_loads(self) -> bool:
        """Whether fp16 weight tiles are in fragment order (specialization constant 6)."""
        return bool(self.constants[6])

    def prompt_form(self, N: int, K: int, gated: bool) -> str:
        """The prompt tile's form (coop_tiles.PROMPT_FORMS) for a matmul of N outputs over K:
        tuning.py's choice on this device, else the default."""
        return self.prompt_forms.get(prompt_shape_key(N, K, gated), DEFAULT_PROMPT_FORM)

    @classmethod
    def for_model(cls, device: Device, cfg: Gemma3Config, x_lo: bool, fragment_loads: bool = False) -> Kernels:
        """The kernels as the backend builds them for `cfg`: its query heads per KV head, hidden and
        intermediate sizes, the run's input mode (`x_lo`: coopmat.split_inputs), and whether the
        weight tiles are in fragment order (fragment_order.py decides)."""
        return cls(device, x_lo=x_lo, kv_group=cfg.num_heads // cfg.num_kv_heads,
                   hidden=cfg.hidden_size, intermediate=cfg.intermediate_size, fragment_loads=fragment_loads)

    def pipeline(self, name: str, special: tuple[int, ...] = ()):
        """Kernel `name`'s pipeline, `special` (its SPECIALIZED values) the constants after `constants`."""
        key = f"{name}@{','.join(map(str, special))}" if special else name
        if key not in self.pipelines:
            with phase("pipelines"):
                self._create(name, key, special)
        return self.pipelines[key]

    def _create(self, name: str, key: str, special: tuple[int, ...]) -> None:
        """Compile kernel `name`'s pipeline (its SPIR-V with the constants and `special`) as `key`."""
        vk = self.vk
        path = VARIANTS[name].spv
        try:
            code = path.read_bytes()
        except OSError as e:
            raise FileNotFoundError(f"shader {path} is missing ({e.strerror}); run `python shaders/build.py`") from None
        module = vk.vkCreateShaderModule(self.dev.device, vk.VkShaderModuleCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, codeSize=len(code), pCode=code), None)
        self._modules.append(module)
        values = (*self.constants, *special)
        constants = np.array(values, np.uint32).tobytes()
        info = vk.VkSpecializationInfo(
            mapEntryCount=len(values),
            pMapEntries=[vk.VkSpecializationMapEntry(constantID=i, offset=4 * i, size=4) for i in range(len(values))],
            dataSize=len(constants), pData=vk.ffi.from_buffer(constants))
        stage = vk.VkPipelineShaderStageCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, stage=vk.VK_SHADER_STAGE_COMPUTE_BIT,
            module=module, pName="main", pSpecializationInfo=info)
        flags = vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR if self.dev.statistics else 0  # (pipeline_stats.py)
        self.pipelines[key] = vk.vkCreateComputePipelines(self.dev.device, None, 1, [vk.VkComputePipelineCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, flags=flags, stage=stage, layout=self.layout)], None)[0]

    def descriptor_set(self, buffers: dict[int, object], dummy) -> object:
        """A descriptor set binding `buffers` (binding -> Buffer); unused bindings get `dummy`. The
        same buffers get the same set: a step's recordings (recordings.py) bind mostly the same
        buffers, and making a set costs more than the rest of a dispatch's recording."""
        key = tuple(buffers.get(binding, dummy) for binding in range(NUM_BINDINGS))
        made = self._sets.get(key)
        if made is not None:
            return made
        vk = self.vk
        if self._pool_left == 0:
            size = 256
            self._pools.append(vk.vkCreateDescriptorPool(self.dev.device, vk.VkDescriptorPoolCreateInfo(
                sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO, maxSets=size, poolSizeCount=1,
                pPoolSizes=[vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=size * NUM_BINDINGS)]), None))
            self._pool_left = size
        self._pool_left -= 1
        dset = vk.vkAllocateDescriptorSets(self.dev.device, vk.VkDescriptorSetAllocateInfo(
            sType=vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, descriptorPool=self._pools[-1],
            descriptorSetCount=1, pSetLayouts=[self.set_layout]))[0]
        # The writes as plain C structs: the `vulkan` package's struct classes cost about 20 us a
        # field, 3.5 s of a 4b job's start-up over its 9,925 sets.
        writes = vk.ffi.new("VkWriteDescriptorSet[]", NUM_BINDINGS)
        infos = vk.ffi.new("VkDescriptorBufferInfo[]", NUM_BINDINGS)
        for binding in range(NUM_BINDINGS):
            buf = buffers.get(binding, dummy)
            info, write = infos[binding], writes[binding]
            info.buffer, info.offset, info.range = buf.handle, 0, buf.size
            write.sType, write.dstSet, write.dstBinding = vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, dset, binding
            write.descriptorCount, write.descriptorType = 1, vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
            write.pBufferInfo = infos + binding
        vk.vkUpdateDescriptorSets(self.dev.device, NUM_BINDINGS, writes, 0, vk.ffi.NULL)
        self._sets[key] = dset
        return dset

    def record(self, cb, name: str, dset, push: dict[str, float | int], indirect, indirect_offset: int,
               specialize: bool = False) -> None:
        """Record one dispatch of kernel `name` whose grid is read from `indirect` at the offset;
        `specialize`: with its SPECIALIZED push constants' values built into the pipeline too."""
        self._bind(cb, name, dset, push, specialize)
        self.vk.lib.vkCmdDispatchIndirect(cb, indirect.handle, indirect_offset)
        self._barrier(cb)

    def record_direct(self, cb, name: str, dset, push: dict[str, float | int], groups: int,
                      specialize: bool = False) -> None:
        """Record one dispatch of kernel `name` over a fixed number of workgroups (`specialize` as `record`)."""
        self._bind(cb, name, dset, push, specialize)
        self.vk.lib.vkCmdDispatch(cb, groups, 1, 1)
        self._barrier(cb)

    def run_direct(self, name: str, dset, push: dict[str, float | int], groups: int) -> None:
        """Run one dispatch of kernel `name` now, in a command buffer of its own, and wait for it
        (work outside the recorded step: a probe, a conversion at load)."""
        vk, dev = self.vk, self.dev
        cb = dev.command_buffer()
        try:
            vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
            self.record_direct(cb, name, dset, push, groups)
            vk.vkEndCommandBuffer(cb)
            dev.submit_and_wait(cb)
        finally:
            vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cb])

    def _bind(self, cb, name: str, dset, push: dict[str, float | int], specialize: bool) -> None:
        vk = self.vk
        source = VARIANTS[name].source
        if specialize and source not in SPECIALIZED:
            raise ValueError(f"kernel {name}: {source}.comp takes no specialised push constants")
        dtype, special = PUSH[source], tuple(int(push[k]) for k in SPECIALIZED[source]) if specialize else ()
        values = np.zeros((), dtype)
        if set(push) != set(dtype.names):
            raise ValueError(f"kernel {name}: push constants {sorted(push)} do not match its layout {dtype.names}")
        for key, value in push.items():
            values[key] = value
        raw = values.tobytes()
        if len(raw) > PUSH_BYTES:
            raise ValueError(f"kernel {name}: {len(raw)} bytes of push constants exceed {PUSH_BYTES}")
        # (the C functions themselves: the `vulkan` package's wrappers cost more than recording)
        lib, ffi = vk.lib, vk.ffi
        lib.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.pipeline(name, special))
        lib.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.layout, 0, 1,
                                    ffi.new("VkDescriptorSet[1]", [dset]), 0, ffi.NULL)
        lib.vkCmdPushConstants(cb, self.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(raw), ffi.from_buffer(raw))

    def _barrier(self, cb, src_stage=None, src=None, dst_stage=None, dst=None) -> None:
        """Later dispatches see this one's writes (by default: shader writes, then shader reads and writes)."""
        vk = self.vk
        shader, access = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT
        masks = (vk.VK_ACCESS_SHADER_WRITE_BIT if src is None else src, access if dst is None else dst)
        barrier = self._barriers.get(masks)
        if barrier is None:
            barrier = self._barriers[masks] = vk.ffi.new("VkMemoryBarrier[1]", [{
                "sType": vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, "srcAccessMask": masks[0], "dstAccessMask": masks[1]}])
        vk.lib.vkCmdPipelineBarrier(cb, src_stage or shader, dst_stage or shader, 0, 1, barrier, 0, vk.ffi.NULL, 0, vk.ffi.NULL)

    def wait_host(self, cb, event) -> None:
        """Later dispatches wait until the host sets `event` (vkSetEvent), and see what the host
        wrote before setting it."""
        vk = self.vk
        barrier = vk.VkMemoryBarrier(sType=vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER, srcAccessMask=vk.VK_ACCESS_HOST_WRITE_BIT,
                                     dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT)
        vk.vkCmdWaitEvents(cb, 1, [event], vk.VK_PIPELINE_STAGE_HOST_BIT, vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                           1, [barrier], 0, None, 0, None)

    def begin_step(self, cb) -> None:
        """Begin recording a step into `cb`. The step before may still be running (submitted ahead,
        backend.submit): its shader writes (scratch, KV pages, its sampled ids) come before this
        step's writes and reads, its transfers' too."""
        vk = self.vk
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
        self._barrier(cb, dst_stage=vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                      dst=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT)

    def zero(self, cb, buffers: list) -> None:
        """Fill `buffers` with zeros before the dispatches recorded after this read or write them."""
        vk = self.vk
        for buf in buffers:
            vk.vkCmdFillBuffer(cb, buf.handle, 0, buf.size, 0)
        self._barrier(cb, src_stage=vk.VK_PIPELINE_STAGE_TRANSFER_BIT, src=vk.VK_ACCESS_TRANSFER_WRITE_BIT)

    def end_step(self, cb) -> None:
        """Make the step's shader writes visible to the host and to transfers, and end `cb`."""
        vk = self.vk
        self._barrier(cb, dst_stage=vk.VK_PIPELINE_STAGE_HOST_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
                      dst=vk.VK_ACCESS_HOST_READ_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT)
        vk.vkEndCommandBuffer(cb)

    def reset_sets(self) -> None:
        """Free every descriptor set (before the backend builds them again for larger buffers)."""
        for pool in self._pools:
            self.vk.vkDestroyDescriptorPool(self.dev.device, pool, None)
        self._pools, self._pool_left, self._sets = [], 0, {}

    def close(self) -> None:
        vk, dev = self.vk, self.dev.device
        self.reset_sets()
        for pipe in self.pipelines.values():
            vk.vkDestroyPipeline(dev, pipe, None)
        for module in self._modules:
            vk.vkDestroyShaderModule(dev, module, None)
        vk.vkDestroyPipelineLayout(dev, self.layout, None)
        vk.vkDestroyDescriptorSetLayout(dev, self.set_layout, None)

"""Step 1 of 3 of reading the SASS the NVIDIA Vulkan driver compiled: each named kernel (or
experimental spv/ file) is built into an empty VkPipelineCache and the cache's data written to
$OUT/sass/<name>.cache. Then, here, `extract.py` unpacks the code and, on the GPU machine,
`disasm.sh` disassembles it (its CUDA toolkit has nvdisasm).

    python3 sass.py attention_float16_split_qk,reduce_post_norm_split [spv/file.spv ...]
    SPECIAL=256,8,4,16,64,8 python3 sass.py attention_float16_split_qk   # with constants 5, ... too"""
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "2026-11-24-h100-attention/experiments"))
sys.path.insert(0, str(HERE.parents[3]))
from common import file_variant  # noqa: E402
from gemma_batch.backends.vulkan import kernels as Kmod  # noqa: E402
from gemma_batch.backends.vulkan.device import Device  # noqa: E402
from gemma_batch.bench.shapes import shape_config  # noqa: E402
from vulkan import _vulkan  # noqa: E402  (the binding has no wrapper for vkGetPipelineCacheData)


def cache_data(vk, device, cache) -> bytes:
    size = vk.ffi.new("size_t *")
    _vulkan.lib.vkGetPipelineCacheData(device, cache, size, vk.ffi.NULL)
    buf = vk.ffi.new("char[]", size[0])
    _vulkan.lib.vkGetPipelineCacheData(device, cache, size, buf)
    return vk.ffi.buffer(buf, size[0])[:]


def main() -> None:
    out_dir = Path(os.environ.get("OUT", ".")) / "sass"
    out_dir.mkdir(parents=True, exist_ok=True)
    names = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] else []
    for spv in sys.argv[2:]:  # experimental builds: named after the file, with its variant's source
        path = Path(spv)
        variant = next(n for n in sorted(Kmod.VARIANTS, key=len, reverse=True) if path.stem.endswith(n))
        Kmod.VARIANTS[path.stem] = file_variant(path.stem, Kmod.VARIANTS[variant].source, path.resolve())
        names.append(path.stem)
    dev = Device()
    vk = dev.vk
    kernels = Kmod.Kernels.for_model(dev, shape_config("4b"))
    values = (*kernels.constants, *(int(v) for v in os.environ.get("SPECIAL", "").split(",") if v))
    constants = np.array(values, np.uint32).tobytes()
    for name in names:
        cache = vk.vkCreatePipelineCache(dev.device, vk.VkPipelineCacheCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO), None)
        code = Kmod.VARIANTS[name].spv.read_bytes()
        module = vk.vkCreateShaderModule(dev.device, vk.VkShaderModuleCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, codeSize=len(code), pCode=code), None)
        special = vk.VkSpecializationInfo(
            mapEntryCount=len(values),
            pMapEntries=[vk.VkSpecializationMapEntry(constantID=i, offset=4 * i, size=4) for i in range(len(values))],
            dataSize=len(constants), pData=vk.ffi.from_buffer(constants))
        stage = vk.VkPipelineShaderStageCreateInfo(sType=vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                                                   stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module, pName="main",
                                                   pSpecializationInfo=special)
        pipe = vk.vkCreateComputePipelines(dev.device, cache, 1, [vk.VkComputePipelineCreateInfo(
            sType=vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO, stage=stage, layout=kernels.layout)], None)[0]
        blob = cache_data(vk, dev.device, cache)
        (out_dir / f"{name}.cache").write_bytes(blob)
        print(f"{name}: cache {len(blob)} B", flush=True)
        vk.vkDestroyPipeline(dev.device, pipe, None)
        vk.vkDestroyShaderModule(dev.device, module, None)
        vk.vkDestroyPipelineCache(dev.device, cache, None)
    kernels.close()
    dev.close()


if __name__ == "__main__":
    main()

"""Register / shared-memory statistics of every pipeline (VK_KHR_pipeline_executable_properties)."""
import sys
import vulkan as vk
from gemma_batch.backends.vulkan import device as devmod, kernels as kmod

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import stats_hook  # noqa: F401,E402  (patches vkCreateDevice and vkCreateComputePipelines: statistics kept)

dev = devmod.Device()
k = kmod.Kernels(dev, x_lo=True, kv_group=2, hidden=2560)
props_fn = vk.vkGetDeviceProcAddr(dev.device, "vkGetPipelineExecutablePropertiesKHR")
stats_fn = vk.vkGetDeviceProcAddr(dev.device, "vkGetPipelineExecutableStatisticsKHR")
want = sys.argv[1:] or list(kmod.VARIANTS)
for name in want:
    try:
        pipe = k.pipeline(name)
    except Exception as e:  # noqa: BLE001
        print(f"{name}: {type(e).__name__} {e}"); continue
    info = vk.VkPipelineInfoKHR(sType=vk.VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, pipeline=pipe)
    execs = list(props_fn(dev.device, info))
    for i, _ in enumerate(execs):
        einfo = vk.VkPipelineExecutableInfoKHR(sType=vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, pipeline=pipe, executableIndex=i)
        out = []
        for s in list(stats_fn(dev.device, einfo)):
            fmt = s.format
            v = s.value
            val = {0: v.b32, 1: v.i64, 2: v.u64, 3: v.f64}.get(fmt)
            out.append(f"{vk.ffi.string(s.name).decode() if not isinstance(s.name, str) else s.name}={val}")
        print(f"{name}[{i}]: " + ", ".join(out), flush=True)

"""Print what coop_fragment_probe.comp reads on this device: components per lane, then each lane's
(row, column) per component, against fragment_order.ORDER."""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gemma_batch.backends.vulkan import fragment_order as F  # noqa: E402
from gemma_batch.backends.vulkan.device import Device  # noqa: E402
from gemma_batch.backends.vulkan.kernels import Kernels  # noqa: E402
from gemma_batch.backends.vulkan.memory import Memory  # noqa: E402

dev = Device()
mem = Memory(dev)
kernels = Kernels(dev)
words = 257
src, out = mem.alloc(512, "tile"), mem.alloc(4 * words, "out")
mem.upload(src, np.arange(256, dtype=np.float16))
mem.upload(out, np.full(words, 0xFFFFFFFF, np.uint32))
dset = kernels.descriptor_set({0: src, 1: out}, out)
vk = kernels.vk
cb = dev.command_buffer()
vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo(sType=vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO))
kernels.record_direct(cb, "coop_fragment_probe", dset, {"words": words}, 1)
vk.vkEndCommandBuffer(cb)
dev.submit_and_wait(cb)
got = mem.download(out).view(np.uint32)
print("components per lane:", got[0])
for lane in range(32):
    print(lane, [divmod(int(v), 16) for v in got[1 + 8 * lane:9 + 8 * lane]],
          "expected", [divmod(int(v), 16) for v in F.ORDER[8 * lane:8 * lane + 8]])

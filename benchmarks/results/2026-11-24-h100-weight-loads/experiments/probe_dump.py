"""Print what coop_fragment_probe.comp reads on this device (fragment_order.read_order): components
per lane, then each lane's (row, column) per component, against fragment_order.ORDER. (Call 9 ran
an earlier copy that recorded the probe's dispatch itself; the committed one reads it through
read_order, which does the same.)"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gemma_batch.backends.vulkan import fragment_order as F  # noqa: E402
from gemma_batch.backends.vulkan.device import Device  # noqa: E402
from gemma_batch.backends.vulkan.kernels import Kernels  # noqa: E402
from gemma_batch.backends.vulkan.memory import Memory  # noqa: E402

dev = Device()
got = F.read_order(Kernels(dev), Memory(dev))
print("components per lane:", got[0])
for lane in range(32):
    print(lane, [divmod(int(v), 16) for v in got[1 + 8 * lane:9 + 8 * lane]],
          "expected", [divmod(int(v), 16) for v in F.ORDER[8 * lane:8 * lane + 8]])

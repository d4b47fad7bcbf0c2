"""What the device's cooperative-matrix support lists: the VK_KHR_cooperative_matrix shapes and
types, and which cooperative-matrix and float extensions the driver offers.

    python3 coop_props.py"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
from gemma_batch.backends.vulkan.device import create_instance, load_vulkan  # noqa: E402
from gemma_batch.backends.vulkan.device import list_devices  # noqa: E402

TYPES = {0: "f16", 1: "f32", 2: "f64", 3: "s8", 4: "s16", 5: "s32", 6: "s64", 7: "u8", 8: "u16", 9: "u32",
         10: "u64", 1000141000: "bf16", 1000491002: "e4m3", 1000491003: "e5m2"}
SCOPES = {1: "device", 2: "workgroup", 3: "subgroup", 5: "queue family"}

if __name__ == "__main__":
    vk = load_vulkan()
    instance = create_instance(vk)
    info = list_devices()[0]
    print(info.name, info.driver)
    print("extensions:", sorted(e for e in info.extensions if "cooperative" in e or "float" in e or "bfloat" in e
                                or "fp8" in e.lower()))
    pd = vk.vkEnumeratePhysicalDevices(instance)[0]
    query = vk.vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
    for p in query(pd):
        t = lambda c: TYPES.get(int(c), str(int(c)))  # noqa: E731
        print(f"  M{p.MSize} N{p.NSize} K{p.KSize}  A {t(p.AType)} B {t(p.BType)} C {t(p.CType)} -> {t(p.ResultType)}"
              f"  {SCOPES.get(int(p.scope), p.scope)}{' saturating' if p.saturatingAccumulation else ''}")

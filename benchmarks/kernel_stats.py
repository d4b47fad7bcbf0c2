"""Registers, shared memory and binary size of every kernel, as the driver compiled it, and how
many of its workgroups an NVIDIA Hopper SM holds at once.

    python benchmarks/kernel_stats.py 4b [--kernels coop_t16,coop_gated_t16,...]

The statistics come from VK_KHR_pipeline_executable_properties (pipeline_stats.py), built with
the shape's specialization constants (query heads per KV head, hidden size) and the run's input
mode (GEMMA_BATCH_VK_COOPMAT_INPUTS, else the default fp16 KV pages') and, where the device's fragment order is known, weight tiles in
fragment order (fragment_order.py), as the backend builds them. On an NVIDIA device it also prints the workgroups resident
per SM under Hopper's limits (65,536 registers allocated per warp in units of 256, 227 KiB of
shared memory plus 1 KiB reserved per workgroup, 64 warps, 32 workgroups): the first wave of a
dispatch is that times the SM count, and a grid just past it runs a second, nearly empty wave.
"""

from __future__ import annotations

import argparse

from gemma_batch.backends.vulkan import coopmat, fragment_order, pipeline_stats
from gemma_batch.backends.vulkan.device import Device
from gemma_batch.backends.vulkan.kernels import Kernels
from gemma_batch.backends.vulkan.memory import Memory
from gemma_batch.backends.vulkan.variants import VARIANTS
from gemma_batch.bench.shapes import shape_config

NVIDIA = 0x10DE
HOPPER = {"registers": 65536, "shared": 227 * 1024, "reserved": 1024, "warps": 64, "groups": 32}


def hopper_resident(registers: int, shared: int, invocations: int) -> int:
    """Workgroups of that kernel one Hopper SM holds at once."""
    warps = -(-invocations // 32)
    warp_registers = -(-registers * 32 // 256) * 256
    by_registers = (HOPPER["registers"] // warp_registers) // warps
    by_shared = (HOPPER["shared"] + HOPPER["reserved"]) // (shared + HOPPER["reserved"])
    return min(by_registers, by_shared, HOPPER["warps"] // warps, HOPPER["groups"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape")
    parser.add_argument("--kernels", default="", help="comma-separated variant names (default: every one)")
    args = parser.parse_args()
    cfg = shape_config(args.shape)
    dev = Device(capture_statistics=True)
    if not dev.statistics:
        raise SystemExit(f"{dev.info.name} does not expose {pipeline_stats.EXTENSION}")
    mem = Memory(dev)
    kernels = fragment_order.model_kernels(Kernels.for_model(dev, cfg, coopmat.split_inputs("fp16")), mem, cfg)  # as the backend builds them
    nvidia = dev.info.vendor_id == NVIDIA
    names = args.kernels.split(",") if args.kernels else list(VARIANTS)
    print(f"{dev.info.name}; specialization constants of shape {args.shape}")
    print(f"{'kernel':36s} {'invocations':>11s} {'registers':>9s} {'shared B':>9s} {'binary B':>9s}"
          + (f" {'per SM (Hopper)':>15s}" if nvidia else ""))
    for name in names:
        if name.startswith("coop") and not dev.coopmat:
            continue  # the device cannot build the cooperative-matrix kernels
        stats = pipeline_stats.statistics(kernels, name)
        invocations = pipeline_stats.workgroup_size(VARIANTS[name].spv.read_bytes(), kernels.constants)
        regs, shared = stats.get("Register Count"), stats.get("Shared Memory Size")
        line = f"{name:36s} {invocations:11d} {regs!s:>9s} {shared!s:>9s} {stats.get('Binary Size')!s:>9s}"
        if nvidia and regs is not None and shared is not None:
            line += f" {hopper_resident(int(regs), int(shared), invocations):15d}"
        print(line, flush=True)


if __name__ == "__main__":
    main()

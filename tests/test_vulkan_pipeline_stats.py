"""pipeline_stats.py: workgroup sizes read back from the committed SPIR-V (the host's mirrors of
them agree), and the driver's statistics where it gives them, nothing (and no failure) where it
does not."""

from __future__ import annotations

import pytest

from gemma_batch.backends.vulkan import pipeline_stats
from gemma_batch.backends.vulkan.device import NEEDS_WORKGROUP
from gemma_batch.backends.vulkan.variants import (COOP_REDUCE_WG, GATED_SPLIT_PIECE, POST_NORM_WG, VARIANTS,
                                                  post_norm_row_shape)


# The workgroup sizes the host's grid and row arithmetic assumes, each written there once.
HOST_SIZES = {
    "sample": NEEDS_WORKGROUP,
    "matmul_post_norm_bf16": POST_NORM_WG,
    "reduce_rows": COOP_REDUCE_WG,
    "reduce_qk_rope_float16": COOP_REDUCE_WG,
    "reduce_gated_split": GATED_SPLIT_PIECE // 4,
}


@pytest.mark.parametrize("name", sorted(HOST_SIZES))
def test_the_spirv_workgroup_sizes_are_the_ones_the_host_assumes(name):
    assert pipeline_stats.workgroup_size(VARIANTS[name].spv.read_bytes()) == HOST_SIZES[name]


def test_a_workgroup_size_set_by_specialization_is_read_with_the_constants():
    """reduce.comp's post-norm takes its workgroup size from specialization constant 3
    (variants.post_norm_row_shape): the pipeline's constants give it, the SPIR-V's default without."""
    spv = VARIANTS["reduce_post_norm_split"].spv.read_bytes()
    for hidden, invocations in ((2560, 640), (5376, 672), (1152, 288)):
        assert post_norm_row_shape(hidden)[0] == invocations
        assert pipeline_stats.workgroup_size(spv, (1, 2, 5, *post_norm_row_shape(hidden))) == invocations
    assert pipeline_stats.workgroup_size(spv) == POST_NORM_WG  # the shader's default, 128


def test_statistics_where_the_driver_has_them():
    vulkan = pytest.importorskip("vulkan")
    del vulkan
    from gemma_batch.backends.vulkan.device import Device
    from gemma_batch.backends.vulkan.errors import VulkanUnavailable
    from gemma_batch.backends.vulkan.kernels import Kernels

    try:
        dev = Device(capture_statistics=True)
    except VulkanUnavailable as e:
        pytest.skip(str(e))
    try:
        kernels = Kernels(dev)
        stats = pipeline_stats.statistics(kernels, "embed_f32")
        if pipeline_stats.EXTENSION not in dev.info.extensions:
            assert not dev.statistics and stats == {}
        else:  # NVIDIA's and RADV's both report registers and a binary size, under names of their own
            assert dev.statistics and stats
            assert any(isinstance(v, int) and v > 0 for v in stats.values()), stats
        assert "embed_f32" in kernels.pipelines  # built either way, and usable
        kernels.close()
    finally:
        dev.close()

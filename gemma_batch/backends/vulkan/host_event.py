"""An event the host sets and a recorded step waits on (`Kernels.wait_host`): a step's sampler
waits for the grammar masks the host computes while the step runs (`VulkanBackend.allow`)."""

from __future__ import annotations

from .device import Device


class HostEvent:
    """Created set: a recording that waits on it goes straight on until `reset`."""

    def __init__(self, device: Device) -> None:
        vk = self.vk = device.vk
        self.dev = device.device
        self.handle = vk.vkCreateEvent(self.dev, vk.VkEventCreateInfo(sType=vk.VK_STRUCTURE_TYPE_EVENT_CREATE_INFO), None)
        vk.vkSetEvent(self.dev, self.handle)

    def reset(self) -> None:
        """The next step that waits on it stops there until `set`. Only while no step waiting on
        it is running."""
        self.vk.vkResetEvent(self.dev, self.handle)

    def set(self) -> None:
        self.vk.vkSetEvent(self.dev, self.handle)

    def free(self) -> None:
        self.vk.vkDestroyEvent(self.dev, self.handle, None)

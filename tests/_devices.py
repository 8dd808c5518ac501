"""The devices the device tests share: each preset, by the name its published figures use."""

from emulator.machine.device import Device

DEVICES = {"H100": Device.h100(), "H200": Device.h200(), "A100": Device.a100()}

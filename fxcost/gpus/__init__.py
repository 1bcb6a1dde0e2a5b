"""GPUs: the spec database (``gpus.csv``), the GPUs held out of every fit, and CUDA occupancy."""

from fxcost.gpus.database import (
    DEFAULT_DEVICES,
    HELD_OUT_DEVICES,
    Device,
    DeviceFileError,
    UnknownDeviceError,
    device_names,
    get_device,
    load_devices,
)

__all__ = [
    "DEFAULT_DEVICES",
    "HELD_OUT_DEVICES",
    "Device",
    "DeviceFileError",
    "UnknownDeviceError",
    "device_names",
    "get_device",
    "load_devices",
]

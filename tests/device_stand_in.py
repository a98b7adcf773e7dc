"""A GPU stand-in for machines without one: NumPy arrays posing as device memory.

The arrays are an ndarray subclass (`DeviceArray`), so every computation runs on the CPU exactly as
on the CPU device, but zerompi/comm.py sees memory that the device `holds`: with
`mpi_reads_device_memory=False` every collective on it goes through the pinned-host staging path,
with True it goes to MPI directly after a `synchronize`. The counters say what happened. (mpi4py's
own tests use the same trick: host memory behind a device-array interface.)
"""
import numpy as np

from zerompi.device import CPU


class DeviceArray(np.ndarray):
    """Host memory that the stand-in device claims as its own."""


class StandInGPU(CPU):
    name = "stand-in gpu (host memory)"
    is_gpu = True

    def __init__(self):
        self.synchronized = self.to_host = self.from_host = 0
        self.pinned = []

    def zeros(self, shape, dtype):
        return np.zeros(shape, dtype=dtype).view(DeviceArray)

    def holds(self, array):
        return isinstance(array, DeviceArray)

    def from_numpy(self, host_array):
        return np.array(host_array).view(DeviceArray)

    def synchronize(self):
        self.synchronized += 1

    def pinned_bytes(self, nbytes):
        self.pinned.append(nbytes)
        return np.zeros(nbytes, dtype=np.uint8)

    def copy_to_host(self, device_array, host_array):
        assert self.holds(device_array) and not self.holds(host_array)
        self.to_host += 1
        np.copyto(host_array, device_array)

    def copy_from_host(self, host_array, device_array):
        assert self.holds(device_array) and not self.holds(host_array)
        self.from_host += 1
        np.copyto(device_array, host_array)

"""gpu_shortfall: a host shows fewer GPUs than it promises; say which case it is (nvidia-smi missing,
failing, or listing fewer) and what to do about it."""

from __future__ import annotations

DOCUMENTATION = """
name: nvidia_driver_advice
short_description: the GPU count check's message, with the cause and the fix
"""

RERUN = "ansible-playbook provision.yml --tags nvidia_driver"


def gpu_shortfall(host: str, promised, found, smi_rc, smi_error: str, pci_count, secure_boot: str = "") -> str:
    promised, found, pci = int(promised), int(found), int(pci_count or 0)
    head = f"{host}: expected {promised} GPUs, nvidia-smi shows {found}"
    attached = (f"lspci lists {pci} NVIDIA GPU(s)" + ("" if pci >= promised else
                f": the VM has fewer GPUs attached than promised; check the instance type and its GPU "
                f"attachment with the provider, or set gpus: {pci} in the inventory"))
    error = " ".join(str(smi_error or "").split())[:200]
    if smi_rc is not None and int(smi_rc) != 0 and ("No such file" in error or int(smi_rc) in (2, 127)):
        return (f"{head}: nvidia-smi is not installed (no driver); {attached}. Install it with the driver role: "
                f"{RERUN}")
    if smi_rc is not None and int(smi_rc) != 0:
        sb = (" Secure Boot is enabled: an unsigned (DKMS) module is refused; use the distribution's signed "
              "driver or enroll the key (mokutil)." if secure_boot == "enabled" else "")
        return (f"{head}: nvidia-smi fails ({error}); {attached}. The driver does not load: reboot after a driver "
                f"install (nvidia_driver_skip_reboot), see `dmesg | grep -i nvidia`, then {RERUN}.{sb}")
    if pci > found:
        return (f"{head} while {attached}: a GPU is not usable (fallen off the bus or in an error state); see "
                "`nvidia-smi -q` and `dmesg | grep -i xid`, then reboot the VM")
    return f"{head}; {attached}"


class FilterModule:
    def filters(self):
        return {"gpu_shortfall": gpu_shortfall}

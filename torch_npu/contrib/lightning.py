"""A Lightning ``Accelerator`` for Ascend NPUs.

Lightning 2.x has no built-in NPU accelerator and never maps the string
``accelerator="npu"`` to one, so NPU users pass an instance::

    from lightning.pytorch import Trainer
    from torch_npu.contrib.lightning import NPUAccelerator, NPUMixedPrecision

    trainer = Trainer(accelerator=NPUAccelerator(), devices=1)
    trainer = Trainer(accelerator=NPUAccelerator(), devices=1, precision="bf16-mixed")
    trainer = Trainer(accelerator="npu", devices=1)   # registered by this import

Lightning chooses two things from its own list of accelerator names, and gets
them wrong for any accelerator it does not know: a single-device run would be
put on ``"cpu"`` and ``"16-mixed"``/``"bf16-mixed"`` would autocast on
``"cuda"``. Importing this module wraps those two choices of Lightning's
accelerator connector so that, for ``NPUAccelerator`` only, the single device
is ``npu:N`` and mixed precision autocasts on ``npu`` (``NPUMixedPrecision``).
Passing ``strategy=SingleDeviceStrategy("npu:0")`` and
``plugins=[NPUMixedPrecision(...)]`` explicitly does the same without the wrap.
Multi-device runs use Lightning's DDP strategy; its default process-group
backend for ``npu`` devices is ``hccl`` (registered by ``torch_npu``).

Works with the ``lightning`` package and with the standalone ``pytorch_lightning``.
"""
import torch

import torch_npu  # noqa: F401  (registers torch.npu)

try:
    from lightning.pytorch.accelerators import Accelerator, AcceleratorRegistry
    from lightning.pytorch.plugins.precision import MixedPrecision
    from lightning.pytorch.strategies import SingleDeviceStrategy
    from lightning.pytorch.trainer.connectors import accelerator_connector as _connector
except ImportError:  # the standalone distribution
    from pytorch_lightning.accelerators import Accelerator, AcceleratorRegistry
    from pytorch_lightning.plugins.precision import MixedPrecision
    from pytorch_lightning.strategies import SingleDeviceStrategy
    from pytorch_lightning.trainer.connectors import accelerator_connector as _connector

__all__ = ["NPUAccelerator", "NPUMixedPrecision"]


class NPUAccelerator(Accelerator):
    """Runs a Lightning ``Trainer`` on ``npu`` devices through ``torch.npu``."""

    def setup_device(self, device: torch.device) -> None:
        if device.type != "npu":
            raise ValueError(f"Device should be NPU, got {device} instead.")
        torch.npu.set_device(device)

    def teardown(self) -> None:
        torch.npu.empty_cache()

    @staticmethod
    def parse_devices(devices):
        """``devices`` as Lightning accepts it (int, ``-1``, ``"0,1"``, list) -> list of indices."""
        count = torch.npu.device_count()
        if isinstance(devices, str):
            devices = devices.strip()
            if devices in ("-1", "auto"):
                devices = -1
            elif "," in devices:
                devices = [int(part) for part in devices.split(",") if part.strip()]
            else:
                devices = int(devices)
        if isinstance(devices, int):
            if devices == -1:
                return list(range(count))
            if devices < 0 or devices > count:
                raise ValueError(f"Requested {devices} NPUs, but only {count} are visible.")
            return list(range(devices)) if devices else None
        indices = list(devices)
        bad = [i for i in indices if not 0 <= i < count]
        if bad:
            raise ValueError(f"NPU indices {bad} are out of range: {count} NPUs are visible.")
        return indices

    @staticmethod
    def get_parallel_devices(devices):
        return [torch.device("npu", index) for index in devices]

    @staticmethod
    def auto_device_count() -> int:
        return torch.npu.device_count()

    @staticmethod
    def is_available() -> bool:
        return torch.npu.is_available()

    @staticmethod
    def name() -> str:
        return "npu"

    def get_device_stats(self, device) -> dict:
        return torch.npu.memory_stats(device)

    @classmethod
    def register_accelerators(cls, accelerator_registry) -> None:
        accelerator_registry.register(cls.name(), cls, description=cls.__name__)


class NPUMixedPrecision(MixedPrecision):
    """``MixedPrecision`` that autocasts on ``npu`` (``"16-mixed"`` adds an npu ``GradScaler``)."""

    def __init__(self, precision: str = "bf16-mixed", scaler=None) -> None:
        super().__init__(precision, device="npu", scaler=scaler)


def _is_npu(connector) -> bool:
    return isinstance(getattr(connector, "accelerator", None), NPUAccelerator)


def _wrap_connector() -> None:
    """Teach Lightning's private connector the two NPU choices (idempotent)."""
    cls = getattr(_connector, "_AcceleratorConnector", None)
    if cls is None or getattr(cls, "_torch_npu_wrapped", False):
        return
    choose_strategy, init_precision = cls._choose_strategy, cls._check_and_init_precision

    def _choose_strategy(self):
        devices = getattr(self, "_parallel_devices", [])
        if _is_npu(self) and len(devices) == 1 and getattr(self, "_num_nodes_flag", 1) <= 1:
            return SingleDeviceStrategy(device=devices[0])
        return choose_strategy(self)

    def _check_and_init_precision(self):
        flag = getattr(self, "_precision_flag", None)
        if (_is_npu(self) and flag in ("16-mixed", "bf16-mixed")
                and getattr(self, "_precision_plugin_flag", None) is None
                and type(self.strategy).__name__ in ("SingleDeviceStrategy", "DDPStrategy")):
            self._validate_precision_choice()
            return NPUMixedPrecision(flag)
        return init_precision(self)

    cls._choose_strategy, cls._check_and_init_precision = _choose_strategy, _check_and_init_precision
    cls._torch_npu_wrapped = True


_wrap_connector()
if NPUAccelerator.name() not in AcceleratorRegistry:
    NPUAccelerator.register_accelerators(AcceleratorRegistry)

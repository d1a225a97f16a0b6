"""A minirt backend for the ONNX backend test API (``onnx.backend.base``).

``prepare`` goes the way a user's model goes: the builder turns the ONNX
model into .mrt bytes (``builder.build_bytes``) and the runtime loads them
(``minirt.Session``).  ``run`` feeds the inputs positionally, in the order of
the model's graph inputs that are not initializers, and returns the outputs
in graph-output order.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, Device, DeviceType, namedtupledict

import minirt
from minirt.builder import build_bytes


class MinirtRep(BackendRep):
    """A prepared model: a :class:`minirt.Session` over the built artifact."""

    def __init__(self, session: minirt.Session, artifact: bytes):
        super().__init__()
        self.session = session
        self.artifact = artifact
        self.input_names = [a.name for a in session.get_inputs()]
        self.output_names = [a.name for a in session.get_outputs()]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:  # noqa: ARG002
        if isinstance(inputs, dict):
            feed = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            inputs = list(inputs)
            if len(inputs) > len(self.input_names):
                raise ValueError(f"model takes {len(self.input_names)} inputs, got {len(inputs)}")
            feed = dict(zip(self.input_names, inputs))
        outputs = self.session.run(None, feed)
        return namedtupledict("Outputs", self.output_names)(*outputs)


class MinirtBackend(Backend):
    """``onnx.backend.base.Backend`` for minirt (CPU only)."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:  # noqa: ARG003
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto | bytes, device: str = "CPU", **kwargs: Any) -> MinirtRep:
        if not cls.supports_device(device):
            raise RuntimeError(f"minirt backend does not support device {device!r}")
        data = build_bytes(model, **kwargs)
        return MinirtRep(minirt.Session(data), data)

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Sequence[np.ndarray],
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...] | None:
        raise NotImplementedError("minirt runs whole models only; wrap the node in a model and use run_model")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


prepare = MinirtBackend.prepare
run_model = MinirtBackend.run_model
supports_device = MinirtBackend.supports_device

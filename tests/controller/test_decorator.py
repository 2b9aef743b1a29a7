"""@register: the recorded spec, RANK_ZERO resolution, inheritance, future materialisation."""

from __future__ import annotations

import pytest
import torch

from hybridflow.controller import Dispatch, Execute, Worker, register, registered_methods
from hybridflow.controller.decorator import method_spec
from hybridflow.protocol import DataProto, DataProtoFuture


class Base(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def step(self, data: DataProto) -> DataProto:
        return data

    @register()
    def ping(self) -> str:
        return "base"

    def helper(self) -> int:  # not registered: never exposed to the controller
        return 1


class Child(Base):
    @register(dispatch_mode=Dispatch.RANK_ZERO, blocking=False)
    def ping(self) -> str:
        return "child"

    @register(dispatch_mode="DP_COMPUTE", materialize_futures=False)
    def raw(self, x: object) -> object:
        return x


def test_spec_records_the_arguments() -> None:
    spec = method_spec(Base.step)
    assert spec is not None
    assert (spec.name, spec.dispatch_mode, spec.execute_mode, spec.blocking, spec.materialize_futures) == (
        "step",
        Dispatch.DP_COMPUTE_PROTO,
        Execute.ALL,
        True,
        True,
    )
    default = method_spec(Base.ping)
    assert default is not None and default.dispatch_mode is Dispatch.ALL_TO_ALL


def test_rank_zero_mode_runs_on_rank_zero_only() -> None:
    spec = method_spec(Child.ping)
    assert spec is not None and spec.execute_mode is Execute.RANK_ZERO and spec.blocking is False


def test_registered_methods_walks_bases_and_takes_overrides() -> None:
    methods = registered_methods(Child)
    assert sorted(methods) == ["ping", "raw", "step"]
    assert methods["ping"].dispatch_mode is Dispatch.RANK_ZERO
    assert "helper" not in methods


def test_override_without_register_is_an_error() -> None:
    class Sloppy(Base):
        def step(self, data: DataProto) -> DataProto:
            return data

    with pytest.raises(TypeError, match="Sloppy.step overrides a @register method without @register"):
        registered_methods(Sloppy)


def test_futures_are_materialised_in_the_worker() -> None:
    data = DataProto.from_dict({"x": torch.tensor([1.0, 2.0])})
    future = DataProtoFuture.concat([data, data])
    worker = Child()
    resolved = worker.step(future)
    assert isinstance(resolved, DataProto) and resolved.batch["x"].tolist() == [1.0, 2.0, 1.0, 2.0]
    assert worker.raw(future) is future  # materialize_futures=False passes it through


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(TypeError, match="execute_mode must be an Execute"):
        register(execute_mode="ALL")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dispatch_mode must be"):
        register(dispatch_mode=3)  # type: ignore[arg-type]

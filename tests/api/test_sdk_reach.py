"""Every RPC of every service in proto/ is reachable through the Python SDK's
typed methods (not only through the generated stubs), with annotated
arguments and results, on AsyncClient and on the derived sync Client; a
reason the SDK does not know yet falls back on the status code's class."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import fencepost
from fencepost import errors
from fencepost.v1 import (
    admin_pb2, evals_pb2, journal_pb2, kv_pb2, ledger_pb2, memory_pb2, schedule_pb2, store_api_pb2,
)

MODULES = (admin_pb2, evals_pb2, journal_pb2, kv_pb2, ledger_pb2, memory_pb2, schedule_pb2, store_api_pb2)


def _public_methods() -> dict[str, object]:
    return {
        name: fn for name, fn in inspect.getmembers(fencepost.AsyncClient, inspect.isfunction)
        if not name.startswith("_") and (inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn))
    }


async def test_every_rpc_is_called_by_a_typed_method() -> None:
    async with fencepost.AsyncClient("127.0.0.1:1", token="") as c:
        # the attribute holding each service's stub, e.g. "_kv" for fencepost.v1.KvService
        attr_of = {type(v).__name__.removesuffix("Stub"): k for k, v in vars(c).items() if type(v).__name__.endswith("Stub")}
    sources = "\n".join(
        inspect.getsource(inspect.unwrap(fn)) for fn in _public_methods().values()  # type: ignore[arg-type]
    )
    missing, checked = [], []
    for module in MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            assert service.name in attr_of, f"AsyncClient holds no stub for {service.full_name}"
            for method in service.methods:
                checked.append(method.name)
                if not re.search(rf"self\.{attr_of[service.name]}\.{method.name}\b", sources):
                    missing.append(f"{service.name}.{method.name}")
    assert not missing, f"RPCs no AsyncClient method calls: {missing}"
    proto = Path(__file__).resolve().parents[2] / "proto" / "fencepost" / "v1"
    rpcs = [m for f in proto.glob("*.proto") for m in re.findall(r"^\s*rpc (\w+)\(", f.read_text(), re.M)]
    assert sorted(checked) == sorted(rpcs)  # the modules above are every service of proto/


@pytest.mark.parametrize("name", sorted(_public_methods()))
def test_every_method_has_annotated_arguments_and_result_on_both_clients(name: str) -> None:
    fn = inspect.unwrap(_public_methods()[name])  # type: ignore[arg-type]
    sig = inspect.signature(fn)
    assert sig.return_annotation is not inspect.Signature.empty, f"{name} has no return annotation"
    for p in list(sig.parameters.values())[1:]:
        assert p.annotation is not inspect.Parameter.empty, f"{name}({p.name}) is not annotated"
    assert callable(getattr(fencepost.Client, name, None)), f"the sync Client lacks {name}"


def test_an_unknown_reason_is_the_status_code_s_class_and_keeps_the_reason() -> None:
    err = errors.error_for("FAILED_PRECONDITION", "m", "SOMETHING_NEWER", {"k": "v"})
    assert type(err) is errors.FailedPrecondition
    assert (err.reason, err.metadata) == ("SOMETHING_NEWER", {"k": "v"})
    odd = errors.error_for("DATA_LOSS", "m", "SOMETHING_NEWER")
    assert type(odd) is errors.FencepostError and odd.code == "DATA_LOSS"

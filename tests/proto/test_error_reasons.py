"""One source of truth for error reasons: the proto's ErrorReason enum.

`fencepost.reasons` holds exactly the enum's reasons (value names without
the ERROR_REASON_ prefix) and `fencepost.errors` has a typed exception for
each. Each failure says exactly what to add where."""

from __future__ import annotations

from fencepost import contract, errors, reasons
from fencepost.v1 import errors_pb2


def _python_reasons() -> dict[str, str]:
    return {k: v for k, v in vars(reasons).items() if k.isupper() and k != "DOMAIN"}


def test_enum_follows_aip_193() -> None:
    assert errors_pb2.ErrorReason.Name(0) == "ERROR_REASON_UNSPECIFIED"
    for name in errors_pb2.ErrorReason.keys():
        assert name.startswith(contract.PREFIX)
        assert name.isupper() and " " not in name


def test_python_reasons_are_the_enum() -> None:
    in_enum = set(contract.enum_reasons())
    python = _python_reasons()
    for const, value in python.items():
        assert const == value, f"fencepost/reasons.py: {const} = {value!r}; the constant must be its own reason string"
    missing_in_python = sorted(in_enum - set(python.values()))
    assert not missing_in_python, "add to client/fencepost/reasons.py: " + "; ".join(
        f'{r} = "{r}"' for r in missing_in_python
    )
    missing_in_enum = sorted(set(python.values()) - in_enum)
    assert not missing_in_enum, f"add to enum ErrorReason in {contract.ERRORS_PROTO}: " + "; ".join(
        f"{contract.PREFIX}{r} = <next number>;" for r in missing_in_enum
    )


def test_every_reason_has_a_typed_exception() -> None:
    missing = [r for r in contract.enum_reasons() if r not in errors.BY_REASON]
    assert not missing, f"add a class per reason to client/fencepost/errors.py and to BY_REASON: {missing}"
    for reason, cls in errors.BY_REASON.items():
        err = errors.error_for(cls.code, "m", reason)
        assert type(err) is cls and err.reason == reason


def test_reason_of_strips_the_prefix() -> None:
    assert contract.reason_of(errors_pb2.ERROR_REASON_LEASE_FENCED) == reasons.LEASE_FENCED
    assert contract.reason_of(errors_pb2.ERROR_REASON_UNSPECIFIED) == ""


def test_undeclared_names_the_line_to_add() -> None:
    seen = {
        ("/fencepost.v1.KvService/Get", "INVALID_ARGUMENT", "KEY_INVALID"),  # declared
        ("/fencepost.v1.KvService/Get", "FAILED_PRECONDITION", "LEASE_HELD"),  # not declared
        ("/fencepost.v1.KvService/Get", "INVALID_ARGUMENT", "NO_SUCH_REASON"),  # not in the enum
        ("/fencepost.v1.KvService/Get", "UNKNOWN", ""),  # no ErrorInfo
        ("/grpc.health.v1.Health/Check", "NOT_FOUND", ""),  # not fencepost's contract
    }
    problems = contract.undeclared(seen)
    assert len(problems) == 3, problems
    assert any(
        "add `option (fencepost.v1.reasons) = ERROR_REASON_LEASE_HELD;` to rpc Get in proto/fencepost/v1/kv.proto" in p
        for p in problems
    ), problems
    assert any("`ERROR_REASON_NO_SUCH_REASON = <next number>;`" in p for p in problems), problems
    assert any("with no ErrorInfo" in p for p in problems), problems


def _carries(message: object, names: set[str], seen: set[str] | None = None) -> bool:
    """Whether `message` (a Descriptor) or a message nested in it has a field named in `names`."""
    seen = set() if seen is None else seen
    if message.full_name in seen:  # type: ignore[attr-defined]
        return False
    seen.add(message.full_name)  # type: ignore[attr-defined]
    return any(
        f.name in names or (f.message_type is not None and _carries(f.message_type, names, seen))
        for f in message.fields  # type: ignore[attr-defined]
    )


def test_only_an_rpc_whose_request_carries_a_request_id_declares_request_id_reused() -> None:
    """REQUEST_ID_REUSED answers a request_id seen with another request: an RPC
    whose request has no request_id cannot return it, and declaring it (as
    MemoryService and EvalService did for every RPC, reads included) promises
    callers an error that never comes."""
    import importlib
    import pkgutil

    from fencepost import v1

    wrong = []
    for info in pkgutil.iter_modules(v1.__path__):
        if not info.name.endswith("_pb2"):
            continue
        module = importlib.import_module(f"{v1.__name__}.{info.name}")
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                declared = contract.declared_reasons(f"/{service.full_name}/{method.name}") or frozenset()
                if reasons.REQUEST_ID_REUSED in declared and not _carries(method.input_type, {"request_id"}):
                    wrong.append(f"{service.name}.{method.name}")
    assert not wrong, f"declare REQUEST_ID_REUSED only on the RPCs that take a request_id, not on {wrong}"

"""The proto is the documentation: every element is commented, every RPC
declares its error reasons (and its comment names no reason it does not
declare), every reason has a typed exception, and the committed reference is
what `make docs` renders."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2

from fencepost import contract, errors, reasons

ROOT = Path(__file__).resolve().parents[2]


def _load_renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("proto_docs", ROOT / "scripts" / "proto_docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["proto_docs"] = module
    spec.loader.exec_module(module)
    return module


docs = _load_renderer()


@pytest.fixture(scope="module")
def fds() -> descriptor_pb2.FileDescriptorSet:
    return docs.compile_descriptors(ROOT / "proto")


def _services(fds: descriptor_pb2.FileDescriptorSet):  # type: ignore[no-untyped-def]
    for _fname, items in docs.elements(fds):
        for el in items:
            if el.kind == "service":
                yield el


def test_every_service_rpc_message_field_and_enum_has_a_comment(fds: descriptor_pb2.FileDescriptorSet) -> None:
    assert docs.undocumented(fds) == []


def test_the_undocumented_check_catches_a_missing_comment(fds: descriptor_pb2.FileDescriptorSet) -> None:
    stripped = descriptor_pb2.FileDescriptorSet()
    stripped.CopyFrom(fds)
    target = next(f for f in stripped.file if f.message_type)
    for loc in target.source_code_info.location:
        if list(loc.path) == [4, 0, 2, 0]:  # first message, first field
            loc.leading_comments = ""
            loc.trailing_comments = ""
    msg = target.message_type[0]
    assert docs.undocumented(stripped) == [f"{target.name}: field {target.package}.{msg.name}.{msg.field[0].name}"]


def test_every_rpc_declares_known_error_reasons(fds: descriptor_pb2.FileDescriptorSet) -> None:
    known = {v for k, v in vars(reasons).items() if k.isupper() and k != "DOMAIN"}
    rpcs = 0
    for service in _services(fds):
        for rpc in service.children:
            rpcs += 1
            found = docs.rpc_reasons(service, rpc)
            assert found, f"{service.name}.{rpc.name} declares no error reason"
            unknown = set(found) - known
            assert not unknown, f"{service.name}.{rpc.name} declares reasons missing from fencepost.reasons: {unknown}"
    assert rpcs >= 18  # KvService (10) + EvalService (8) at least


def test_an_rpc_comment_names_only_reasons_the_rpc_declares(fds: descriptor_pb2.FileDescriptorSet) -> None:
    """The prose may explain a reason, never promise one the declaration lacks."""
    for service in _services(fds):
        for rpc in service.children:
            extra = [r for r in docs.reasons_in(rpc.comment) if r not in docs.rpc_reasons(service, rpc)]
            assert not extra, (
                f"{service.name}.{rpc.name}'s comment names {extra}; declare each with "
                f"`option (fencepost.v1.reasons) = ERROR_REASON_<reason>;` or drop it from the comment"
            )


def test_every_reason_an_rpc_declares_is_explained_in_a_comment(fds: descriptor_pb2.FileDescriptorSet) -> None:
    """The other direction: a reason an RPC declares of its own is named in
    its comment, in the comment of an RPC it refers to ("Errors: as List"), or
    in its service's comment. (PutIfAbsent and PutIfVersion declared
    REQUEST_ID_REUSED that no comment explained.)"""
    def words(text: str) -> set[str]:  # reasons named like status codes (PERMISSION_DENIED) count too
        return set(re.findall(r"[A-Z][A-Z0-9_]+", text))

    for service in _services(fds):
        by_name = {rpc.name: rpc for rpc in service.children}
        for rpc in service.children:
            named = words(rpc.comment) | words(service.comment)
            for other in re.findall(r"\bas (\w+)", rpc.comment):
                if other in by_name:
                    named |= words(by_name[other].comment)
            unexplained = [r for r in rpc.reasons if r not in named]
            assert not unexplained, f"{service.name}.{rpc.name} declares {unexplained}; say when in its comment"


def test_the_renderer_and_the_runtime_read_the_same_declarations(fds: descriptor_pb2.FileDescriptorSet) -> None:
    for service in _services(fds):
        for rpc in service.children:
            runtime = contract.declared_reasons(f"/{service.name}/{rpc.name}")
            assert runtime == frozenset(docs.rpc_reasons(service, rpc)), f"{service.name}.{rpc.name}"


def test_every_documented_reason_has_a_typed_exception(fds: descriptor_pb2.FileDescriptorSet) -> None:
    documented = {r for s in _services(fds) for rpc in s.children for r in docs.rpc_reasons(s, rpc)}
    assert documented - set(errors.BY_REASON) == set()


def test_reference_lists_every_rpc_with_its_reasons(fds: descriptor_pb2.FileDescriptorSet) -> None:
    text = (ROOT / "docs" / "reference.md").read_text("utf-8")
    for service in _services(fds):
        short = service.name.rsplit(".", 1)[1]
        for rpc in service.children:
            heading = f"#### {short}.{rpc.name}\n"
            assert heading in text
            section = text.split(heading, 1)[1].split("\n#### ", 1)[0].split("\n### ", 1)[0]
            for reason in docs.rpc_reasons(service, rpc):
                assert f"`{reason}`" in section.split("Error reasons:", 1)[1]


def test_committed_reference_is_fresh(fds: descriptor_pb2.FileDescriptorSet) -> None:
    assert (ROOT / "docs" / "reference.md").read_text("utf-8") == docs.render(fds), "run `make docs` and commit"

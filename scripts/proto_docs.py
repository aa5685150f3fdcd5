"""Render the Markdown API reference from the proto files (`make docs`).

The proto comments are the documentation: protoc compiles `proto/` into a
descriptor set with source info (comments included) and this script renders
every service, RPC (with the error reasons it declares in the
`fencepost.v1.common_reasons` / `fencepost.v1.reasons` options), message,
field and enum into `docs/reference.md`. `scripts/check.sh` renders again into a
temporary file and fails when the committed reference differs.

    python scripts/proto_docs.py [--out docs/reference.md] [--proto-root proto]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parent.parent

# FileDescriptorProto / DescriptorProto / ServiceDescriptorProto / EnumDescriptorProto field numbers
_FILE_MESSAGE, _FILE_ENUM, _FILE_SERVICE = 4, 5, 6
_MSG_FIELD, _MSG_NESTED, _MSG_ENUM, _MSG_ONEOF = 2, 3, 4, 8
_SVC_METHOD = 2
_ENUM_VALUE = 2

# gRPC status code names: they appear in comments next to reasons but are not reasons.
_STATUS_CODES = {
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}
_UPPER_SNAKE = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")

# The reason-declaring options (proto/fencepost/v1/errors.proto): both are field 51801 of their options message.
_REASONS_OPTION = 51801
_REASON_ENUM = "fencepost.v1.ErrorReason"
_REASON_PREFIX = "ERROR_REASON_"

_LABELS = {1: "optional", 2: "required", 3: "repeated"}
_TYPES = {
    v: k[len("TYPE_"):].lower()
    for k, v in descriptor_pb2.FieldDescriptorProto.Type.items()
    if k not in ("TYPE_MESSAGE", "TYPE_ENUM", "TYPE_GROUP")
}


@dataclass
class Element:
    """One documented element: kind, fully qualified name, and its comment."""

    kind: str  # service | rpc | message | field | enum | value | oneof
    name: str
    comment: str
    children: list[Element] = field(default_factory=list)
    detail: str = ""  # rpc signature or field type
    reasons: list[str] = field(default_factory=list)  # declared ErrorInfo reasons (service: common ones)


def compile_descriptors(proto_root: Path) -> descriptor_pb2.FileDescriptorSet:
    """The descriptor set (with comments) of every .proto under proto_root."""
    import grpc_tools

    wkt = Path(grpc_tools.__file__).parent / "_proto"
    files = sorted(str(p.relative_to(proto_root)) for p in proto_root.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.pb"
        cmd = [
            sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_root}", f"-I{wkt}",
            "--include_source_info", f"--descriptor_set_out={out}", *files,
        ]
        subprocess.run(cmd, check=True, cwd=proto_root)
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _comments(fd: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    out = {}
    for loc in fd.source_code_info.location:
        text = loc.leading_comments or loc.trailing_comments
        out[tuple(loc.path)] = "\n".join(line.strip() for line in text.strip().splitlines()).strip()
    return out


def _type_name(f: descriptor_pb2.FieldDescriptorProto) -> str:
    name = f.type_name.lstrip(".") if f.type_name else _TYPES.get(f.type, "?")
    label = "repeated " if f.label == 3 else ""
    if f.proto3_optional:
        label = "optional "
    return label + name


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, i


def option_enums(options: bytes, number: int) -> list[int]:
    """The values of repeated enum option `number` in serialized options (the
    extension is not registered here, so it is read from the wire: packed or not)."""
    out, i = [], 0
    while i < len(options):
        key, i = _varint(options, i)
        fnum, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(options, i)
            if fnum == number:
                out.append(value)
        elif wire == 2:
            size, i = _varint(options, i)
            chunk, i = options[i:i + size], i + size
            if fnum == number:
                j = 0
                while j < len(chunk):
                    value, j = _varint(chunk, j)
                    out.append(value)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unexpected wire type {wire} in options")
    return out


def reason_names(fds: descriptor_pb2.FileDescriptorSet) -> dict[int, str]:
    """ErrorReason number -> reason string (the value name without the prefix)."""
    for fd in fds.file:
        for enum in fd.enum_type:
            if f"{fd.package}.{enum.name}" == _REASON_ENUM:
                return {v.number: v.name.removeprefix(_REASON_PREFIX) for v in enum.value}
    return {}


def _declared(options: bytes, names: dict[int, str]) -> list[str]:
    return list(dict.fromkeys(names.get(n, f"#{n}") for n in option_enums(options, _REASONS_OPTION)))


def elements(fds: descriptor_pb2.FileDescriptorSet) -> list[tuple[str, list[Element]]]:
    """Per file, its services, messages and enums with their comments."""
    out = []
    names = reason_names(fds)
    for fd in fds.file:
        docs = _comments(fd)
        pkg = fd.package
        items: list[Element] = []
        for si, svc in enumerate(fd.service):
            path = (_FILE_SERVICE, si)
            common = _declared(svc.options.SerializeToString(), names)
            el = Element("service", f"{pkg}.{svc.name}", docs.get(path, ""), reasons=common)
            for mi, m in enumerate(svc.method):
                sig = f"{m.input_type.lstrip('.')} → {m.output_type.lstrip('.')}"
                if m.server_streaming:
                    sig = f"{m.input_type.lstrip('.')} → stream {m.output_type.lstrip('.')}"
                own = _declared(m.options.SerializeToString(), names)
                comment = docs.get((*path, _SVC_METHOD, mi), "")
                el.children.append(Element("rpc", m.name, comment, detail=sig, reasons=own))
            items.append(el)
        for mi, msg in enumerate(fd.message_type):
            items.extend(_message(msg, f"{pkg}.{msg.name}", (_FILE_MESSAGE, mi), docs))
        for ei, enum in enumerate(fd.enum_type):
            items.append(_enum(enum, f"{pkg}.{enum.name}", (_FILE_ENUM, ei), docs))
        out.append((fd.name, items))
    return out


def _message(msg: descriptor_pb2.DescriptorProto, name: str, path: tuple[int, ...], docs: dict) -> Iterator[Element]:
    el = Element("message", name, docs.get(path, ""))
    for fi, f in enumerate(msg.field):
        detail = f"{_type_name(f)} = {f.number}"
        if f.HasField("oneof_index") and not f.proto3_optional:
            detail += f" (oneof {msg.oneof_decl[f.oneof_index].name})"
        el.children.append(Element("field", f.name, docs.get((*path, _MSG_FIELD, fi), ""), detail=detail))
    yield el
    for ni, nested in enumerate(msg.nested_type):
        if nested.options.map_entry:
            continue
        yield from _message(nested, f"{name}.{nested.name}", (*path, _MSG_NESTED, ni), docs)
    for ei, enum in enumerate(msg.enum_type):
        yield _enum(enum, f"{name}.{enum.name}", (*path, _MSG_ENUM, ei), docs)


def _enum(enum: descriptor_pb2.EnumDescriptorProto, name: str, path: tuple[int, ...], docs: dict) -> Element:
    el = Element("enum", name, docs.get(path, ""))
    for vi, v in enumerate(enum.value):
        el.children.append(Element("value", v.name, docs.get((*path, _ENUM_VALUE, vi), ""), detail=str(v.number)))
    return el


def reasons_in(text: str) -> list[str]:
    """The ErrorInfo reasons a comment names (UPPER_SNAKE words that are not status codes)."""
    seen: dict[str, None] = {}
    for word in _UPPER_SNAKE.findall(text):
        if word not in _STATUS_CODES and not word.endswith("_UNSPECIFIED"):
            seen.setdefault(word, None)
    return list(seen)


def rpc_reasons(service: Element, rpc: Element) -> list[str]:
    """Reasons an RPC declares: its service's `common_reasons`, then its own `reasons`."""
    return list(dict.fromkeys([*service.reasons, *rpc.reasons]))


def _anchor(name: str) -> str:
    return name.lower().replace(".", "")


def _para(text: str) -> str:
    return text if text else "_(undocumented)_"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|") or "_(undocumented)_"


def render(fds: descriptor_pb2.FileDescriptorSet) -> str:
    lines = [
        "# fencepost API reference",
        "",
        "<!-- Generated by scripts/proto_docs.py from proto/ (`make docs`); do not edit. -->",
        "",
        "Every error the server returns carries a `google.rpc.ErrorInfo` (domain `fencepost.dev`) whose",
        "`reason` is one of [`fencepost.v1.ErrorReason`](#fencepostv1errorreason) (the value name without",
        "the `ERROR_REASON_` prefix). Each RPC lists the reasons it declares (its service's",
        "`common_reasons` option, then its own `reasons` option); the test suite records every reason the",
        "server returns and fails on one an RPC does not declare. The client SDK raises one typed",
        "exception per reason.",
        "",
        "Refusals by the gRPC transport itself carry no `ErrorInfo` and no reason: `RESOURCE_EXHAUSTED`",
        "for a request over the server's receive limit (the SDKs report it as `MESSAGE_TOO_LARGE`),",
        "`UNAVAILABLE` when the server cannot be reached, `DEADLINE_EXCEEDED` / `CANCELLED` from the",
        "caller's deadline or cancellation, `UNIMPLEMENTED` for a method this server does not serve.",
        "",
    ]
    files = elements(fds)
    lines.append("## Services")
    lines.append("")
    for fname, items in files:
        for el in items:
            if el.kind == "service":
                lines.append(f"- [{el.name}](#{_anchor(el.name)}) (`{fname}`)")
    lines.append("")
    for fname, items in files:
        lines += [f"## `{fname}`", ""]
        for el in items:
            if el.kind == "service":
                lines += [f"### {el.name}", "", _para(el.comment), ""]
                common = ", ".join(f"`{r}`" for r in el.reasons) or "none"
                lines += [f"Common error reasons (every RPC): {common}", ""]
                for rpc in el.children:
                    lines += [f"#### {el.name.rsplit('.', 1)[1]}.{rpc.name}", "", f"`{rpc.detail}`", ""]
                    lines += [_para(rpc.comment), ""]
                    found = rpc_reasons(el, rpc)
                    lines += ["Error reasons: " + (", ".join(f"`{r}`" for r in found) or "none"), ""]
        for el in items:
            if el.kind in ("message", "enum"):
                lines += [f"### {el.name}", "", _para(el.comment), ""]
                if el.children:
                    head = ("Field", "Type", "Description") if el.kind == "message" else ("Value", "Number", "Description")
                    lines += [f"| {head[0]} | {head[1]} | {head[2]} |", "|---|---|---|"]
                    for child in el.children:
                        lines.append(f"| `{child.name}` | `{child.detail}` | {_cell(child.comment)} |")
                    lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def undocumented(fds: descriptor_pb2.FileDescriptorSet) -> list[str]:
    """Every service, RPC, message, field, enum and enum value without a comment."""
    missing = []
    for fname, items in elements(fds):
        for el in items:
            if not el.comment:
                missing.append(f"{fname}: {el.kind} {el.name}")
            for child in el.children:
                if not child.comment:
                    missing.append(f"{fname}: {child.kind} {el.name}.{child.name}")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "reference.md")
    parser.add_argument("--proto-root", type=Path, default=ROOT / "proto")
    args = parser.parse_args(argv)
    fds = compile_descriptors(args.proto_root.resolve())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(fds), encoding="utf-8")
    missing = undocumented(fds)
    for item in missing:
        print(f"proto_docs: no comment on {item}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

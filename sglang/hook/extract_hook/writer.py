"""Protocol v1 dump and marker files, in pure Python (no torch, no numpy).

A dump is a safetensors container: an 8-byte little-endian header length N, N bytes of
JSON padded with spaces to a multiple of 8, then the tensors back to back in the order
aux_hidden_state, hidden_state, input_ids. Tensor bytes arrive as bytes-like buffers
(bf16 and int64, little-endian, as the GPU and the CPU already hold them); the writer
only checks their sizes and lays them out.
"""

import errno
import json
import os
import re
import struct

from . import HOOK_VERSION, PROTOCOL

# The orchestrator's rid pattern (shm/rid.go): s<sample, 9 digits>-a<attempt>.
RID_PATTERN = re.compile(r"^s[0-9]{9}-a[1-9][0-9]{0,8}$")

# Protocol v1 concatenates exactly three captured layers into aux_hidden_state.
AUX_LAYERS = 3

DUMP_SUFFIX = ".safetensors"
PARTIAL_SUFFIX = ".partial"
MARKER_PREFIX = ".hook-"
MARKER_SUFFIX = ".json"

_BF16_BYTES = 2
_I64_BYTES = 8

# Every file this package writes is created, never opened: O_EXCL so that a name that
# already exists (another thread's or process's write in progress, a crashed writer's
# leftover, a name planted in the world-writable staging dir) is an error rather than a
# file we truncate and interleave our bytes with; O_NOFOLLOW so that a symlink planted
# under the name is never followed (with O_EXCL the kernel already refuses it; the flag
# says so where it is read); O_CLOEXEC so that no server subprocess inherits the fd.
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_MODE = 0o644


class DumpInProgress(FileExistsError):
    """<rid>.safetensors.partial already exists: someone else is writing this rid (or
    left or planted the name). The file is left exactly as it is; the caller joins the
    other write or answers a conflict, and the orchestrator retries under a new rid."""


def format_layers(layers):
    """The metadata form of a layer list: "2,30,58"."""
    return ",".join(str(layer) for layer in _check_layers(layers))


def parse_layers(text):
    """Parses SGLANG_HS_LAYERS ("2,30,58") into a tuple of three ascending ids >= 1."""
    try:
        layers = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"layers {text!r}: want three comma-separated integers") from None
    return _check_layers(layers)


def _check_layers(layers):
    layers = tuple(layers)
    if len(layers) != AUX_LAYERS:
        raise ValueError(f"layers {layers}: protocol v1 captures exactly {AUX_LAYERS}")
    # SGLang appends captures while walking the layers in index order, so only an
    # ascending list describes the column order of aux_hidden_state. Layer 0 has no
    # residual yet, so the earliest capture point is layer 1 (the output of layer 0).
    if any(not isinstance(layer, int) or layer < 1 for layer in layers):
        raise ValueError(f"layers {layers}: ids must be integers >= 1")
    if any(a >= b for a, b in zip(layers, layers[1:])):
        raise ValueError(f"layers {layers}: ids must be strictly ascending")
    return layers


def check_rid(rid):
    """Raises ValueError unless rid is a protocol v1 rid (and so a safe file name)."""
    if not isinstance(rid, str) or not RID_PATTERN.match(rid):
        raise ValueError(f"rid {rid!r} is not a protocol v1 rid (s<9 digits>-a<n>)")


def dump_path(directory, rid):
    return os.path.join(directory, rid + DUMP_SUFFIX)


def encode_header(tokens, hidden_size, metadata):
    """The bytes before the data section of a dump of tokens x hidden_size."""
    shapes = (
        ("aux_hidden_state", "BF16", [tokens, AUX_LAYERS * hidden_size], _BF16_BYTES),
        ("hidden_state", "BF16", [tokens, hidden_size], _BF16_BYTES),
        ("input_ids", "I64", [tokens], _I64_BYTES),
    )
    header = {}
    at = 0
    for name, dtype, shape, width in shapes:
        size = width
        for dim in shape:
            size *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + size]}
        at += size
    header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_dump(directory, rid, *, aux, hidden, input_ids, tokens, hidden_size, layers, model):
    """Writes <directory>/<rid>.safetensors.partial, then renames it to <rid>.safetensors.

    aux is [tokens, 3*hidden_size] bf16, hidden [tokens, hidden_size] bf16, input_ids
    [tokens] int64, each as a C-contiguous bytes-like buffer. Every check runs before
    the file is created; a failed write removes the partial file. Returns the final path.
    """
    check_rid(rid)
    if not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"rid {rid}: tokens {tokens!r} must be a positive integer")
    if not isinstance(hidden_size, int) or hidden_size < 1:
        raise ValueError(f"rid {rid}: hidden size {hidden_size!r} must be a positive integer")
    buffers = []
    for name, buf, want in (
        ("aux_hidden_state", aux, tokens * AUX_LAYERS * hidden_size * _BF16_BYTES),
        ("hidden_state", hidden, tokens * hidden_size * _BF16_BYTES),
        ("input_ids", input_ids, tokens * _I64_BYTES),
    ):
        view = _byte_view(name, buf)
        if view.nbytes != want:
            raise ValueError(
                f"rid {rid}: {name} has {view.nbytes} bytes, want {want} "
                f"for {tokens} tokens of hidden size {hidden_size}"
            )
        buffers.append(view)
    header = encode_header(
        tokens,
        hidden_size,
        {
            "rid": rid,
            "protocol": PROTOCOL,
            "layers": format_layers(layers),
            "model": str(model),
            "hook_version": HOOK_VERSION,
        },
    )
    final = dump_path(directory, rid)
    partial = final + PARTIAL_SUFFIX
    try:
        fd = os.open(partial, CREATE_FLAGS, FILE_MODE)
    except FileExistsError:
        raise DumpInProgress(errno.EEXIST, f"rid {rid}: a dump is already being written (or was left) under this name", partial) from None
    try:
        try:
            _write_all(fd, [memoryview(header), *buffers])
        finally:
            os.close(fd)
        # No fsync: the staging dir is a tmpfs that a reboot empties anyway; the
        # rename is what makes a complete file appear under the name the watcher reads.
        os.rename(partial, final)
    except BaseException:
        # Only our own partial goes: the name is ours from the O_EXCL create until the
        # rename, and the sticky staging dir keeps others from replacing it.
        try:
            os.unlink(partial)
        except FileNotFoundError:
            pass
        raise
    return final


def create_file(path, chunks):
    """Creates path (O_EXCL, never following a link) and writes the bytes-like chunks."""
    fd = os.open(path, CREATE_FLAGS, FILE_MODE)
    try:
        _write_all(fd, [_byte_view("chunk", c) for c in chunks])
    finally:
        os.close(fd)


def _write_all(fd, views):
    """os.write until every byte is out: one write may be short (a signal, or Linux's
    2 GiB cap per call). views are byte-format memoryviews."""
    for view in views:
        while view.nbytes:
            view = view[os.write(fd, view) :]


def _byte_view(name, buf):
    try:
        view = memoryview(buf)
    except TypeError:
        raise TypeError(f"{name}: {type(buf).__name__} is not a bytes-like buffer") from None
    if not view.c_contiguous:
        raise ValueError(f"{name}: buffer is not C-contiguous")
    return view.cast("B")


def marker_path(directory, pid):
    return os.path.join(directory, f"{MARKER_PREFIX}{pid}{MARKER_SUFFIX}")


def write_marker(directory, pid, info):
    """Writes <directory>/.hook-<pid>.json (atomically) holding info plus the hook's
    version and protocol. The leading dot keeps it clear of the dump rid pattern."""
    content = dict(info, hook_version=HOOK_VERSION, protocol=PROTOCOL, pid=pid)
    final = marker_path(directory, pid)
    # A name of our own for the temp file: a leftover .partial of an earlier process
    # with this pid, or one planted there, is not ours to truncate or to remove.
    partial = f"{final}.{os.urandom(8).hex()}{PARTIAL_SUFFIX}"
    text = json.dumps(content, indent=2, sort_keys=True) + "\n"
    try:
        create_file(partial, [text.encode()])
        os.rename(partial, final)
    except BaseException:
        try:
            os.unlink(partial)
        except FileNotFoundError:
            pass
        raise
    return final


def remove_stale_markers(directory):
    """Removes the markers of processes that no longer exist, so the markers left are
    those of live hooks. Returns the removed paths."""
    removed = []
    for name in os.listdir(directory):
        if not (name.startswith(MARKER_PREFIX) and name.endswith(MARKER_SUFFIX)):
            continue
        pid = name[len(MARKER_PREFIX) : -len(MARKER_SUFFIX)]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        path = os.path.join(directory, name)
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

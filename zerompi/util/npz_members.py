"""Reading an .npz file that a user names: every member's .npy header is checked before numpy
allocates the array it declares.

An .npz is a zip archive of .npy files (numpy.lib.format), one per array:

    member "x.npy":   magic b"\\x93NUMPY", version (1, 0) or (2, 0), header length (2 or 4 bytes),
                      header {'descr': dtype, 'fortran_order': bool, 'shape': (d0, d1, ...)},
                      then d0 x d1 x ... x itemsize bytes of data

np.load allocates the declared shape before it reads a byte of data: a 2 kB file whose header
declares (1e11, 4) costs 3.2 TB before anything is checked, and a deflated member of zeros expands
up to 1032-fold (a zip bomb). So before numpy reads a member, its sizes are checked against the
file:

    the zip entry     compressed size <= the archive's size; uncompressed size <= the compressed
                      size (stored) or 1032 x it (deflate cannot expand more: 2 bits per 258 bytes)
    the .npy header   prod(shape) x itemsize == the entry's uncompressed size - the header's length;
                      no object dtype (that would need pickle)

`declared` returns the (shape, dtype) that passed; the caller checks them against what it expects
and the bytes it will allocate against the memory available (zerompi/util/inputs.py's check_fits), and
only then calls `read`. Every problem raises the caller's error(one line naming the file).
"""
import math
import os
import zipfile
import zlib
from contextlib import contextmanager

import numpy as np

from .inputs import open_regular
from .words import format_bytes

DEFLATE_MAX_RATIO = 1032
EXPANSION = {zipfile.ZIP_STORED: ("stored", 1), zipfile.ZIP_DEFLATED: ("deflated", DEFLATE_MAX_RATIO)}
HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
ZIP_ERRORS = (OSError, EOFError, ValueError, RuntimeError, NotImplementedError, zipfile.BadZipFile, zlib.error)


@contextmanager
def open_npz(path, error):
    """The archive at path, if it is a regular file and a zip archive (np.load's NpzFile), closed
    on leaving the block."""
    with open_regular(path, error) as f:
        try:
            archive = np.load(f, allow_pickle=False)
        except ValueError:               # neither zip nor .npy: numpy would fall back to pickle
            raise error(f"{path}: not a valid .npz file (not a zip archive of arrays)") from None
        except (OSError, EOFError, zipfile.BadZipFile) as e:
            raise error(f"{path}: not a valid .npz file ({one_line(e) or 'empty file'})") from None
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise error(f"{path}: is a single .npy array, not an .npz archive of named arrays")
        with archive:
            yield archive


def declared(archive, key, error, what):
    """(shape, dtype) that member `key` (archive.files' name) declares, checked against the file
    as the module docstring says; what: how messages name the member, e.g. "data.npz: 'x'"."""
    info = archive.zip.getinfo(key + ".npy" if key + ".npy" in archive.zip.NameToInfo else key)
    _check_zip_entry(info, os.fstat(archive.zip.fp.fileno()).st_size, error, what)
    try:
        with archive.zip.open(info) as member:
            version = np.lib.format.read_magic(member)
            header = HEADER_READERS[version](member) if version in HEADER_READERS else None
            header_bytes = member.tell()
    except ZIP_ERRORS as e:
        raise error(f"{what} is not an .npy array ({one_line(e)})") from None
    if header is None:                   # 3.0: utf-8 field names, a structured dtype (refused anyway)
        raise error(f"{what}: .npy format version {version[0]}.{version[1]} is not supported (1.0, 2.0)")
    shape, _, dtype = header
    if dtype.hasobject:
        raise error(f"{what} is an object array (dtype {dtype}); only plain numeric arrays are accepted, "
                    f"the file is read without pickle")
    if min(shape, default=0) < 0:
        raise error(f"{what} declares a negative dimension: shape {shape}")
    data_bytes, declared_bytes = info.file_size - header_bytes, math.prod(shape) * dtype.itemsize
    if declared_bytes != data_bytes:
        raise error(f"{what} declares shape {shape} {dtype} ({format_bytes(declared_bytes)}) but holds "
                    f"{data_bytes} bytes of data")
    return shape, dtype


def read(archive, key, error, what):
    """The array of member `key` (after `declared` has passed), with a corrupt member as error."""
    try:
        return archive[key]
    except ZIP_ERRORS as e:
        raise error(f"{what} is corrupt ({one_line(e)})") from None


def _check_zip_entry(info, archive_bytes, error, what):
    """The entry's sizes fit the archive: a stored member holds its compressed bytes, a deflated
    one at most 1032 times them (other methods, e.g. bzip2 or lzma: left to the memory check)."""
    if info.compress_size > archive_bytes:
        raise error(f"{what}: its zip entry declares {info.compress_size} bytes of data, but the whole "
                    f"file holds {archive_bytes}")
    method, ratio = EXPANSION.get(info.compress_type, (None, None))
    if method is not None and info.file_size > ratio * info.compress_size:
        raise error(f"{what}: its zip entry declares {info.file_size} bytes, more than its "
                    f"{info.compress_size} {method} bytes can hold")


def one_line(error):
    return " ".join(str(error).split())

"""Reading text strictly, writing files so that a crash never leaves a half-written one behind, and the lock
that keeps two trainings out of one run folder.

Text is UTF-8: bytes that are not are named by their line, never replaced. Everything is written under a
temporary name in the same folder and then renamed into place; ``os.replace`` is atomic on POSIX, so a
reader sees the old file or the new one, never a mixture. :func:`holding_run_folder` is the lock.
"""

from __future__ import annotations

import codecs
import errno
import gzip
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from attnlab.errors import AttnlabError

try:
    import fcntl
except ImportError:  # Windows: run folders are not locked there
    fcntl = None  # type: ignore[assignment]


def decode_utf8(data: bytes, name: str | Path, *, bom: bool = False) -> str:
    """``data`` decoded as UTF-8, or an error naming ``name`` and the line of the first bad byte.

    ``bom=True`` drops a leading byte-order mark (spreadsheets write one; it is not part of a column name).
    """
    if bom and data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]  # removed here, not by utf-8-sig, so that err.start counts in data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise AttnlabError(f"{name} is not UTF-8 text (line {line}: {err.reason})") from None


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file, without their line ends.

    A name ending in ``.gz`` is gunzipped; ``-`` reads standard input. A final newline ends the last line
    rather than starting an empty one, and only ``\n`` (with an optional ``\r`` before it) ends a line: form
    feeds and other Unicode separators stay inside it, where ``str.splitlines`` would split. A leading byte-order
    mark (Windows editors write one) is dropped, as the table reader drops it: it is not part of the first line.
    """
    name = "standard input" if str(path) == "-" else str(path)
    try:
        if str(path) == "-":
            data = sys.stdin.buffer.read()
        elif str(path).endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = Path(path).read_bytes()
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise AttnlabError(f"{name} is not a readable gzip file ({err})") from None
    except IsADirectoryError:  # (as the table and text readers say it)
        raise AttnlabError(f"{name} is a folder, not a text file") from None
    except OSError as err:
        raise AttnlabError(f"cannot read {name}: {err.strerror or err}") from None
    lines = decode_utf8(data, name, bom=True).split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def fingerprint(path: str | Path) -> str:
    """SHA-256 of a file's bytes: a resumed run checks that its data did not change."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def refuse_changed(path: str | Path, saved: str | None, *, what: str, started_with: str | Path) -> None:
    """Refuse to resume a run on ``path`` unless its bytes are those the run started with (``saved``, their
    :func:`fingerprint`; None for a run that recorded none). A resumed run repeats its batches exactly only on
    the same data; ``what`` names it in the message (``"training text"``), ``started_with`` is the path saved."""
    if saved is None or fingerprint(path) == saved:
        return
    if Path(path).resolve() == Path(started_with).resolve():
        raise AttnlabError(f"{path} has changed since this run started (its bytes differ); resume needs the "
                           f"{what} it started with")
    raise AttnlabError(f"{path} is not the {what} this run started with ({started_with}); resume needs the same "
                       f"{what}")


def _fsync(path: Path) -> None:
    """Flush a file's or a folder's contents to the disk: a rename can reach the disk before the data renamed, and
    after a crash of the machine the new name would hold an empty or cut file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def temporary_stem(name: str) -> str:
    """``name``, or, for a name too long to take a temporary's additions (a file system holds 255 bytes a name),
    its first characters and a digest of the whole: a temporary beside any legal name is legal too."""
    if len(os.fsencode(name)) <= 200:
        return name
    head, size = [], 0
    for char in name:  # whole characters, up to 150 bytes
        size += len(os.fsencode(char))
        if size > 150:
            break
        head.append(char)
    return "".join(head) + "~" + hashlib.sha256(os.fsencode(name)).hexdigest()[:16]


def _temporary_prefix(path: Path) -> str:
    """``.NAME.PID.``: the temporaries of ``path`` name their writer, so that abandoned ones can be told apart."""
    return f".{temporary_stem(path.name)}.{os.getpid()}."


def remove_abandoned(parent: Path, form: re.Pattern[str]) -> None:
    """Remove the entries of ``parent`` whose whole name matches ``form`` and whose writer no longer runs.

    ``form``'s first group is the writer's process id, which temporary names carry for this: a writer killed
    outright (``kill -9``) cleans nothing up, and a checkpoint folder is a whole model's size. An entry whose
    process is alive (the writer, or one that reused its id) is left, and so is one that cannot be removed
    (another user's): tidying never stops the write that called it.
    """
    for leftover in parent.iterdir() if parent.is_dir() else ():
        match = form.fullmatch(leftover.name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            if leftover.is_dir():
                shutil.rmtree(leftover)
            else:
                leftover.unlink()
        except OSError:
            pass


def _remove_abandoned(path: Path) -> None:
    """Remove temporaries of ``path`` left by dead writers: names of exactly :func:`_temporary_prefix`'s form
    (``.hyp.txt.1.PID.*.tmp`` belongs to ``hyp.txt.1``, not ``hyp.txt``; mkstemp's random part has no dot)."""
    remove_abandoned(path.parent, re.compile(re.escape(f".{temporary_stem(path.name)}.") + r"(\d{1,9})\.[^.]+\.tmp"))


def _umask() -> int:
    mask = os.umask(0)  # the only way to read it is to set it
    os.umask(mask)
    return mask


#: The errors of a write that the disk, not the program, refused: a full disk or quota, a file-size limit
#: (``ulimit -f``), a failing device, a file system mounted read-only.
WRITE_FAILURES = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS)


@contextmanager
def said_by_path(path: str | Path, *, only: tuple[int, ...] | None = None,
                 also: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Turn a failed write into one :class:`AttnlabError` that names ``path`` (the system's error for a full disk
    names no file): an ``OSError`` (of the error numbers ``only``, when given) or one of the types ``also`` (a
    writer's own, such as safetensors')."""
    try:
        yield
    except (OSError, *also) as err:
        if isinstance(err, OSError) and only is not None and err.errno not in only:
            raise
        raise AttnlabError(f"cannot write {path}: {getattr(err, 'strerror', None) or err}") from err


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is renamed to ``path``, on error removed.

    The file gets the permissions an ordinary write would give it: those of the file it replaces, or
    0666 less the umask (``mkstemp`` makes its files private, 0600, whatever the umask, and so do writers
    such as safetensors that replace the temporary file with their own: the mode is set again at the end).

    A symbolic link is written through: its target is replaced, the link kept. A device or a named pipe
    (``/dev/null``, a FIFO a reader waits on) is written to in place once the temporary file is complete, never
    replaced by a regular file.
    """
    path = Path(path)
    if path.is_dir():  # said now, by its own name: the rename at the end would fail on the temporary one
        raise AttnlabError(f"{path} is a folder; give a file name to write")
    if written_in_place(path):
        yield from _written_in_place(path)
        return
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    ensure_writable_dir(path.parent)
    mode = path.stat().st_mode & 0o7777 if path.is_file() else 0o666 & ~_umask()
    _remove_abandoned(path)
    with said_by_path(path):  # by the name given, not the temporary one's (a folder such as /proc refuses files)
        fd, tmp = tempfile.mkstemp(prefix=_temporary_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        with said_by_path(path, only=WRITE_FAILURES):
            os.chmod(tmp_path, mode)
            yield tmp_path
            os.chmod(tmp_path, mode)
            _fsync(tmp_path)
            os.replace(tmp_path, path)
            _fsync(path.parent)
    finally:
        tmp_path.unlink(missing_ok=True)


def written_in_place(path: Path) -> bool:
    """Whether :func:`atomic_path` writes into ``path`` itself rather than replacing it: a device or a pipe, and
    what /dev/stdout or /proc/self/fd/N name, which may be a file the shell redirected to (replacing it would lose
    what the shell wrote there, and all written after)."""
    return path.exists() and (not path.is_file() or _names_a_stream(path))


def move_into_place(source: Path, target: str | Path) -> None:
    """Move the complete file ``source`` to ``target`` by a rename, which needs no space and leaves no half-written
    file, as :func:`atomic_path` would write it: through a link to its target, with the permissions of the file it
    replaces, flushed to the disk. A device, a pipe or a stream (see :func:`atomic_path`), and a target on another
    file system, are written through :func:`atomic_path` instead."""
    target = Path(target)
    if not written_in_place(target):
        if target.is_symlink():
            target = Path(os.path.realpath(target))
        if target.is_file():
            os.chmod(source, target.stat().st_mode & 0o7777)
        _fsync(source)
        try:
            os.replace(source, target)
        except OSError as err:
            if err.errno != errno.EXDEV:
                raise
        else:
            _fsync(target.parent)
            return
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)
    source.unlink()


#: A process's open file as /proc names it (/dev/stdout and /dev/fd/N are links to it).
_OPEN_FILE = re.compile(r"/proc/[^/]+/fd/\d+")


def _names_a_stream(path: Path) -> bool:
    """Whether ``path`` names a process's open file (/dev/stdout, /dev/fd/N, /proc/self/fd/N, or a link to one),
    which may be a file a shell redirected to: each link on the way is followed from its real folder."""
    for _ in range(40):  # (a chain of links longer than the kernel follows is no stream)
        here = Path(os.path.realpath(path.parent)) / path.name
        if _OPEN_FILE.fullmatch(str(here)):
            return True
        if not here.is_symlink():
            return False
        path = here.parent / os.readlink(here)
    return False


def _written_in_place(path: Path) -> Iterator[Path]:
    """:func:`atomic_path` for a device or a named pipe: a temporary file elsewhere, copied into ``path`` whole."""
    fd, tmp = tempfile.mkstemp(suffix=".tmp")
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        try:
            yield tmp_path
        except OSError as err:
            if err.errno in WRITE_FAILURES:  # (the temporary's folder, TMPDIR, is full)
                raise AttnlabError(f"cannot write {path}: {err.strerror} (its temporary file in "
                                   f"{tmp_path.parent})") from err
            raise
        # (appended: a stream redirected with >> keeps what came before, and a pipe or device has no end to cut)
        with said_by_path(path), open(tmp_path, "rb") as source, open(path, "ab") as target:
            shutil.copyfileobj(source, target)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, in UTF-8; gzip-compressed when the name ends in ``.gz``, as the
    readers (:func:`read_lines`) take such a file."""
    with atomic_path(path) as tmp:
        data = text.encode("utf-8")
        # mtime 0: the same text gives the same bytes, whenever it is written
        tmp.write_bytes(gzip.compress(data, mtime=0) if Path(path).name.endswith(".gz") else data)


def write_json_atomic(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    write_text_atomic(path, json.dumps(obj, indent=2) + "\n")


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` whole.

    A folder cannot be swapped in one atomic step when the old one exists, so the old one is first
    renamed aside (``path.old``) and removed after the new one is in place. :func:`recover_dir` undoes
    an interruption between the two renames. The folder and the files written in it get the permissions of
    ordinary ones (0777 and 0666 less the umask), whatever the writers chose.
    """
    path = Path(path)
    ensure_writable_dir(path.parent)
    _remove_abandoned(path)
    tmp = Path(tempfile.mkdtemp(prefix=_temporary_prefix(path), suffix=".tmp", dir=path.parent))
    tmp.chmod(0o777 & ~_umask())  # mkdtemp's folders are private (0700); a made folder follows the umask
    try:
        yield tmp
        for file in tmp.iterdir():
            if file.is_file():
                file.chmod(0o666 & ~_umask())  # safetensors writes its files private (0600)
                _fsync(file)  # the old folder goes once the new one is in place: the new one's data must be on disk
        _fsync(tmp)
        old = path.with_name(temporary_stem(path.name) + ".old")
        if old.exists():
            shutil.rmtree(old)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync(path.parent)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def recover_dir(path: str | Path) -> None:
    """If a crash struck between the two renames of :func:`atomic_dir`, put the old folder back."""
    path = Path(path)
    old = path.with_name(temporary_stem(path.name) + ".old")
    if not path.exists() and old.exists():
        os.replace(old, path)


def refuse_non_folder(path: str | Path, option: str = "") -> None:
    """Refuse a ``path`` that exists and is not a folder: a command that will write a folder there says so
    before its work (reading data, training a tokenizer), not after it. ``option`` names the option that
    gave the path (``--out``), for the message."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise AttnlabError(f"{path} exists and is not a folder" + (f"; {option} names a folder" if option else ""))
    if path.is_symlink() and not path.exists():  # (creating the folder would fail with a bare "File exists")
        raise AttnlabError(f"{path} is a link to {os.readlink(path)}, which does not exist; make that folder or "
                           f"give another {option or 'path'}")


def refuse_unwritable(path: str | Path, named: str) -> None:
    """Refuse, before the work, a ``path`` that :func:`atomic_path` (or a folder made there) could not write where
    it writes it: a device or stream in place (it must be writable itself), a file through a link at the link's
    target, in the nearest existing folder (missing ones below it are made, but not through a link to nowhere).
    ``named``: how the message names the path (``--output hyp.txt``)."""
    path = Path(path)
    if path.is_symlink():
        try:
            path.resolve()
        except RuntimeError:  # (Python's word for a loop of links)
            raise AttnlabError(f"{named} is a loop of links") from None
    if written_in_place(path):  # (asked of the name given: /dev/stdout resolves to the file the shell opened)
        if not os.access(path, os.W_OK):
            raise AttnlabError(f"{named} cannot be written by this user")
        return
    for folder in (Path(os.path.realpath(path)) if path.is_symlink() else path.absolute()).parents:
        if folder.is_symlink() and not folder.exists():
            raise AttnlabError(f"{named}: {folder} is a link to {os.readlink(folder)}, which does not exist")
        if folder.exists():
            if not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
                raise AttnlabError(f"{named}: {folder} is not a folder this command can write in")
            # os.access answers from the permission bits, which root passes everywhere: /proc, a read-only bind
            # mount seen by some kernels, a server that maps root to nobody. A file made (with no name, where the
            # file system allows) and dropped asks the file system itself.
            try:
                with tempfile.TemporaryFile(dir=folder):
                    pass
            except OSError as err:
                raise AttnlabError(f"{named}: {folder} is not a folder this command can write in "
                                   f"({err.strerror or err})") from None
            return


def ensure_writable_dir(path: str | Path) -> Path:
    """Create ``path`` if needed and check that files can be written in it."""
    path = Path(path)
    refuse_non_folder(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise AttnlabError(f"cannot create folder {path}: {err.strerror}") from err
    if not os.access(path, os.W_OK | os.X_OK):
        raise AttnlabError(f"folder {path} is not writable")
    _lock_if_held(path)
    return path


#: run folder (real path) -> [its locked descriptor (None while the folder does not exist), holders in this process]
_HELD: dict[str, list] = {}


@contextmanager
def holding_run_folder(folder: str | Path, *, writer: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on a run folder while this process trains into it.

    Two trainings in one folder (a second ``--resume`` while the first still runs, or torchrun workers left
    running after their launcher was killed) would write each other's checkpoints and metrics. The lock is
    ``flock`` on the folder itself, so nothing is added to it, and the kernel lets it go when the process ends,
    however it ends. Only the process that writes the run (``writer``: rank 0) takes it. Nested holds in one
    process share the lock, and a folder that does not exist yet is locked as soon as :func:`ensure_writable_dir`
    makes it, before the run writes its first file there (or by the next hold entered).

    Raises:
        AttnlabError: another process holds the folder.
    """
    if not writer or fcntl is None:  # (Windows has no flock: its run folders are not locked)
        yield
        return
    key = os.path.realpath(folder)
    held = _HELD.setdefault(key, [None, 0])
    held[1] += 1
    try:
        _lock_if_held(folder)
        yield
    finally:
        held[1] -= 1
        if held[1] == 0:
            del _HELD[key]
            if held[0] is not None:
                os.close(held[0])  # closing the descriptor lets the lock go


def folder_in_use(folder: str | Path) -> bool:
    """Whether another process holds ``folder``'s lock (:func:`holding_run_folder`): a training writes into it."""
    if fcntl is None or os.path.realpath(folder) in _HELD:
        return False
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return False
    try:  # a shared lock is refused while an exclusive one is held, and goes when the descriptor closes
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # a folder that cannot be locked at all (see _lock_folder)
        return False
    finally:
        os.close(fd)
    return False


def _lock_if_held(folder: str | Path) -> None:
    """Lock a folder this process holds (:func:`holding_run_folder`) and has not locked yet, if it exists."""
    key = os.path.realpath(folder)
    held = _HELD.get(key)
    if held is not None and held[0] is None and os.path.isdir(key):
        held[0] = _lock_folder(key, folder)


def _lock_folder(path: str, name: str | Path) -> int | None:
    """A descriptor of folder ``path`` holding its ``flock``; an error naming ``name`` if another process has it.

    None where the folder cannot be locked at all (NFS without a lock service, some FUSE file systems, a folder
    that may be written but not listed): training goes on there unlocked, as it did before there were locks.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise AttnlabError(f"{name} is in use: another attnlab process is training into it (after a killed "
                           "torchrun, its workers may still be running); let it end or stop it, or choose another "
                           "--out") from None
    except OSError:
        os.close(fd)
        return None
    return fd

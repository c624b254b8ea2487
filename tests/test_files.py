"""Atomic writes: the file appears whole or not at all, with the permissions an ordinary write gives."""

import os
import stat

import pytest

from attnlab.errors import AttnlabError
from attnlab.files import atomic_dir, atomic_path, fingerprint, read_lines, refuse_changed, write_text_atomic


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_new_files_and_folders_follow_the_umask_and_replaced_files_keep_their_mode(tmp_path, umask_022):
    write_text_atomic(tmp_path / "new.json", "{}")
    assert mode(tmp_path / "new.json") == 0o644  # mkstemp alone would leave 0600: unreadable to others
    private = tmp_path / "private.json"
    private.write_text("old")
    private.chmod(0o600)
    write_text_atomic(private, "new")
    assert private.read_text() == "new" and mode(private) == 0o600
    with atomic_dir(tmp_path / "folder") as tmp:
        (tmp / "a.txt").write_text("a")
    assert mode(tmp_path / "folder") == 0o755 and (tmp_path / "folder" / "a.txt").read_text() == "a"


def test_weights_and_checkpoints_written_by_safetensors_are_readable_like_any_file(tmp_path, umask_022):
    """safetensors replaces the file it is given with a private (0600) one; run folders are shared."""
    import torch

    from attnlab.training.checkpoint import save_checkpoint, save_weights

    model = torch.nn.Linear(3, 2)
    save_weights(model, tmp_path / "model.safetensors")
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(1, 3)).sum().backward()
    optimizer.step()
    save_checkpoint(tmp_path, model, optimizer, {"step": 1})
    written = [tmp_path / "model.safetensors", *sorted((tmp_path / "checkpoint").iterdir())]
    assert len(written) == 4 and {p.name: mode(p) for p in written} == {p.name: 0o644 for p in written}


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "keep.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_writing_over_a_folder_names_the_folder_not_a_temporary_file(tmp_path):
    from attnlab.errors import AttnlabError

    (tmp_path / "out").mkdir()
    with pytest.raises(AttnlabError, match=r"out is a folder; give a file name to write"):
        write_text_atomic(tmp_path / "out", "x")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary left behind


def test_a_bad_byte_is_named_by_its_line_after_a_byte_order_mark_and_a_broken_gzip_body_by_its_file(tmp_path):
    import gzip

    from attnlab.errors import AttnlabError
    from attnlab.files import decode_utf8, read_lines

    data = b"\xef\xbb\xbftext,label\nhello,1\n\xe9t\xe9,2\n"
    with pytest.raises(AttnlabError, match=r"^t.csv is not UTF-8 text \(line 3: "):
        decode_utf8(data, "t.csv", bom=True)
    assert decode_utf8(b"\xef\xbb\xbfa,b\n", "t.csv", bom=True) == "a,b\n"
    packed = gzip.compress(b"ein Mann\n" * 50)
    broken = tmp_path / "s.de.gz"
    broken.write_bytes(packed[:12] + bytes([packed[12] ^ 0xFF]) + packed[13:])
    with pytest.raises(AttnlabError, match="s.de.gz is not a readable gzip file"):
        read_lines(broken)


def test_a_file_where_a_folder_should_be_is_named_without_blaming_an_option(tmp_path):
    from attnlab.errors import AttnlabError

    (tmp_path / "s.xx").write_text("not a folder")
    with pytest.raises(AttnlabError, match=r"s.xx exists and is not a folder$"):
        write_text_atomic(tmp_path / "s.xx" / "out.txt", "x")


def test_temporaries_abandoned_by_a_killed_writer_are_removed_by_the_next_write(tmp_path):
    import subprocess
    import sys

    from attnlab.files import atomic_dir

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=120)
    pid = int(dead.stdout)  # a process that has ended: its temporaries can have no writer any more
    abandoned = tmp_path / f".checkpoint.{pid}.abc123.tmp"
    abandoned.mkdir()
    (abandoned / "model.safetensors").write_bytes(b"half")
    mine = tmp_path / f".checkpoint.{os.getpid()}.def456.tmp"  # a live writer's (this process): kept
    mine.mkdir()
    # Not ours to judge: another file's temporary whose name starts the same way, and a name that is no pid.
    other = tmp_path / f".checkpoint.20000.{pid}.xyz789.tmp"  # belongs to "checkpoint.20000"
    other.mkdir()
    odd = tmp_path / ".checkpoint.20240101120000.abc.tmp"
    odd.mkdir()
    with atomic_dir(tmp_path / "checkpoint") as tmp:
        (tmp / "a.txt").write_text("a")
    assert not abandoned.exists() and mine.exists() and (tmp_path / "checkpoint" / "a.txt").read_text() == "a"
    assert other.exists() and odd.exists()


def test_a_folder_that_refuses_new_files_is_named_by_the_path_given_not_the_temporary_one(tmp_path, monkeypatch):
    import errno
    import tempfile

    def refused(*args, **kwargs):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(tmp_path / ".out.txt.123.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", refused)  # as /proc does
    with pytest.raises(AttnlabError, match=r"^cannot write .*out\.txt: No such file or directory$"):
        write_text_atomic(tmp_path / "out.txt", "x")


def test_a_resume_is_refused_on_data_whose_bytes_changed_and_the_message_says_how(tmp_path):
    data, other = tmp_path / "data.txt", tmp_path / "other.txt"
    data.write_text("one\ntwo\n")
    other.write_text("one\ntwo\n")
    saved = fingerprint(data)
    assert saved == fingerprint(other) and len(saved) == 64
    refuse_changed(other, saved, what="text", started_with=data)  # the same bytes under another name: fine
    refuse_changed(data, None, what="text", started_with=data)  # a run that recorded no digest: nothing to compare
    data.write_text("one\nthree\n")
    with pytest.raises(AttnlabError, match=r"data.txt has changed since this run started \(its bytes differ\); "
                                           r"resume needs the text it started with$"):
        refuse_changed(data, saved, what="text", started_with=tmp_path / "." / "data.txt")
    with pytest.raises(AttnlabError, match=r"data.txt is not the text this run started with \(.*other.txt\)"):
        refuse_changed(data, saved, what="text", started_with=other)


def test_a_gz_name_is_written_compressed_and_reads_back(tmp_path):
    path = tmp_path / "out.txt.gz"
    write_text_atomic(path, "ein Satz\nzwei\n")
    assert path.read_bytes()[:2] == b"\x1f\x8b" and read_lines(path) == ["ein Satz", "zwei"]
    first = path.read_bytes()
    write_text_atomic(path, "ein Satz\nzwei\n")
    assert path.read_bytes() == first  # no time stamp inside: the same text, the same bytes


def test_every_file_is_flushed_to_disk_before_its_rename(tmp_path, monkeypatch):
    """After a crash of the machine a rename can stand on disk without the data renamed; the old checkpoint is
    removed once the new one is in place, so each file written must be flushed before the swap."""
    import attnlab.files as files

    flushed, real_fsync = [], os.fsync

    def spy(fd):
        flushed.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(files.os, "fsync", spy)
    with atomic_dir(tmp_path / "checkpoint") as tmp:
        (tmp / "model.safetensors").write_bytes(b"weights")
        (tmp / "trainer.json").write_text("{}")
        folder = tmp.name
    assert {"model.safetensors", "trainer.json", folder} <= set(flushed[:3])
    flushed.clear()
    write_text_atomic(tmp_path / "notes.txt", "text")
    assert flushed[0].endswith(".tmp") and flushed[0].startswith(".notes.txt")


def test_a_symbolic_link_is_written_through_and_kept(tmp_path):
    target = tmp_path / "real.txt"
    target.write_text("old\n", encoding="utf-8")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    write_text_atomic(link, "new\n")
    assert link.is_symlink() and target.read_text(encoding="utf-8") == "new\n"


def test_a_named_pipe_and_a_device_are_written_to_not_replaced(tmp_path):
    import threading
    from pathlib import Path

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text(encoding="utf-8")), daemon=True)
    reader.start()
    write_text_atomic(fifo, "through the pipe\n")
    reader.join(timeout=10)
    assert got == ["through the pipe\n"] and stat.S_ISFIFO(fifo.stat().st_mode)
    null = Path(os.devnull)
    if os.access(null, os.W_OK):
        write_text_atomic(null, "gone\n")
        assert stat.S_ISCHR(null.stat().st_mode)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no /proc/self/fd on this system")
def test_a_link_to_an_open_stream_is_written_into_the_stream_not_over_the_file_it_is_open_on(tmp_path):
    redirected = tmp_path / "log.txt"  # as a shell's >> leaves standard output: open on a file, appending
    redirected.write_text("before\n", encoding="utf-8")
    fd = os.open(redirected, os.O_WRONLY | os.O_APPEND)
    try:
        stream = tmp_path / "stdout"  # what /dev/stdout is: a link to /proc/self/fd/N
        stream.symlink_to(f"/proc/self/fd/{fd}")
        write_text_atomic(stream, "written\n")
        os.write(fd, b"after\n")  # the process's own later output still lands in the same file
    finally:
        os.close(fd)
    assert redirected.read_text(encoding="utf-8") == "before\nwritten\nafter\n"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no /proc/self/fd on this system")
def test_what_names_a_stream_is_told_by_the_links_real_folders_not_by_the_paths_text(tmp_path):
    from pathlib import Path

    from attnlab.files import _names_a_stream

    fd = os.open(tmp_path / "log.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        relative = tmp_path / "rel"
        relative.symlink_to(os.path.relpath(f"/proc/self/fd/{fd}", tmp_path))
        (tmp_path / "fds").symlink_to("/proc/self/fd")  # a folder link on the way
        assert _names_a_stream(relative) and _names_a_stream(tmp_path / "fds" / str(fd))
    finally:
        os.close(fd)
    # a regular file under /dev (/dev/shm holds them) is replaced like any other, not appended to
    assert not _names_a_stream(Path("/dev/shm/result.json")) and not _names_a_stream(tmp_path / "log.txt")


def test_a_file_of_any_legal_name_is_written_through_a_temporary_of_a_legal_name(tmp_path):
    """The temporary adds a dot, the process id, a random part and .tmp: beside a 250-byte name it was too long."""
    from attnlab.files import atomic_path, temporary_stem

    for name in ("é" * 125, "x" * 254):  # 250 and 254 bytes: legal names
        with atomic_path(tmp_path / name) as tmp:
            assert len(os.fsencode(tmp.name)) <= 255
            tmp.write_text("done")
        assert (tmp_path / name).read_text() == "done"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert temporary_stem("short.txt") == "short.txt"
    assert temporary_stem("a" * 254) != temporary_stem("a" * 253 + "b")  # two long names keep apart


def test_a_link_to_a_folder_that_does_not_exist_is_refused_by_name(tmp_path):
    from attnlab.files import ensure_writable_dir

    (tmp_path / "out").symlink_to(tmp_path / "nowhere")
    with pytest.raises(AttnlabError, match=f"out is a link to {tmp_path / 'nowhere'}, which does not exist"):
        ensure_writable_dir(tmp_path / "out")  # (mkdir said only "File exists")


def test_a_full_disk_while_writing_is_said_by_the_file_name(tmp_path):
    """The system's error for a full disk names no file: the command line said only 'No space left on device'."""
    import errno

    target = tmp_path / "config.json"
    target.write_text("old")
    with pytest.raises(AttnlabError, match=f"cannot write {target}: No space left on device"):
        with atomic_path(target) as tmp:
            tmp.write_text("new, half")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["config.json"]
    with pytest.raises(AttnlabError, match=f"cannot write {os.devnull}: No space left on device \\(its temporary"):
        with atomic_path(os.devnull) as tmp:  # written in place, through a temporary file in TMPDIR
            raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(PermissionError):  # other errors are left as they are
        with atomic_path(target):
            raise PermissionError(errno.EACCES, "Permission denied")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc on this system")
def test_a_folder_that_refuses_files_is_refused_before_the_work_even_where_the_permission_bits_allow(tmp_path,
                                                                                                    monkeypatch):
    """Root passes every permission check, and `translate --output /proc/x.txt` decoded a whole file before
    failing to write it; `train translate --out /proc/run` trained its BPE vocabulary first."""
    from pathlib import Path

    from click.testing import CliRunner

    from attnlab.cli.main import cli
    from attnlab.files import refuse_unwritable

    monkeypatch.setattr(os, "access", lambda *args, **kwargs: True)  # as root sees it
    with pytest.raises(AttnlabError, match=r"^--output /proc/x\.txt: /proc is not a folder this command can write "
                                           r"in \(.+\)$"):
        refuse_unwritable(Path("/proc/x.txt"), "--output /proc/x.txt")
    refuse_unwritable(tmp_path / "new" / "x.txt", "--output")  # a folder that takes files: accepted...
    assert list(tmp_path.iterdir()) == []  # ...and asking left nothing there, not even the folder to be made
    for lang in ("de", "en"):
        (tmp_path / f"pairs.{lang}").write_text("ein Mann\n" * 20 if lang == "de" else "a man\n" * 20)
    result = CliRunner().invoke(cli, ["train", "translate", "--train", str(tmp_path / "pairs"), "--valid",
                                      str(tmp_path / "pairs"), "--out", "/proc/run", "--steps", "2"])
    assert result.exit_code == 2 and result.stderr == \
        "error: --out /proc/run: /proc is not a folder this command can write in (No such file or directory)\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["pairs.de", "pairs.en"]

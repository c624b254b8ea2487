"""Options shared by every command: path names that may not be empty, numbers that must be finite."""

import click
import pytest
import torch
from click.testing import CliRunner

from attnlab.cli.main import cli
from attnlab.cli.params import FiniteFloat, PathParam, Threads, WholeNumber


def all_params():
    """(command path, parameter) for every parameter of every command."""
    def commands(group: click.Group, ctx: click.Context, prefix: str):
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if isinstance(command, click.Group):
                yield from commands(command, ctx, f"{prefix}{name} ")
            else:
                yield f"{prefix}{name}", command

    return [(name, p) for name, command in commands(cli, click.Context(cli), "") for p in command.params]


def test_every_path_of_every_command_refuses_an_empty_name():
    paths = [(name, p.name, p.type) for name, p in all_params() if isinstance(p.type, click.Path)]
    assert len(paths) > 20  # --out, --text, RUN, --glove, ... across the commands
    assert [(name, param) for name, param, kind in paths if not isinstance(kind, PathParam)] == []


def test_a_whole_number_option_given_no_number_says_it_wants_an_integer():
    ranges = [(name, p.name, p.type) for name, p in all_params() if isinstance(p.type, click.IntRange)]
    assert len(ranges) > 40  # --steps, --seed, --top-k, --threads, --dim, ... across the commands
    assert [(name, param) for name, param, kind in ranges if not isinstance(kind, WholeNumber)] == []
    refused = CliRunner().invoke(cli, ["train", "lm", "--text", "t", "--out", "o", "--steps", "abc"])
    assert refused.exit_code == 2  # (click said "'abc' is not a valid integer range")
    assert refused.stderr.splitlines()[-1].startswith("error: Invalid value for '--steps': 'abc' is not a valid integer.")
    assert "--steps INTEGER" in CliRunner().invoke(cli, ["train", "lm", "--help"]).stdout
    assert "INTEGER RANGE" not in CliRunner().invoke(cli, ["train", "lm", "--help"]).stdout


def test_every_seed_option_stops_where_torch_stops_telling_seeds_apart():
    first = torch.Generator().manual_seed(0)
    wrapped = torch.Generator().manual_seed(2**32)  # the reason: the CPU generator keeps the seed's low 32 bits
    assert torch.equal(torch.rand(8, generator=first), torch.rand(8, generator=wrapped))
    seeds = [(name, p.type) for name, p in all_params() if p.name == "seed"]
    assert len(seeds) >= 5  # train lm / classify / translate, generate, probe, experiment teacher-forcing
    assert [name for name, kind in seeds if (kind.min, kind.max) != (0, 2**32 - 1)] == []
    refused = CliRunner().invoke(cli, ["generate", "run", "--prompt", "a", "--seed", str(2**32)])
    assert refused.exit_code == 2
    assert refused.stderr.splitlines()[-1] == (
        "error: Invalid value for '--seed': 4294967296 is not in the range 0<=x<=4294967295. (see 'cli generate --help')")


def test_every_float_option_refuses_nan_and_infinity():
    floats = [(name, p.name, p.type) for name, p in all_params() if isinstance(p.type, click.types.FloatParamType)]
    assert len(floats) > 20  # --lr, --dropout, --temperature, --length-penalty, ... across the commands
    assert [(name, param) for name, param, kind in floats if not isinstance(kind, FiniteFloat)] == []


def test_every_threads_option_notes_more_threads_than_cpus(monkeypatch):
    threads = [(name, p.type) for name, p in all_params() if p.name == "threads"]
    assert len(threads) >= 6 and [name for name, kind in threads if not isinstance(kind, Threads)] == []
    monkeypatch.setattr("attnlab.cli.params.own_cpus", lambda: {0, 1})

    @click.command()
    @click.option("--threads", type=Threads(), default=None)
    def command(threads):
        click.echo(threads)

    many = CliRunner().invoke(command, ["--threads", "1000"])
    assert many.exit_code == 0 and many.stdout == "1000\n"
    assert many.stderr == ("note: --threads 1000 is more than the 2 CPUs this process may use; the extra threads only "
                           "wait for each other\n")
    assert CliRunner().invoke(command, ["--threads", "2"]).stderr == ""
    assert CliRunner().invoke(command, ["--threads", "-1"]).exit_code == 2
    # Far past any machine: torch's conversion overflowed (a traceback), OpenMP crashed the process.
    for huge in ("4097", "40000", "99999999999"):
        refused = CliRunner().invoke(command, ["--threads", huge])
        assert refused.exit_code == 2 and f"{huge} is not in the range 0<=x<=4096" in refused.stderr
    assert CliRunner().invoke(command, ["--threads", "4096"]).exit_code == 0


@pytest.mark.parametrize("args", [["train", "classify", "--train", "x.csv", "--out", "y", "--dropout", "nan"],
                                  ["train", "lm", "--text", "x", "--out", "y", "--lr", "inf"],
                                  ["translate", "run", "a", "--length-penalty", "1e9"],
                                  ["train", "translate", "--train", "t", "--valid", "v", "--out", "o", "--ema", "nan"]])
def test_a_number_that_is_not_finite_or_out_of_range_is_one_error_line(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and result.stderr.startswith("error: Invalid value")
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


@pytest.mark.parametrize("command", ["lm", "classify"])
def test_an_out_that_is_a_file_is_refused_before_the_data_is_read(command, tmp_path):
    (tmp_path / "t.txt").write_text("to be or not to be\n" * 200)
    (tmp_path / "t.csv").write_text("text,label\n" + "".join(f"ticket {i},L{i % 2}\n" for i in range(40)))
    (tmp_path / "file").write_text("keep me")
    data = ["--text", tmp_path / "t.txt"] if command == "lm" else ["--train", tmp_path / "t.csv"]
    result = CliRunner().invoke(cli, [str(a) for a in ["train", command, *data, "--out", tmp_path / "file",
                                                      "--no-progress"]])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines()[-1] == \
        f"error: {tmp_path / 'file'} exists and is not a folder; --out names a folder"
    assert "data:" not in result.output and "schedule:" not in result.output  # nothing read or measured first
    assert (tmp_path / "file").read_text() == "keep me"


def test_help_shows_the_range_of_bounded_floats_and_nothing_for_unbounded_ones():
    for args in (["train", "lm"], ["train", "classify"], ["generate"], ["train", "translate"]):
        text = CliRunner().invoke(cli, [*args, "--help"]).output
        assert "None" not in text, (args, text)
    assert "0<=x<1]" in CliRunner().invoke(cli, ["train", "translate", "--help"]).output  # --dropout keeps its range


@pytest.mark.parametrize("args, shown", [
    (["train", "lm", "--text", "t.txt", "--out", "o", "--val-fraction", "1.5"], "'--val-fraction' / '--valid-fraction': 1.5 is not in the range 0<x<1"),
    (["train", "lm", "--text", "t.txt", "--out", "o", "--lr", "-1"], "'--lr': -1.0 is not in the range x>0"),
    (["train", "classify", "--train", "t.csv", "--out", "o", "--ema", "2"], "'--ema': 2.0 is not in the range 0<=x<1"),
    (["train", "classify", "--train", "t.csv", "--out", "o", "--valid-fraction", "0"],
     "'--valid-fraction': 0.0 is not in the range 0<x<1"),
])
def test_option_ranges_are_checked_where_help_shows_them(args, shown):
    """Said by the option parser, so the line names the option, its range and --help, before any file is read."""
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and shown in result.stderr and "--help" in result.stderr, result.stderr


@pytest.mark.parametrize("raised, said", [
    (RuntimeError("[enforce fail at alloc_cpu.cpp:121] data. DefaultCPUAllocator: can't allocate memory: you tried "
                  "to allocate 128000000000 bytes. Error code 12 (Cannot allocate memory)"),
     "error: out of memory (128.0 GB asked for): the model or the work asked of it is too large for this machine's "
     "memory\n"),
    (MemoryError(), "error: out of memory: the model or the work asked of it is too large"),
])
def test_a_model_too_large_for_the_memory_is_one_error_line_not_a_traceback(raised, said, tmp_path, monkeypatch):
    from attnlab.training.engine import Trainer

    def too_large(*args, **kwargs):  # a batch too large, once the run folder is written
        raise raised

    monkeypatch.setattr(Trainer, "_step", too_large)
    text = tmp_path / "t.txt"
    text.write_text("hello world\n" * 50, encoding="utf-8")
    result = CliRunner().invoke(cli, ["train", "lm", "--text", str(text), "--out", str(tmp_path / "run"),
                                      "--context", "8", "--no-progress"])
    assert result.exit_code == 2 and result.stderr.startswith(said) and result.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()  # a run that failed before its first checkpoint leaves nothing


def test_a_runtime_error_that_is_not_about_memory_is_not_dressed_up_as_one(tmp_path, monkeypatch):
    import attnlab.tasks.lm_train as lm_train

    def broken(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(lm_train, "build_lm", broken)
    text = tmp_path / "t.txt"
    text.write_text("hello world\n" * 50, encoding="utf-8")
    result = CliRunner().invoke(cli, ["train", "lm", "--text", str(text), "--out", str(tmp_path / "run")])
    assert result.exit_code == 1 and isinstance(result.exception, RuntimeError)  # a bug: its traceback is kept


def test_a_bpe_vocabulary_past_any_real_one_is_refused_before_the_trainer_allocates_for_it(tmp_path):
    from click.testing import CliRunner

    from attnlab.cli.main import cli

    text = tmp_path / "t.txt"
    text.write_text("some text to read\n" * 50, encoding="utf-8")
    for args in (["train", "lm", "--text", text, "--tokenizer", "bpe", "--bpe-vocab-size", "10000000000"],
                 ["train", "translate", "--train", tmp_path / "t", "--valid", tmp_path / "t", "--vocab-size", "10000000000"]):
        result = CliRunner().invoke(cli, [str(a) for a in (*args, "--out", tmp_path / "run")])
        assert result.exit_code == 2 and "is not in the range 1<=x<=1048576" in result.stderr
    accum = CliRunner().invoke(cli, ["train", "lm", "--text", str(text), "--grad-accum", "99999999", "--out",
                                     str(tmp_path / "g")])  # every micro-batch of a step is drawn before it
    assert accum.exit_code == 2 and "1<=x<=65536" in accum.stderr
    budget = CliRunner().invoke(cli, ["train", "classify", "--train", str(text), "--out", str(tmp_path / "c"),
                                      "--max-seconds", "1e308"])  # its epochs are fitted to the budget: an overflow
    assert budget.exit_code == 2 and "--max-seconds" in budget.stderr


def test_python_dash_m_attnlab_is_the_attnlab_command():
    import subprocess
    import sys

    from attnlab import __version__

    done = subprocess.run([sys.executable, "-m", "attnlab", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and __version__ in done.stdout, done.stderr
    bad = subprocess.run([sys.executable, "-m", "attnlab", "summary", "--preset", "nope"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and len(bad.stderr.splitlines()) == 1
    assert "(see 'python -m attnlab summary --help')" in bad.stderr  # the name it was called by


def test_a_missing_part_of_an_installed_package_or_a_stub_without_a_spec_is_not_said_to_be_uninstalled(monkeypatch):
    import sys
    import types

    from attnlab.cli.lazy import missing_package

    assert missing_package(ModuleNotFoundError("no tqdm", name="tqdm")) == "tqdm"
    assert missing_package(ModuleNotFoundError("no attnlab.x", name="attnlab.x")) is None
    assert missing_package(ModuleNotFoundError("no scipy.nothing", name="scipy.nothing")) is None  # scipy is here
    monkeypatch.setitem(sys.modules, "tqdm", types.ModuleType("tqdm"))  # a stand-in without __spec__: find_spec raised
    assert missing_package(ModuleNotFoundError("no tqdm.auto", name="tqdm.auto")) is None


def every_lazy_command():
    """(group, name, command) for every command that a lazy group lists, the nested groups' included."""
    from attnlab.cli.lazy import LazyGroup

    found, groups = [], [cli]
    while groups:
        group = groups.pop()
        for name in group.list_commands(click.Context(group)):
            command = group.get_command(click.Context(group), name)
            found.append((group, name, command))
            if isinstance(command, LazyGroup):
                groups.append(command)
    return found


def test_help_lists_each_commands_summary_as_click_would_from_the_command_itself():
    """--help reads each summary from the source; it must be the one click takes from the imported command."""
    from attnlab.cli.lazy import short_help_from_source

    listed = every_lazy_command()
    assert len(listed) >= 18  # 11 commands, 3 training tasks, 2 evaluations, 2 probes, the leak experiment
    for group, name, command in listed:
        for limit in (20, 45, 74, 200):
            assert short_help_from_source(group.lazy_commands[name], limit) == command.get_short_help_str(limit), name


def test_a_command_whose_source_does_not_say_its_summary_plainly_is_imported_to_list_it(tmp_path, monkeypatch):
    from attnlab.cli.lazy import LazyGroup, short_help_from_source

    (tmp_path / "odd_commands.py").write_text('''import click


@click.command(short_help="The short help given.")
def given():
    """The docstring, which click does not list when a short help is given."""


@click.command(hidden=True)
def hidden():
    """Not listed at all."""


def make():
    return click.command("made")(lambda: None)


made = make()


@click.command()
def plain():
    """A plain command.

    More text.
    """
''', encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert short_help_from_source("odd_commands:plain", 80) == "A plain command."
    assert [short_help_from_source(f"odd_commands:{name}", 80) for name in ("given", "hidden", "made", "absent")] \
        == [None] * 4
    assert short_help_from_source("no_such_module_here:plain", 80) is None

    group = LazyGroup("odd", lazy_commands={name: f"odd_commands:{name}" for name in ("given", "hidden", "made",
                                                                                      "plain")})
    text = CliRunner().invoke(group, ["--help"]).output
    listed = text.split("Commands:")[1]
    assert "The short help given." in listed and "A plain command." in listed and "made" in listed
    assert "hidden" not in listed and "The docstring" not in listed


def test_help_imports_no_command_and_so_not_torch():
    """`attnlab --help` took 4.5 s here when it imported every command module (most import torch); now 0.2 s."""
    import subprocess
    import sys

    code = ("import sys\nfrom attnlab.cli.main import main\nsys.argv = ['attnlab', {args}]\n"
            "try:\n    main()\nexcept SystemExit as end:\n    assert end.code == 0, end.code\n"
            "print(sorted(name for name in ('torch', 'numpy', 'attnlab.cli.generate', 'attnlab.cli.train_lm') "
            "if name in sys.modules))")
    for args in ("'--help'", "'train', '--help'"):
        done = subprocess.run([sys.executable, "-c", code.format(args=args)], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert "Commands:" in done.stdout and done.stdout.splitlines()[-1] == "[]", done.stdout

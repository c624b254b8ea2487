"""The training commands under torchrun: every process checks the run folder before rank 0 alone writes it,
rank 0 alone reports, and an error says which process it comes from.

Each test launches two processes on the CPU (gloo) on a text or corpus the test writes.
"""

import json
import os
import random
import subprocess
import sys
import textwrap

from launch import TWO_LOCAL_PROCESSES
from test_lm import TEXT
from test_translate import SMALL, write_corpus

LM = ["--layers", "1", "--width", "16", "--heads", "2", "--context", "8", "--batch-size", "4", "--steps", "4",
      "--warmup", "1", "--eval-every", "2", "--eval-iters", "1", "--final-eval-iters", "1", "--no-progress",
      "--threads", "1"]


def torchrun(tmp_path, *args, rank0_delay=0.0):
    """``attnlab ARGS`` in two processes; rank 0 starts ``rank0_delay`` seconds late (the other would write first
    if it could)."""
    launcher = tmp_path / "late_rank0.py"
    launcher.write_text(textwrap.dedent(f"""
        import os, sys, time
        if os.environ["RANK"] == "0":
            time.sleep({rank0_delay})
        sys.argv[0] = "attnlab"
        from attnlab.cli.main import main
        main()
    """))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", *TWO_LOCAL_PROCESSES,
                           str(launcher), *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=300)


def test_a_new_lm_run_is_written_by_rank_0_alone_and_reported_once(tmp_path):
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    done = torchrun(tmp_path, "train", "lm", "--text", text, "--out", tmp_path / "run", *LM, rank0_delay=3)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "already holds a run" not in done.stderr
    assert done.stdout.count("final val loss") == 1  # the other process prints nothing
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["peak_flops"] > 0 and result["steps"] == 4  # rank 0's report
    # the global rate's denominator is both processes' peak, not rank 0's alone (which halved it)
    assert result["peak_basis"].endswith("summed over the 2 processes timing at once")


def test_a_new_translation_run_is_written_by_rank_0_alone(tmp_path):
    rng = random.Random(0)
    write_corpus(tmp_path / "train", 60, rng)
    write_corpus(tmp_path / "valid", 8, rng)
    done = torchrun(tmp_path, "train", "translate", "--train", tmp_path / "train", "--valid", tmp_path / "valid",
                    "--src", "xx", "--tgt", "yy", "--out", tmp_path / "run", "--max-steps", "2", "--eval-every", "2",
                    *SMALL, rank0_delay=3)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "already holds a run" not in done.stderr
    assert done.stderr.count("training BPE") == 1  # rank 0 logs; the other process is quiet
    assert (tmp_path / "run" / "result.json").is_file()


def test_under_torchrun_each_process_names_itself_in_its_error_and_small_batches_are_refused(tmp_path):
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    done = torchrun(tmp_path, "train", "lm", "--text", text, "--out", tmp_path / "run", *LM, "--batch-size", "1")
    lines = [line for line in done.stderr.splitlines() if "error:" in line]
    message = "--batch-size 1 is smaller than the 2 processes torchrun started"
    assert any(line.startswith("error: " + message) for line in lines), done.stderr[-3000:]
    # The other process says it too, unless torchrun stopped it first (it ends the others when one fails)
    said = any(line.startswith("[rank 1] error: " + message) for line in lines)
    assert said or "[rank 1] terminated" in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "run").exists()


def test_translation_under_torchrun_trains_on_the_batches_of_one_pair_too(tmp_path):
    rng = random.Random(0)
    write_corpus(tmp_path / "train", 60, rng)
    write_corpus(tmp_path / "valid", 8, rng)
    small = [a if a != "600" else "12" for a in SMALL]  # --max-tokens 12: most batches hold a single pair
    args = ["train", "translate", "--train", tmp_path / "train", "--valid", tmp_path / "valid", "--src", "xx", "--tgt",
            "yy", "--max-steps", "20", "--eval-every", "20", *small]
    one = subprocess.run([sys.executable, "-m", "attnlab.cli.main", *map(str, args), "--out", str(tmp_path / "one")],
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    two = torchrun(tmp_path, *args, "--out", tmp_path / "two")
    assert two.returncode == 0, two.stderr[-3000:]

    def losses(run):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [round(json.loads(line)["loss"], 3) for line in lines if '"loss"' in line and '"eval"' not in line]

    # the same pairs in the same steps (a process without a pair runs one with its loss ignored), to float rounding
    assert losses("one") == losses("two") and len(losses("one")) == 2


def test_a_process_that_dies_mid_run_leaves_the_other_one_line_and_the_resume_advice(tmp_path):
    # gloo's error in the survivor was a 60-line traceback of a RuntimeError, without the checkpoint it had kept.
    text = tmp_path / "fox.txt"
    text.write_text(TEXT, encoding="utf-8")
    launcher = tmp_path / "dying_rank1.py"
    launcher.write_text(textwrap.dedent("""
        import os, sys
        if os.environ["RANK"] == "1":  # ends without a word at its 12th step (the checkpoints come every 2)
            import attnlab.training.distributed as distributed
            real, calls = distributed.broadcast_flag, []
            def dying(flag, place):
                calls.append(flag)
                if len(calls) == 12:
                    os._exit(3)
                return real(flag, place)
            distributed.broadcast_flag = dying
        sys.argv[0] = "attnlab"
        from attnlab.cli.main import main
        main()
    """))
    steps = [*LM[:LM.index("--steps")], "--steps", "200", *LM[LM.index("--steps") + 2:], "--checkpoint-every", "2"]
    # torchrun looks at its workers every 5 s, not 0.1: it would otherwise SIGTERM the survivor first, often (which
    # then says "terminated", as on Ctrl-C), before the survivor's collective fails. Even so a look can fall in the
    # 60-80 ms the survivor takes to notice (about 1 run in 60): such a run tells nothing, and is made again.
    for attempt in range(3):
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", *TWO_LOCAL_PROCESSES,
                               "--monitor-interval", "5", str(launcher), "train", "lm", "--text", str(text), "--out",
                               str(tmp_path / f"run{attempt}"), *steps], env={**os.environ, "OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True, timeout=300)
        terminated = any(line.rstrip().endswith("terminated") for line in done.stderr.splitlines())
        if "error: another process" in done.stderr or not terminated:
            break
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if line.startswith(("error:", "the checkpoint of step"))]
    assert len(said) == 2, done.stderr[-3000:]
    assert said[0].startswith("the checkpoint of step ") and said[0].endswith("continue with the same command and "
                                                                               "--resume")
    assert said[1].startswith("error: another process of this torchrun run ended (") and "Connection" in said[1]
    assert "GLHF" not in done.stderr and "[rank0]: Traceback" not in done.stderr


def test_only_a_collectives_lost_peer_is_said_to_be_one(monkeypatch):
    from attnlab.cli.train import peer_lost

    gloo = RuntimeError("[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                        "[127.0.0.1]:2202. This is typically caused by a remote worker crashing. GLHF!")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert peer_lost(gloo) is None  # one process: no peer to lose
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert peer_lost(gloo) == "Connection closed by peer [127.0.0.1]:2202"
    assert peer_lost(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) is None

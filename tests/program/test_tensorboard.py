"""--tensorboard DIR (zerompi/train/outputs/tensorboard.py): the event file read back (TFRecord framing
parsed here, events with tensorboardX's protocol buffers) holds the --metrics file's values at the
same steps, per rank where the metrics have one value per rank; without tensorboardX the flag is
one error line; a checkpoint folder is refused; a full disk costs one warning."""
import os
import struct

import pytest

from test_cli import ERROR_MARK, launch, train_ok
from test_observability import WARNING_MARK, read_jsonl, small_tmpfs

event_pb2 = pytest.importorskip("tensorboardX.proto.event_pb2")


def read_events(folder):
    """{step: {tag: value}} and [wall times] of the one event file in folder."""
    (name,) = os.listdir(folder)
    assert name.startswith("events.out.tfevents.")
    data = (folder / name).read_bytes()
    steps, times, at = {}, [], 0
    while at < len(data):                    # TFRecord: length (8), crc (4), data, crc (4)
        (length,) = struct.unpack("<Q", data[at:at + 8])
        event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
        at += 12 + length + 4
        if event.HasField("summary"):
            steps[event.step] = {v.tag: v.simple_value for v in event.summary.value}
            times.append(event.wall_time)
    return steps, times


def test_tensorboard_holds_the_metrics_values(tmp_path):
    steps = 7
    train_ok(3, "--steps", steps, "--log-every", 3, "--hidden", "24,16", "--batch-size", 48, "--report", "none",
             "--metrics", "m.jsonl", "--tensorboard", "tb", cwd=tmp_path)
    events, times = read_events(tmp_path / "tb")
    metrics = read_jsonl(tmp_path / "m.jsonl")
    assert sorted(events) == [line["step"] for line in metrics] == list(range(1, steps + 1))
    assert times == [line["time"] for line in metrics]
    float32 = dict(rel=1e-6, abs=1e-30)
    for line in metrics:
        scalars = events[line["step"]]
        for tag, key in (("train/loss", "loss"), ("train/accuracy", "accuracy"), ("train/lr", "lr"),
                         ("train/grad_norm", "grad_norm"), ("train/loss_scale", "loss_scale"),
                         ("time/step_seconds", "step_seconds"), ("time/samples_per_second", "samples_per_second")):
            assert scalars[tag] == pytest.approx(line[key], **float32), tag
        for purpose, totals in line["comm"].items():
            assert scalars[f"comm/{purpose}_bytes"] == pytest.approx(totals["bytes"], **float32)
        per_rank = {tag for tag in scalars if "/rank_" in tag}
        if "memory" not in line:
            assert per_rank == set()
            continue
        assert per_rank == {f"{kind}/rank_{r}" for r in range(3) for kind in
                            ("memory/ledger_bytes", "memory/peak_rss_bytes", "comm/bytes", "comm/inter_node_bytes",
                             "comm/seconds")}
        for r in range(3):
            assert scalars[f"memory/ledger_bytes/rank_{r}"] == pytest.approx(line["memory"]["ledger_bytes"][r], **float32)
            assert scalars[f"memory/peak_rss_bytes/rank_{r}"] == pytest.approx(line["memory"]["peak_rss_bytes"][r],
                                                                                **float32)
            assert scalars[f"comm/bytes/rank_{r}"] == pytest.approx(line["comm_per_rank"]["bytes"][r], **float32)
            assert scalars[f"comm/seconds/rank_{r}"] == pytest.approx(line["comm_per_rank"]["seconds"][r], **float32)
            assert scalars[f"comm/inter_node_bytes/rank_{r}"] == line["comm_per_rank"]["inter_node_bytes"][r] == 0
        assert line["comm_per_rank"]["bytes"][0] == sum(c["bytes"] for c in line["comm"].values())
        assert scalars["run/restarts"] == 0
    assert [line["step"] for line in metrics if "memory" in line] == [1, 3, 6, 7]


def test_without_tensorboardx_the_flag_is_one_line(tmp_path):
    shadow = tmp_path / "shadow" / "tensorboardX"           # a tensorboardX that cannot be imported
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named tensorboardX')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "shadow"), os.environ.get("PYTHONPATH", "")]))
    run = launch(2, "--steps", 2, "--tensorboard", "tb", cwd=tmp_path, env=env)
    assert run.returncode == 2, run.describe()
    assert run.stderr.strip() == ("zerompi: error: --tensorboard needs tensorboardX: "
                                  "pip install -e '.[tensorboard]'"), run.describe()
    assert not (tmp_path / "tb").exists()


def test_a_checkpoint_folder_is_no_tensorboard_folder(tmp_path):
    run = launch(2, "--steps", 2, "--save-dir", "ck", "--tensorboard", "ck", cwd=tmp_path)
    assert run.returncode == 2 and run.stderr.count(ERROR_MARK) == 1, run.describe()
    assert "--tensorboard ck is a checkpoint folder" in run.stderr, run.describe()


def test_a_full_disk_under_tensorboard_costs_one_warning(tmp_path):
    with small_tmpfs(tmp_path / "full") as full:
        run = launch(2, "--hidden", 8, "--batch-size", 16, "--log-every", 0, "--report", "none", "--steps", 600,
                     "--save-weights", "w.npz", "--tensorboard", full / "tb", cwd=tmp_path)
        assert run.returncode == 0 and ERROR_MARK not in run.output and "Traceback" not in run.output, run.describe()
        warnings = [line for line in run.output.splitlines() if WARNING_MARK in line]
        assert len(warnings) == 1 and "No space left on device" in warnings[0], run.describe()
        assert os.path.exists(tmp_path / "w.npz")


def test_two_runs_into_one_folder_in_the_same_second_keep_both_event_files(tmp_path):
    """The event file's name carries the writer's pid, not only the second and the host: a sweep
    that starts two runs at once into one folder must not truncate one's events."""
    from zerompi.train.outputs.tensorboard import TensorBoardLog
    logs = [TensorBoardLog(str(tmp_path / "tb")) for _ in range(2)]
    for log in logs:
        log.close()
    (first, second) = sorted(os.listdir(tmp_path / "tb"))
    assert first != second


@pytest.mark.parametrize("make", [lambda path: path.write_text("notes"), lambda path: os.mkfifo(path)],
                         ids=["a-file", "a-fifo"])
def test_a_tensorboard_path_that_is_not_a_folder_is_one_line(tmp_path, make):
    make(tmp_path / "tb")
    run = launch(1, "--steps", 2, "--hidden", 8, "--tensorboard", "tb", cwd=tmp_path)
    assert run.returncode == 2 and run.stderr.count(ERROR_MARK) == 1, run.describe()
    assert "cannot write TensorBoard events to tb: it exists and is not a folder" in run.stderr, run.describe()

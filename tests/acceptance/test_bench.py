"""`effectflow bench`: the peer-comparison workloads on a temporary ledger, as a user runs them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from effectflow import bench, scorecard
from effectflow.cli import main as cli_main
from effectflow.contracts import registry

EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"


def test_bench_json_reports_the_three_workloads_under_each_mode() -> None:
    """bench --json --mode all: the peer workloads and the asyncio ones under full, intents and
    normal, each with its steps, a positive rate, its ledger options and what the mode survives."""
    done = subprocess.run(
        [EFFECTFLOW, "bench", "--workflows", "2", "--mode", "all", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    workloads = (*bench.WORKLOADS, *bench.ASYNC_WORKLOADS)
    assert [(r["workload"], r["mode"]) for r in rows] == [
        (workload, mode) for mode in ("full", "intents", "normal") for workload in workloads
    ]
    for row in rows:
        assert (row["workflows"], row["steps"]) == (2, 2 * bench.STEPS)
        assert row["steps_per_s"] > 0
        assert row["runtime_s"] > 0
        assert isinstance(row["overhead_us_per_step"], float)
        if row["workload"].startswith("write"):
            # The floor: a raw commit measured in this run, two of them per write step.
            assert row["floor_commit_us"] > 0
            assert row["floor_steps_per_s"] == pytest.approx(1e6 / (2 * row["floor_commit_us"]))
            assert row["of_floor"] == pytest.approx(row["steps_per_s"] / row["floor_steps_per_s"])
        else:
            assert (row["floor_commit_us"], row["floor_steps_per_s"], row["of_floor"]) == (
                None,
                None,
                None,
            )
    assert len({r["floor_commit_us"] for r in rows if r["floor_commit_us"] is not None}) == 1
    assert {r["mode"]: (r["ledger_options"], r["durability"]) for r in rows} == {
        "full": ("synchronous=full", "every commit survives power loss"),
        "intents": (
            "durability=intents",
            "intents survive power loss; outcomes a process crash, power loss from the next flush",
        ),
        "normal": ("synchronous=normal", "every commit survives a process crash, not power loss"),
    }


def test_bench_table_defaults_to_full_and_points_at_the_comparison() -> None:
    """Without --mode the table has the three workloads under the default ledger only, and names
    the repository script for the side-by-side and BENCHMARKS.md for the published figures."""
    result = CliRunner().invoke(cli_main.app, ["bench", "--workflows", "1"])
    assert result.exit_code == 0, result.output
    for workload in (*bench.WORKLOADS, *bench.ASYNC_WORKLOADS):
        assert workload in result.stdout
    assert "every commit survives power loss" in result.stdout
    assert "intents" not in result.stdout
    assert "synchronous=normal" not in result.stdout
    assert "benchmarks/compare/run.py" in result.stdout
    assert "BENCHMARKS.md" in result.stdout
    floor = re.search(r"synchronous=FULL took ([\d,]+) µs in this run", result.stdout)
    assert floor is not None, result.stdout
    assert int(floor.group(1).replace(",", "")) > 0
    assert re.search(r"write \(full\): [\d,]+ steps/s, \d\.\d\d of the floor", result.stdout)
    assert re.search(r"write_async \(full\): [\d,]+ steps/s, \d\.\d\d of the floor", result.stdout)


def test_the_raw_commit_floor_is_timed_on_its_own_file_and_removed(tmp_path: Path) -> None:
    """The floor's commits land in a file of their own in the folder, gone afterwards; a count
    below 1 is refused."""
    assert bench.raw_commit_us(tmp_path, 20) > 0
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="at least 1"):
        bench.raw_commit_us(tmp_path, 0)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--workflows", "0"], "--workflows"),
        (["--workflows", "many"], "--workflows"),
        (["--mode", "fast"], "--mode"),
        (["--synchronous", "full"], "--synchronous"),
    ],
)
def test_bench_rejects_bad_input_as_a_usage_error(args: list[str], option: str) -> None:
    """A workflow count below 1 or an unknown durability mode exits 2, naming the option."""
    result = CliRunner().invoke(cli_main.app, ["bench", *args])
    assert result.exit_code == 2, result.output
    assert option in result.stderr


def test_bench_workloads_stay_out_of_the_default_registry(tmp_path: Path) -> None:
    """The bench's tools and workflows live in the runtime's private registry, where the write
    tool's lookup resolves, never in the process-wide one an application uses."""
    provider = bench.Provider(tmp_path / "provider.txt")
    workloads = bench.Workloads(f"sqlite:///{tmp_path / 'bench.db'}", provider)
    try:
        workloads.run("write", 1, "t")
        lookup = workloads.rt.registry.tool("effectflow_bench_find_line")
        assert lookup.fn(idempotency_key="nope").status == "not_committed"
    finally:
        workloads.close()
        provider.close()
    assert len((tmp_path / "provider.txt").read_text().splitlines()) == bench.STEPS
    assert not [t for t in registry.DEFAULT.tools() if t.name.startswith("effectflow_bench")]


#: A host of the crash harness's command line, stdlib only so the test stays fast: its tool's one
#: write is a line in DIR/world.jsonl; alone, the kill comes right after it and its recovery runs
#: the turn again when its checkpoint does not show it done; "with effectflow" it writes once and
#: its recovery (which asks a person when told to) writes nothing.
FAKE_HOST = """
import json, os, signal, sys
from pathlib import Path

mode, directory = sys.argv[1], Path(sys.argv[2])
bare = "--bare" in sys.argv
point = os.environ.get("EFFECTFLOW_CRASH_POINT")
done = directory / "checkpoint"
if mode == "start" or (bare and not done.exists()):
    with (directory / "world.jsonl").open("a") as fh:
        fh.write(json.dumps({"key": "k"}) + "\\n")
    if point and (not bare or point == "after_effect"):
        os.kill(os.getpid(), signal.SIGKILL)
    done.write_text("done")
print(json.dumps({"status": "done", "needs_person": not bare and ASKS}))
"""


def _fake_hosts(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "fakehost.py").write_text("ASKS = False\n" + FAKE_HOST, encoding="utf-8")
    (folder / "asking.py").write_text("ASKS = True\n" + FAKE_HOST, encoding="utf-8")
    (folder / "_helpers.py").write_text("raise SystemExit('not a host')\n", encoding="utf-8")
    return folder


def test_bench_hosts_scores_each_host_script_alone_and_with_effectflow(tmp_path: Path) -> None:
    """bench --hosts --json runs every host script of the folder (not _private ones) as real
    processes: alone, killed after the effect, the world shows two writes; the other side one
    write at each point, or a person asked; killed counts the trials that really died."""
    hosts = _fake_hosts(tmp_path / "hosts")
    done = subprocess.run(
        [EFFECTFLOW, "bench", "--hosts", "--hosts-dir", str(hosts), "--trials", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    scores = {s["host"]: s for s in json.loads(done.stdout)}
    assert sorted(scores) == ["asking", "fakehost"]
    fake = scores["fakehost"]
    assert (fake["trials"], fake["point"], fake["error"]) == (2, "after_effect", None)
    assert fake["alone"]["writes"] == [2, 2]
    assert fake["alone"]["verdicts"] == ["duplicate", "duplicate"]
    assert fake["alone"]["killed"] == 2
    assert list(fake["effectflow"]) == [
        "after_effect",
        "before_intent",
        "after_intent",
        "after_outcome",
    ]
    for point in fake["effectflow"].values():
        assert (point["writes"], point["verdicts"], point["killed"]) == ([1, 1], ["once"] * 2, 2)
    asking = scores["asking"]["effectflow"]["after_effect"]
    assert asking["verdicts"] == ["person asked"] * 2
    assert "fakehost: alone at after_effect" in done.stderr


def test_bench_hosts_prints_the_side_by_side_table(tmp_path: Path) -> None:
    """Without --json: per host, the writes per trial of the host alone and with effectflow at
    after_effect, then effectflow at the other three points, with the verdicts counted."""
    hosts = _fake_hosts(tmp_path / "hosts")
    result = CliRunner().invoke(
        cli_main.app,
        ["bench", "--hosts", "--hosts-dir", str(hosts), "--only", "fakehost", "--trials", "1"],
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("fakehost (")
    assert "SIGKILL at after_effect" in lines[0]
    rows = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", ln.strip()) for ln in lines[1:])}
    assert rows["host alone"] == ["2", "1/1", "duplicate x1"]
    assert rows["host + effectflow"] == ["1", "1/1", "once x1"]
    for point in ("before_intent", "after_intent", "after_outcome"):
        assert rows[point] == ["1", "1/1", "once x1"]
    assert "asking" not in result.stdout
    assert "fewer than 5 trials: a smoke run" in result.stdout


@pytest.mark.parametrize(
    ("args", "option", "message"),
    [
        (["--hosts-dir", "{tmp}/nowhere"], "--hosts-dir", "does not exist or is not a folder"),
        (["--hosts-dir", "{tmp}/empty"], "--hosts-dir", "no host scripts"),
        (["--hosts-dir", "{tmp}/hosts", "--only", "nosuch"], "--only", "no host nosuch"),
    ],
)
def test_bench_hosts_rejects_a_bad_hosts_folder_as_a_usage_error(
    tmp_path: Path, args: list[str], option: str, message: str
) -> None:
    """A hosts folder that is missing or holds no script, or a host that is not in it, exits 2
    naming the option and what is wrong, before anything runs."""
    (tmp_path / "empty").mkdir()
    _fake_hosts(tmp_path / "hosts")
    argv = ["bench", "--hosts", *(a.format(tmp=tmp_path) for a in args)]
    result = CliRunner().invoke(cli_main.app, argv)
    assert result.exit_code == 2, result.output
    assert option in result.stderr
    # rich draws the message in a box, wrapped: compare the words only.
    assert message in " ".join(re.sub("[│╭╮╰╯─]", " ", result.stderr).split())


def test_bench_hosts_finds_the_checkout_s_hosts_folder(tmp_path: Path) -> None:
    """Without --hosts-dir the folder is found above the working directory, or beside the
    package; a tree that has neither is an error saying where it looked."""
    checkout = tmp_path / "checkout"
    hosts = _fake_hosts(checkout / "benchmarks" / "compare" / "hosts")
    (checkout / "src" / "deep").mkdir(parents=True)
    assert scorecard.find_hosts_dir(checkout / "src" / "deep") == hosts
    repo = Path(bench.__file__).resolve().parents[2]
    if (repo / scorecard.HOSTS_SUBDIR).is_dir():  # an editable install: the package's own checkout
        assert scorecard.find_hosts_dir(tmp_path) == repo / scorecard.HOSTS_SUBDIR
    else:
        with pytest.raises(scorecard.ScorecardError, match="ship with the effectflow repository"):
            scorecard.find_hosts_dir(tmp_path)

"""`effectflow recover`, driven as an operator drives it, after a real worker process was SIGKILLed in
the middle of a call (``tests.workers.app``'s gated send): a line per run, the exit codes, --json."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.workers import app as workers_app
from tests.workers.test_interrupted import cli, kill_mid_call
from tests.workers.test_worker import counts, ledger_url

import effectflow as ef

APP = ("--app", "tests.workers.app")


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EFFECTFLOW_TEST_DIR", str(tmp_path))
    monkeypatch.delenv("EFFECTFLOW_PROVIDERS_URL", raising=False)
    workers_app.providers.cache_clear()
    return tmp_path


def test_recover_prints_a_line_per_run_and_exits_0_once_settled(world: Path) -> None:
    """recover continues the SIGKILLed worker's run now (no lease to wait for), prints a line for
    it, and a second pass finds nothing; the provider holds one email."""
    url = ledger_url(world)
    kill_mid_call(world, url, "z3")
    (world / "gate").unlink()
    before = cli(world, "runs", "--db", url).stdout
    assert "interrupted" in before

    done = cli(world, "recover", *APP, "--db", url).stdout
    assert "recovering the interrupted runs of tenant default" in done
    assert "run z3: succeeded" in done
    assert "recovered 1 run(s)" in done
    again = cli(world, "recover", *APP, "--db", url).stdout
    assert "no run to recover" in again
    with ef.Runtime(url) as rt:
        assert rt.run("z3").status is ef.RunStatus.SUCCEEDED
    assert counts(world)[0] == 1


def test_recover_without_the_app_says_to_pass_it_and_exits_1(world: Path) -> None:
    """Without --app the workflow is not registered: exit 1 naming --app, and the run stays as it
    was (interrupted, for a recover that can run it)."""
    url = ledger_url(world)
    kill_mid_call(world, url, "z4")
    failed = cli(world, "recover", "--db", url, code=1)
    assert "--app" in failed.stderr
    with ef.Runtime(url) as rt:
        assert rt.run_view(rt.run("z4")).interrupted

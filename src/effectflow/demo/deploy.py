"""``effectflow demo --scenario deploy``: a deploy that refuses to overwrite someone else's.

The application (tools and the ``deploy_release`` workflow) is written the way a user writes one;
``run`` is the scenario script. The story:

1. Our workflow observes target ``web`` at revision 1.
2. Right then another team's pipeline deploys a hotfix blindly: the target moves to revision 2.
   (The demo arms this with a flag file that the first observation consumes, so it happens
   exactly once, at exactly that moment.)
3. Our deploy carries its precondition, ``ef.Expect(revision=1)``; the provider answers 412 and
   writes nothing. The step is recorded ``conflict``, with its own effect.
4. The runtime bumps the observe step to revision 2 and re-runs the workflow: the observation
   now sees revision 2, and the deploy runs as a new step revision, with a new key and effect,
   on top of the hotfix. The provider's history: the other team's revision, then ours; no
   revision was overwritten.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import effectflow as ef
from effectflow import testing
from effectflow.demo import _show

RUN_ID = "deploy-web-42"
INPUT = {"target": "web", "image": "registry.example.com/web:2.0.0"}
#: What the target runs before the demo, and what the other team deploys in between.
SEEDED_IMAGE = "registry.example.com/web:1.9.0"
HOTFIX_IMAGE = "registry.example.com/web:1.9.1-hotfix"


@dataclasses.dataclass
class World:
    """The outside world of the deploy demo: one deployment API, and another team's pipeline."""

    target: testing.DeployTarget
    #: While this file exists, the other team's pipeline deploys right after our next observe.
    other_writer: Path

    def arm_other_writer(self, image: str) -> None:
        """Schedule the other team's deploy for the moment after our next observation."""
        self.other_writer.write_text(json.dumps({"image": image}))

    def close(self) -> None:
        """Close the provider file."""
        self.target.close()


_world: World | None = None


def use_world(folder: str | Path) -> World:
    """Point the tools at a deployment API whose file lives in ``folder``."""
    global _world
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _world = World(
        target=testing.DeployTarget(folder / "deploy.db"), other_writer=folder / "other-writer.json"
    )
    return _world


def world() -> World:
    """The world in use."""
    if _world is None:
        raise RuntimeError("call use_world(folder) before running the deploy")
    return _world


def _other_team_pipeline(target: str) -> None:
    """Simulation, not application: the other team deploys once, if the demo armed it."""
    w = world()
    try:
        order = json.loads(w.other_writer.read_text())
        w.other_writer.unlink()
    except FileNotFoundError:
        return
    w.target.concurrent_deploy(target, order["image"])


# -- tools ------------------------------------------------------------------------------------------


@ef.tool("observe_deployment", effect="read")
def observe_deployment(target: str) -> dict[str, Any]:
    """Read what the target runs now, and its revision (what our deploy will be based on)."""
    seen = world().target.observe(target)
    _other_team_pipeline(target)  # the world moves on right after we looked
    return seen


@ef.tool("get_deployment", effect="read")
def get_deployment(*, idempotency_key: str | None = None) -> ef.Lookup:
    """Ask the deployment API whether our deploy (by our key) was applied."""
    found = (
        world().target.get_deployment_by_idempotency_key(idempotency_key)
        if idempotency_key
        else None
    )
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(external_effect_id=found["deployment_id"], result=found)


@ef.tool(
    "deploy",
    version=2,
    effect="external_write",
    idempotency=ef.Idempotency(supported=True, retention="PT24H"),
    confirm=get_deployment,
    effect_id="deployment_id",
    external_system="deploy-api",
    target="target",
)
def deploy(
    target: str, image: str, *, precondition: ef.Expect, idempotency_key: str = ""
) -> dict[str, Any]:
    """Deploy ``image`` only if the target is still at the revision we observed."""
    expected = None if precondition.revision is None else int(precondition.revision)
    try:
        return world().target.deploy(
            target,
            image,
            expected_revision=expected,
            if_match=precondition.etag,
            idempotency_key=idempotency_key,
        )
    except testing.RevisionConflict as exc:
        raise ef.Conflict(
            str(exc), evidence={"expected": exc.expected, "current": exc.current}
        ) from exc
    except testing.ProviderUnavailable as exc:
        raise ef.NotCommitted(str(exc), evidence={"code": exc.code}) from exc
    except testing.IdempotencyKeyReused as exc:
        raise ef.IdempotencyConflict(str(exc)) from exc
    except testing.ProviderError as exc:
        raise ef.Rejected(str(exc), evidence={"code": exc.code, "status": exc.status}) from exc


# -- the workflow -----------------------------------------------------------------------------------


@ef.workflow("deploy_release")
def deploy_release(ctx: ef.Context, target: str, image: str) -> dict[str, Any]:
    """Observe the target, then deploy on exactly what was observed (re-observing on conflict)."""
    seen = ctx.call("observe", observe_deployment, target=target)
    done = ctx.call(
        "deploy",
        deploy,
        target=target,
        image=image,
        precondition=ef.Expect(revision=seen["revision"]),
        observe="observe",
    )
    return {
        "deployment_id": done["deployment_id"],
        "revision": done["revision"],
        "based_on": seen["revision"],
    }


# -- the scenario -----------------------------------------------------------------------------------


def run(folder: Path | None = None, console: Console | None = None) -> int:
    """Play the scenario in ``folder`` (a temporary one by default).

    Returns 0 when the ledger and the provider tell the expected story, 1 when they do not, and
    2 when ``folder`` already holds a ledger.
    """
    return _show.play("deploy", folder, console, _run)


def _run(folder: Path, console: Console, started: float) -> int:
    url = f"sqlite:///{folder / 'effects.db'}"
    console.rule("[bold]effectflow demo: deploy with a precondition")
    console.print(f"ledger  {url}\nworld   {folder}/deploy.db\n")
    w = use_world(folder)
    target = INPUT["target"]
    w.target.seed(target, SEEDED_IMAGE, revision=1)
    w.arm_other_writer(HOTFIX_IMAGE)
    console.print(
        f"[dim]set-up:[/] {target} runs {SEEDED_IMAGE} at revision 1. Another team's pipeline "
        f"will deploy {HOTFIX_IMAGE} blindly right after our first observation."
    )
    try:
        with ef.Runtime(url) as rt:
            return _play(console, rt, w, started)
    finally:
        w.close()


def _play(console: Console, rt: ef.Runtime, w: World, started: float) -> int:
    target = INPUT["target"]
    run = rt.start(deploy_release, run_id=RUN_ID, **INPUT)
    output = run.output or {}
    first = rt.attempts(RUN_ID, "deploy")[0]
    refusal = escape(str((first.error or {}).get("message")))
    observe = next(s for s in rt.steps(RUN_ID) if s.step_id == "observe")
    console.print(
        f"\nrun {RUN_ID} {_show.status(run.status)}. The first deploy was refused: "
        f'"{refusal}" ({first.outcome}, nothing written). The runtime re-ran the observe step '
        f"(now at step revision {observe.step_revision}) and deployed on revision "
        f"{output.get('based_on')}, creating revision {output.get('revision')}.\n"
    )
    _show.steps(
        console,
        rt,
        RUN_ID,
        title=f"run {RUN_ID}: {run.status}",
        columns=("step", "rev", "tool", "effect", "status", "attempts", "external id"),
    )
    _show.effects(
        console,
        rt,
        RUN_ID,
        title="external effect records (one per step revision of the deploy)",
        columns=("effect", "step", "tool", "status", "external id", "logical operation"),
    )
    _show.timeline(console, rt, RUN_ID)

    history = w.target.history(target)
    table = Table(title=f"the deployment API's own history of {target}", title_justify="left")
    for column in ("deployment", "revision", "based on", "expected", "image", "writer"):
        table.add_column(column)
    for entry in history:
        expected = entry["expected_revision"]
        table.add_row(
            entry["deployment_id"],
            str(entry["revision"]),
            str(entry["based_on"]),
            "blind" if expected is None else str(expected),
            entry["image"],
            entry["writer"],
        )
    console.print(table)
    overwrites = w.target.overwrites(target)
    effects = rt.effects(run_id=RUN_ID)
    checks = [
        (
            [e["writer"] for e in history] == ["other", "us"],
            "the history holds the other team's deploy, then ours",
        ),
        (
            len(history) == 2 and history[1]["based_on"] == history[0]["revision"],
            "our revision is based on the other team's revision: theirs is preserved",
        ),
        (overwrites == 0, f"overwrites: {overwrites}"),
        (
            sorted(e.status.value for e in effects) == ["confirmed", "conflict"],
            "the ledger holds one conflict effect (nothing written) and one confirmed effect",
        ),
        (observe.step_revision == 2, f"the observe step is at revision {observe.step_revision}"),
        (run.status is ef.RunStatus.SUCCEEDED, f"run {run.status}"),
    ]
    ok = _show.checks(console, checks)
    ok = _show.audit_chain(console, rt) and ok
    console.print(f"\n[dim]demo took {time.perf_counter() - started:.2f} s[/]")
    return 0 if ok else 1

"""The benchmark's turn order: systems take turns within each step (bench/harness)."""

from __future__ import annotations

from bench.harness.scenarios import Step, schedule


def _steps(*names: str) -> list[Step]:
    return [Step("enqueue", name, {}) for name in names]


def test_systems_take_turns_run_by_run_and_the_first_rotates() -> None:
    plans = {"delayq": _steps("single", "lateness"), "bullmq": _steps("single", "lateness")}
    turns = [(system, step.name, run) for system, step, run in schedule(plans, 3)]
    assert turns == [
        ("delayq", "single", 0), ("bullmq", "single", 0),
        ("bullmq", "single", 1), ("delayq", "single", 1),
        ("delayq", "single", 2), ("bullmq", "single", 2),
        ("delayq", "lateness", 0), ("bullmq", "lateness", 0),
        ("bullmq", "lateness", 1), ("delayq", "lateness", 1),
        ("delayq", "lateness", 2), ("bullmq", "lateness", 2),
    ]  # fmt: skip


def test_steps_one_system_lacks_keep_every_system_s_own_order() -> None:
    plans = {
        "delayq": _steps("single", "unary", "one", "batched", "lateness"),
        "bullmq": _steps("single", "one", "batched", "lateness"),
        "arq": _steps("single", "one", "lateness"),
    }
    turns = schedule(plans, 1)
    names = [step.name for _, step, _ in turns]
    assert names == ["single"] * 3 + ["unary"] + ["one"] * 3 + ["batched"] * 2 + ["lateness"] * 3
    for system, steps in plans.items():  # every step of every system, in its own order
        assert [s for sys_, s, _ in turns if sys_ == system] == steps

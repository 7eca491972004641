"""What the dashboard announces: a notification when a run seen training ends (finished,
stopped, crashed with the reason, diverged with the step), or when a study ends. A study's
runs are announced once, by the study's end (a toast per run would cover the table that
shows them), unless one crashes or diverges. Plain: no Textual, tested on its own."""

from __future__ import annotations

from dataclasses import dataclass

from ..core.session.reader import ENDED, Snapshot

SEVERITY = {"finished": "information", "stopped": "information", "copied": "information",
            "crashed": "error", "diverged": "warning"}


@dataclass(frozen=True)
class Announcement:
    text: str
    severity: str = "information"
    timeout: float = 5


class Announcer:
    """Remembers each run's and study's status from the last snapshot it saw. What the first
    snapshot holds is the session as found (nothing is announced); a run or a study that
    appears later was made since, and counts as seen starting: one that started and ended
    between two looks (a short run that diverged at once) is announced too."""

    def __init__(self) -> None:
        self._runs: dict[int, str] = {}
        self._studies: dict[int, str] = {}
        self._looked = False

    def news(self, snap: Snapshot) -> list[Announcement]:
        said: list[Announcement] = []
        new = "created" if self._looked else None
        self._looked = True
        in_study = {v["run_id"] for st in snap.studies for v in st.get("variants", ())
                    if v.get("run_id") is not None}
        for st in snap.studies:
            before, now = self._studies.get(st["id"], new and "running"), st["status"]
            self._studies[st["id"]] = now
            if before == "running" and now != "running":
                what = "seed sweep" if st["kind"] == "sweep" else "A/B study"
                said.append(Announcement(
                    f"{what} {st['id']} ({st['name']}) {now}: its table is in the A/B tab",
                    "error" if now == "crashed" else "information"))
        for run in snap.runs:
            before, now = self._runs.get(run.id, new), run.status
            self._runs[run.id] = now
            if run.id in in_study and now in ("finished", "stopped"):
                continue
            if before in ("created", "running") and now in ENDED:
                said.append(Announcement(
                    f"run {run.id} ({run.name}) {now} at step {run.step}"
                    + (f": {run.reason}" if run.reason else ""), SEVERITY[now],
                    12 if now in ("crashed", "diverged") else 5))
        return said

"""What a live run page fetches when its run grows: only what is new since its data.

The page says what it holds (how many records, commits, tracebacks; the first attempt and
wait still open, every one before them being final; the next event id; the seq of its last
record) and gets a patch: the records and commits after those, the attempts and waits from
the first open one on, the tracebacks and events it lacks, and the small per-run parts
whole (steps, kinds, lanes, the run's status, the upcast contexts). Records are appended,
never changed, and each of the page's lists grows at its end, so the patch appended to the
page's data is the run's data now. A page whose data does not match (another run's, or a
log that changed under it) gets the whole data instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["HELD", "patch_since"]

# The query parameters a page sends to say what it holds.
HELD: Final = ("nrec", "ncommits", "attempts_from", "waits_from", "ntb", "next_event", "seq")


def patch_since(data: Mapping[str, Any], held: Mapping[str, int]) -> dict[str, Any]:
    """The part of a run's timeline ``data`` a page holding ``held`` lacks (``{"patch":
    True, ...}``), or ``{"patch": False, "data": data}`` when the page's data is not a
    prefix of it."""
    rec = data["rec"]
    nrec, ncommits = held["nrec"], held["ncommits"]
    na, nw, ntb = held["attempts_from"], held["waits_from"], held["ntb"]
    seqs = rec["seq"]
    fits = (
        0 <= nrec <= len(seqs)
        and (nrec == 0 or seqs[nrec - 1] == held["seq"])
        and 0 <= ncommits <= len(data["commits"]["seq"])
        and 0 <= na <= len(data["attempts"])
        and 0 <= nw <= len(data["waits"])
        and 0 <= ntb <= len(data["tb"])
    )
    if not fits:
        return {"patch": False, "data": data}
    attempts, waits = data["attempts"], data["waits"]
    wanted = {a[1] for a in attempts[na:]} | {w[1] for w in waits[nw:]}
    events = {
        k: v for k, v in data["events"].items() if int(k) >= held["next_event"] or int(k) in wanted
    }
    return {
        "patch": True,
        "nrec": nrec,
        "rec": {col: values[nrec:] for col, values in rec.items()},
        "commits": {k: v[ncommits:] for k, v in data["commits"].items()},
        "attempts_from": na,
        "attempts": attempts[na:],
        "rows": [a[7] for a in attempts[:na]],  # a new worker may move an older bar's row
        "waits_from": nw,
        "waits": waits[nw:],
        "wait_rows": [w[5] for w in waits[:nw]],
        "tb_from": ntb,
        "tb": data["tb"][ntb:],
        "events": events,
        **{
            k: data[k]
            for k in ("run", "steps", "kinds", "lanes", "lane_workers", "window")
            if k in data
        },
        "uctx": data.get("uctx"),  # the upcast contexts (``_upcast``): small, sent whole
    }


def held_params(query: Mapping[str, str]) -> dict[str, int] | None:
    """What the page holds, from its query; None when it asked for the whole data.

    :raises ValueError: a parameter that is not a whole number.
    """
    if "nrec" not in query:
        return None
    held = {}
    for name in HELD:
        text = query.get(name, "0")
        try:
            held[name] = int(text)
        except ValueError:
            msg = f"{name} must be a whole number, not {text!r}"
            raise ValueError(msg) from None
    return held

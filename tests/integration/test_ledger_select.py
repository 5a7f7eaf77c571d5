"""What a listing reads, on both backends: every filter and sort of ``Selection`` done
in SQL with the same answer, ``--match`` text taken as text (never a pattern), one
meaning for a negative limit, and the aggregate figures ``settled stats`` shows."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from invariants import dump
from ledger_rows import add

from settled import Ledger
from settled.clock import plus, to_text, utcnow
from settled.model import EventKind, Status
from settled.storage import Move, Selection
from settled.storage.query import SORT_FIELDS, STATUS_ORDER, reason_group

NOW = utcnow()


def ids(ledger: Ledger, **sel: Any) -> list[str]:
    return [r.action_id for r in ledger.records(Selection(**sel))]


def schedule(ledger: Ledger, aid: str, **values: Any) -> None:
    """Set stored fields of a DENIED_UNRESOLVED record (a schedule move: no event)."""
    rec = ledger.get(aid)
    assert ledger.move(Move(aid, rec.status, rec.status, to_text(NOW), "t", None, values=values))


def note(ledger: Ledger, aid: str, detail: str) -> None:
    """A NOTE event whose detail is the provider's words."""
    rec = ledger.get(aid)
    assert ledger.move(
        Move(
            aid,
            rec.status,
            rec.status,
            to_text(NOW),
            "t",
            EventKind.NOTE,
            detail={"detail": detail, "reason": "late reply"},
        )
    )


@pytest.fixture
def mixed(ledger: Ledger) -> Ledger:
    """Five records created a minute apart (e oldest, a youngest), on two providers,
    with different statuses, deliveries, checks and check times."""
    for i, (aid, provider, status) in enumerate(
        [
            ("e", "sim", Status.DENIED_UNRESOLVED),
            ("d", "mail", Status.DENIED_UNRESOLVED),
            ("c", "sim", Status.AWAITING_VERIFICATION),
            ("b", "mail", Status.IN_FLIGHT),
            ("a", "Zeta", Status.DENIED_UNRESOLVED),
        ]
    ):
        add(
            ledger,
            aid,
            provider=provider,
            operation="send",
            age=300 - 60 * i,
            status=status,
            reason=f"reason of {aid}",
            now=NOW,
        )
    schedule(ledger, "e", checks=3, next_check_at=to_text(plus(NOW, 30)), delivery="DELIVERED")
    schedule(ledger, "d", checks=1, next_check_at=to_text(plus(NOW, 10)))
    schedule(ledger, "a", checks=7, delivery="FAILED")
    return ledger


def test_filters_by_creation_window_delivery_and_ids(mixed: Ledger) -> None:
    after = to_text(plus(NOW, -150))
    assert ids(mixed, created_after=after) == ["b", "a"]
    before = to_text(plus(NOW, -150))
    assert ids(mixed, created_before=before) == ["e", "d", "c"]
    assert ids(mixed, delivery=["DELIVERED"]) == ["e"]
    assert ids(mixed, delivery=["FAILED", "UNKNOWN"]) == ["d", "c", "a"]
    assert ids(mixed, delivery=["UNKNOWN"], statuses=["DENIED_UNRESOLVED"]) == ["d"]
    assert ids(mixed, ids=["a", "e", "zz"]) == ["e", "a"]
    assert mixed.count(Selection(delivery=["FAILED"], created_after=after)) == 1


def reference(ledger: Ledger, field: str, reverse: bool) -> list[str]:
    """The documented order, computed in Python from the records themselves."""
    rank = {str(s): i for i, s in enumerate(STATUS_ORDER)}
    recs = ledger.records()

    def key(r: Any) -> tuple[Any, ...]:
        tie = (r.created_at, r.action_id)
        if field in ("created_at", "age"):
            return tie
        if field == "action_id":
            return (r.action_id,)
        if field == "status":
            return (rank[str(r.status)], *tie)
        if field == "triage":  # contradicted, a person's verdict, a held one, the checks'
            first = ["DENIED_UNRESOLVED", "PENDING", "AWAITING_VERIFICATION", "IN_FLIGHT"]
            at = -1 if r.contradiction else first.index(str(r.status))
            return (at, *tie)
        value = getattr(r, field)
        if field.endswith("_at"):
            return (value is None, value or "", *tie)
        return (str(value) if isinstance(value, str) else value, *tie)

    flip = reverse != (field == "age")
    return [r.action_id for r in sorted(recs, key=key, reverse=flip)]


@pytest.mark.parametrize("field", SORT_FIELDS)
def test_each_sort_field_orders_as_documented_on_both_backends(mixed: Ledger, field: str) -> None:
    for reverse in (False, True):
        assert ids(mixed, sort=field, reverse=reverse) == reference(mixed, field, reverse)


def test_sort_orders_read_by_a_person(mixed: Ledger) -> None:
    assert ids(mixed) == ["e", "d", "c", "b", "a"]  # oldest first
    assert ids(mixed, sort="age") == ["a", "b", "c", "d", "e"]  # youngest first
    assert ids(mixed, sort="provider") == ["a", "d", "b", "e", "c"]  # "Zeta" < "mail" by code point
    assert ids(mixed, sort="status") == ["b", "c", "e", "d", "a"]  # IN_FLIGHT, AWAITING, DENIED
    assert ids(mixed, sort="checks", reverse=True) == ["a", "e", "d", "b", "c"]
    assert ids(mixed, sort="next_check_at") == ["d", "e", "c", "b", "a"]  # a time, then none
    assert ids(mixed, sort="next_check_at", reverse=True) == ["a", "b", "c", "e", "d"]
    assert ids(mixed, sort="triage") == ["e", "d", "a", "c", "b"]  # a person's first, oldest


def test_every_sort_field_is_accepted_and_nothing_else(mixed: Ledger) -> None:
    for field in SORT_FIELDS:
        assert sorted(ids(mixed, sort=field)) == ["a", "b", "c", "d", "e"]
    with pytest.raises(ValueError, match="cannot sort by 'params'"):
        Selection(sort="params")
    with pytest.raises(ValueError, match="cannot sort by"):
        Selection(sort="created_at; DROP TABLE actions")


def test_newest_first_is_reverse_of_the_default(mixed: Ledger) -> None:
    assert ids(mixed, newest_first=True) == ["a", "b", "c", "d", "e"]
    assert ids(mixed, newest_first=True, limit=2) == ["a", "b"]


def test_a_negative_limit_means_the_same_on_both_backends(mixed: Ledger) -> None:
    """It used to be "every row" on SQLite and "no row" on PostgreSQL: now refused
    everywhere, before any SQL runs. None is "all"; 0 is none."""
    for bad in (-1, -5):
        with pytest.raises(ValueError, match="limit must be a whole number >= 0"):
            Selection(limit=bad)
    assert ids(mixed, limit=0) == []
    assert len(ids(mixed, limit=None)) == 5
    assert ids(mixed, limit=2) == ["e", "d"]


def test_match_is_a_case_insensitive_substring_of_reason_contradiction_and_last_detail(
    mixed: Ledger,
) -> None:
    schedule(mixed, "e", reason="Budget spent: carrier said ÉCHEC 100% of_the time")
    schedule(mixed, "c", contradiction="a late reply says applied")
    note(mixed, "d", "upstream ConnectError: [Errno 111] Connection refused")
    assert ids(mixed, match="échec") == ["e"]  # folded beyond ASCII on both backends
    assert ids(mixed, match="BUDGET SPENT") == ["e"]
    assert ids(mixed, match="LATE reply") == ["c"]
    assert ids(mixed, match="connecterror") == ["d"]
    assert ids(mixed, match="reason of") == ["d", "c", "a"]  # e's changed; b (IN_FLIGHT) has none
    # Wildcards mean themselves: no LIKE pattern is ever built from the text.
    assert ids(mixed, match="100%") == ["e"]
    assert ids(mixed, match="%") == ["e"]
    assert ids(mixed, match="of_the") == ["e"]
    assert ids(mixed, match="of_") == ["e"]
    assert ids(mixed, match="reason_of") == []
    assert ids(mixed, match="r%n") == []
    assert ids(mixed, match="'; DROP TABLE actions; --") == []
    assert ids(mixed, match="\\") == []
    assert mixed.count(Selection(match="REASON OF", provider="mail")) == 1


def test_match_reads_the_last_event_only(mixed: Ledger) -> None:
    note(mixed, "e", "first words: HTTP 502")
    note(mixed, "e", "second words: HTTP 200")
    assert ids(mixed, match="HTTP 502") == []
    assert ids(mixed, match="HTTP 200") == ["e"]


# -- stats ----------------------------------------------------------------------------


def test_stats_counts_groups_reasons_and_ages_of_open_records(ledger: Ledger) -> None:
    for i, checks in enumerate((3, 5, 12)):
        add(
            ledger,
            f"spent-{i}",
            provider="sim",
            operation="send",
            age=100 * (i + 1),
            reason=f"verification budget spent after {checks} check(s); last: not_yet "
            f"(at 2026-01-0{i + 1}T10:00:0{i}.12345Z)",
        )
    add(
        ledger,
        "bad-1",
        provider="mail",
        operation="send",
        age=50,
        reason="outcome unknown (HTTP 503): id msg-81f2; reconciliation will query",
    )
    add(
        ledger,
        "bad-2",
        provider="mail",
        operation="send",
        age=40,
        reason="outcome unknown (HTTP 500): id msg-0a9c; reconciliation will query",
    )
    add(ledger, "done", provider="mail", operation="send", age=1000, status=Status.IN_FLIGHT)
    before = dump(ledger.location)
    now = to_text(utcnow())
    st = ledger.stats(Selection(), now=now, by="reason")
    assert dump(ledger.location) == before  # read-only
    assert st.total == 6 and st.checks_failing_now == 0
    spent = [c for c in st.cells if c.reason_group and c.reason_group.startswith("verification")]
    assert len(spent) == 1 and spent[0].count == 3
    assert spent[0].reason_group == (
        "verification budget spent after # check(s); last: not_yet (at <time>)"
    )
    assert spent[0].example_reason is not None and "check(s)" in spent[0].example_reason
    http = sorted(c.reason_group or "" for c in st.cells if c.provider == "mail" and c.reason_group)
    assert http == [
        "outcome unknown (HTTP 500): id #; reconciliation will query",
        "outcome unknown (HTTP 503): id #; reconciliation will query",
    ]
    # Six open records aged 40, 50, 100, 200, 300, 1000 s: nearest rank p50 = the 3rd, p95 = the 6th.
    assert st.ages.n == 6
    assert st.ages.p50 == pytest.approx(100, abs=5) and st.ages.p95 == pytest.approx(1000, abs=5)
    assert st.ages.oldest == pytest.approx(1000, abs=5)
    group = st.ages_by["verification budget spent after # check(s); last: not_yet (at <time>)"]
    assert group.n == 3 and group.p50 == pytest.approx(200, abs=5)
    assert st.ages_by[""].n == 1  # the IN_FLIGHT record has no reason


def test_stats_follow_the_selection_and_group_by_each_key(ledger: Ledger) -> None:
    add(ledger, "a", provider="sim", operation="send", age=10)
    add(ledger, "b", provider="sim", operation="book", age=20, status=Status.IN_FLIGHT)
    add(ledger, "c", provider="mail", operation="send", age=30)
    now = to_text(NOW)
    only_sim = ledger.stats(Selection(provider="sim"), now=now)
    assert only_sim.total == 2 and {c.provider for c in only_sim.cells} == {"sim"}
    assert only_sim.ages_by == {}
    assert set(ledger.stats(Selection(), now=now, by="provider").ages_by) == {"sim", "mail"}
    assert set(ledger.stats(Selection(), now=now, by="operation").ages_by) == {
        "sim/send",
        "sim/book",
        "mail/send",
    }
    assert set(ledger.stats(Selection(), now=now, by="status").ages_by) == {
        "DENIED_UNRESOLVED",
        "IN_FLIGHT",
    }
    empty = ledger.stats(Selection(statuses=["CONFIRMED"]), now=now)
    assert (empty.total, empty.cells, empty.ages.n, empty.ages.p50) == (0, [], 0, None)
    with pytest.raises(ValueError, match="cannot group by"):
        ledger.stats(Selection(), now=now, by="params")


# -- one normalisation on both backends --------------------------------------------------

CORPUS = [
    "verification budget spent after 3 check(s); last: not_yet (nothing visible yet)",
    "accepted (HTTP 202), not yet observed; verification at 2026-01-05T10:00:33.120511Z",
    'outcome unknown (HTTP 500): {"error": "internal error"}; reconciliation will query',
    "checked: unknown (ConnectError: [Errno 111] Connection refused)",
    "dispatch in progress; lease until 2026-01-05 10:00:33+00:00",
    "r-3f2a9c1b0d held it; HTTP 429 after 1.5s; id 12ab-34cd; IPv4 127.0.0.1:8080",
    "ÉCHEC à 10h30, code ٣ (Arabic-Indic digit), 2026-13-45T99:99",
    "HTTP 5031 HTTP503 xHTTP 404 HTTP  404 -5 _9 a-",
]


@pytest.mark.postgres_only
def test_postgresql_groups_reasons_exactly_as_python_does(ledger: Ledger) -> None:
    """SQLite runs ``query.reason_group`` itself; PostgreSQL runs the same patterns
    through regexp_replace. They must agree on every text, or a group would split
    between backends."""
    from settled.storage.postgres import _reason_group

    def pg_group(text: str) -> str:
        with ledger._tx("test") as cur:  # type: ignore[attr-defined]
            cur.execute(f"SELECT {_reason_group('%s::text')}", (text,))
            return str(cur.fetchone()[0])

    for text in CORPUS:
        assert pg_group(text) == reason_group(text), text

    words = [
        "HTTP ",
        "HTTP",
        " ",
        "-",
        "_",
        "0",
        "42",
        "2026-01-05T10:00:33",
        ".5Z",
        "+01:00",
        "a",
        "Z",
        "T",
        ":",
        "é",
        "(",
        "x1",
        "check(s)",
        "\t",
    ]
    pieces = st.sampled_from(words)
    texts = st.one_of(
        st.lists(pieces, max_size=12).map("".join),
        st.text(
            st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
        ),
    )

    @settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
    @given(texts)
    def agree(text: str) -> None:
        assert pg_group(text) == reason_group(text)

    agree()


def test_stats_counts_the_open_records_whose_last_check_failed(ledger: Ledger) -> None:
    """ "Checks failing now": open records whose last check could not be made (rule
    15's ``check_error``); a settled one with an old error is not failing now."""
    for aid in ("f-1", "f-2", "ok-1"):
        add(ledger, aid, provider="mail", operation="send", reason="checked")
    add(ledger, "f-old", provider="mail", operation="send", status=Status.FAILED)
    for aid in ("f-1", "f-2", "f-old"):
        schedule(ledger, aid, check_error="ConfigError: MAIL_TOKEN is not set")
    st = ledger.stats(Selection(), now=to_text(utcnow()))
    assert st.checks_failing_now == 2
    assert (
        ledger.stats(Selection(ids=["f-1", "ok-1"]), now=to_text(utcnow())).checks_failing_now == 1
    )

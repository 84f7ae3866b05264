"""The history checker tells loss, duplication and reordering apart."""

from __future__ import annotations

from gridstream.checker import check_history
from gridstream.examples import history


def folded(sequences: list[int]) -> list[int]:
    """A key's summary after folding these sequences in this order."""
    summary = list(history.EMPTY)
    for s in sequences:
        summary = history.fold(summary, ["k", s])
    return summary


def test_an_exact_run_passes() -> None:
    _, values = history.generate(5_000, keys=50, seed=1)
    verdict = check_history(history.reference(values), history.sent_counts(values))
    assert verdict.ok and verdict.exact == 50, verdict.summary()


def test_a_lost_record_is_named_as_loss() -> None:
    verdict = check_history({"k": folded([1, 2, 4, 5])}, {"k": 5})
    assert verdict.lost == {"k": 1} and not verdict.ok
    assert check_history({}, {"k": 5}).lost == {"k": 5}


def test_a_record_applied_twice_is_a_duplicate_even_after_a_later_one() -> None:
    # A replay applied again after the next record: 1 2 3 2 3 4.
    verdict = check_history({"k": folded([1, 2, 3, 2, 3, 4])}, {"k": 4})
    assert verdict.duplicated == {"k": 2} and not verdict.lost


def test_the_same_records_out_of_order_are_a_reorder() -> None:
    verdict = check_history({"k": folded([1, 3, 2, 4])}, {"k": 4})
    assert verdict.reordered == {"k": 1} and not verdict.lost and not verdict.duplicated


def test_a_loss_hidden_by_a_duplicate_is_not_taken_for_exact() -> None:
    # Same count as sent, but 3 lost and 2 applied twice.
    verdict = check_history({"k": folded([1, 2, 2, 4])}, {"k": 4})
    assert not verdict.ok and verdict.corrupt

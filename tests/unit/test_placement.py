"""Replica placement, write quorum and the read rule, from routing tables."""

from __future__ import annotations

from gridstream.placement import ReplicaSet, replicas_ahead
from gridstream.v1 import scheduler_pb2 as pb

ALIVE, DEAD, LEAVING = pb.MEMBER_STATE_ALIVE, pb.MEMBER_STATE_DEAD, pb.MEMBER_STATE_LEAVING


def table(states: dict[str, int], replicas: int = 2, quorum: int = 0) -> pb.RoutingTable:
    members = [pb.Member(node_id=n, role=pb.MEMBER_ROLE_STATE_SERVER, address=f"{n}:1",
                         state=s) for n, s in states.items()]  # type: ignore[arg-type]
    members.append(pb.Member(node_id="w", role=pb.MEMBER_ROLE_WORKER, address="w:1",
                             state=ALIVE))
    return pb.RoutingTable(epoch=1, members=members, state_replicas=replicas,
                           state_write_quorum=quorum)


OPS = [f"job/t{t}/p{p}" for t in range(3) for p in range(40)]


def test_placement_is_r_distinct_live_servers_and_the_same_everywhere() -> None:
    group = ReplicaSet.from_table(table({"a": ALIVE, "b": ALIVE, "c": ALIVE}))
    again = ReplicaSet.from_table(table({"c": ALIVE, "a": ALIVE, "b": ALIVE}))
    for op in OPS:
        placed = group.placement(op)
        assert len(placed) == 2 == len(set(placed))
        assert placed == again.placement(op)
    shares = {n: sum(n in group.placement(op) for op in OPS) for n in "abc"}
    assert min(shares.values()) > 0.4 * len(OPS)  # each holds about 2/3 of them


def test_a_dead_replica_is_replaced_by_the_next_on_the_ring() -> None:
    healthy = ReplicaSet.from_table(table({"a": ALIVE, "b": ALIVE, "c": ALIVE}))
    degraded = ReplicaSet.from_table(table({"a": ALIVE, "b": DEAD, "c": ALIVE}))
    for op in OPS:
        before, after = healthy.placement(op), degraded.placement(op)
        assert "b" not in after and len(after) == 2
        assert [n for n in before if n != "b"] == [n for n in after if n in before]


def test_quorum_is_a_majority_capped_by_the_servers_there_are() -> None:
    assert ReplicaSet.from_table(table({"a": ALIVE, "b": ALIVE})).quorum == 2
    assert ReplicaSet.from_table(table({"a": ALIVE}, replicas=2)).quorum == 1
    assert ReplicaSet.from_table(table(dict.fromkeys("abc", ALIVE), replicas=3)).quorum == 2
    assert ReplicaSet.from_table(table(dict.fromkeys("abc", ALIVE), quorum=1)).quorum == 1
    # A dead server still counts as a place copies live: W stays 2 of 2.
    assert ReplicaSet.from_table(table({"a": ALIVE, "b": DEAD})).quorum == 2


def test_retiring_servers_are_read_but_not_written() -> None:
    group = ReplicaSet.from_table(table({"a": ALIVE, "b": LEAVING, "c": ALIVE}))
    assert set(group.writable) == {"a", "c"} and set(group.readable) == {"a", "b", "c"}
    assert all("b" not in group.placement(op) for op in OPS)


def test_a_reader_must_hear_all_but_fewer_than_w() -> None:
    group = ReplicaSet.from_table(table({"a": ALIVE, "b": DEAD, "c": ALIVE}))
    assert group.quorum == 2 and group.members == 3
    assert group.enough_heard(2)  # one silent (the dead one): every write had 2 copies
    assert not group.enough_heard(1)  # two silent: an acknowledged write may be unseen


def test_replicas_ahead_of_the_ones_read() -> None:
    read = {"s1"}
    same = {"s1": {"op": (3, 7)}, "s2": {"op": (3, 7)}}
    assert replicas_ahead(read, same) == []
    # A newer result version, a newer state window, or an operator the read
    # server lacks: each makes the other server worth reading.
    assert replicas_ahead(read, {"s1": {"op": (3, 7)}, "s2": {"op": (4, 7)}}) == ["s2"]
    assert replicas_ahead(read, {"s1": {"op": (3, 7)}, "s2": {"op": (3, 8)}}) == ["s2"]
    assert replicas_ahead(read, {"s1": {"op": (3, 7)}, "s2": {"other": (0, -1)}}) == ["s2"]
    # Behind is not ahead; a server that did not answer cannot be judged.
    assert replicas_ahead(read, {"s1": {"op": (3, 7)}, "s2": {"op": (2, 6)}, "s3": None}) == []
    # Unknown holdings of the server read: every server that answered.
    assert replicas_ahead(read, {"s1": None, "s2": {"op": (0, -1)}, "s3": None}) == ["s2"]
    # Two servers read: the newest of the two counts.
    assert replicas_ahead({"s1", "s2"}, {"s1": {"op": (5, 1)}, "s2": {"op": (1, 9)},
                                         "s3": {"op": (5, 9)}}) == []

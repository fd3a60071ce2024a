"""The fault matrix's verdict logic (the matrix itself runs in CI: scripts/fault_matrix.py --quick)."""
from scripts.fault_matrix import Row, _account


def _req(room, status="Success", checksum=True, verified=True, reason=None):
    return dict(room=room, status=status, checksum=checksum, verified=verified, reason=reason, bytes=1)


def test_a_success_without_a_matching_checksum_or_verified_bytes_is_corrupt_kv_accepted():
    row = Row("x", "zmq", recovered=True)
    assert _account(row, {"requests": [_req(1), _req(2, checksum=None), _req(3, verified=False)]}, "b") == 3
    assert row.corrupt == 2 and not row.survived


def test_failures_are_counted_by_reason_and_a_failure_without_one_is_a_problem():
    row = Row("x", "zmq", recovered=True)
    _account(row, {"requests": [_req(7, "Failed", reason="Failed to send kv chunk of 7 to 1.2.3.4:5: x"),
                                _req(8, "Failed", reason="Failed to send kv chunk of 8 to 1.2.3.4:6: y"),
                                _req(9, "Failed", reason="")]}, "b")
    assert row.failed == 3 and row.reasons["Failed to send kv chunk of N to N"] == 2
    assert any("without a reason" in p for p in row.problems) and not row.survived


def test_no_answer_is_a_hang_and_leaks_or_no_recovery_fail_the_row():
    row = Row("x", "zmq", recovered=True)
    assert _account(row, None, "batch") == 0 and "hung" in row.problems[0]
    assert not Row("x", "zmq", recovered=True, leaked=1).survived
    assert not Row("x", "zmq", recovered=True, leaked=None).survived
    assert not Row("x", "zmq", recovered=False).survived
    assert Row("x", "zmq", recovered=True).survived


def test_an_l3_fault_counts_the_pages_it_really_lost_against_a_healthy_round():
    from scripts.fault_matrix import _account_l3_fault
    healthy = {"storage_hit_pages": 4, "storage_write_skipped_pages": 1, "storage_write_failed_pages": 0,
               "storage_read_short_pages": 0}
    during = {"storage_hit_pages": 4, "storage_write_skipped_pages": 1}          # finished before the kill
    # 13 pages not written (2 of them failed writes: counted once), every L3 hit lost (1 read came back short)
    down = {"storage_hit_pages": 0, "storage_write_skipped_pages": 13, "storage_write_failed_pages": 2,
            "storage_read_short_pages": 1}
    row = Row("master_restart", "mooncake-store", recovered=True)
    assert _account_l3_fault(row, healthy, [during, down]) == 12 + 4
    assert row.failed == 16 and row.reasons == {"L3 write not done": 12, "L3 hit lost: recomputed": 4}
    assert row.survived


def test_an_l3_fault_that_lost_nothing_tested_nothing():
    from scripts.fault_matrix import _account_l3_fault
    healthy = {"storage_hit_pages": 4}
    row = Row("master_restart", "mooncake-store", recovered=True)
    assert _account_l3_fault(row, healthy, [dict(healthy), dict(healthy)]) == 0
    assert row.failed == 0 and "tested nothing" in row.problems[0] and not row.survived
